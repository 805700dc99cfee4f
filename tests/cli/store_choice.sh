#!/usr/bin/env bash
# Which store: --store > DLOCK_STORE > config file > the local SQLite file
# (docs/cli.md, "Choosing the store"). An empty URI is an error (exit 64),
# never the local file; -v and status say which store and where it came from.
. "$(dirname "$0")/lib.sh" "$@"

unset DLOCK_CONFIG XDG_CONFIG_HOME
export HOME="$T/userhome"
mkdir -p "$HOME"
DEFAULT_DB="$DLOCK_HOME/dlock.db"
rm -rf "$DLOCK_HOME"/dlock.db*   # lib.sh made it: see that nothing makes it again
ETC_CONF=/etc/dlock/dlock.conf

# --- an empty URI: exit 64, a clear message, no store touched ---
expect_rc 64 "--store ''" "$DLOCK" --store '' acquire job
check "--store '' says the URI is empty" grep -q "empty store URI given with --store" "$T/err"
expect_rc 64 "--store= (inline)" "$DLOCK" acquire --store= job
expect_rc 64 "--store ' '" "$DLOCK" --store ' ' status
DLOCK_STORE='' expect_rc 64 "DLOCK_STORE=''" "$DLOCK" status
check "empty DLOCK_STORE says so" grep -q "DLOCK_STORE is set but empty" "$T/err"
# cron: a crontab line with DLOCK_STORE=$UNSET_VAR; the command must not run
DLOCK_STORE='' expect_rc 64 "run with an empty DLOCK_STORE" "$DLOCK" run job -- touch "$T/ran"
check "the command did not run" [ ! -e "$T/ran" ]
DLOCK_STORE='' expect_rc 64 "--json with an empty DLOCK_STORE" "$DLOCK" --json acquire job
check "--json error object" grep -Eq '^\{"error":\{"exit":64,"code":"DLOCK_EINVAL",.*DLOCK_STORE is set but empty' "$T/out"
check "no local file was made" [ ! -e "$DEFAULT_DB" ]
# an empty DLOCK_STORE does not matter when --store names one
DLOCK_STORE='' expect_rc 0 "--store wins over an empty DLOCK_STORE" "$DLOCK" --store "sqlite://$T/flag.db" status

# --- a config file names the store ---
mkdir -p "$T/conf"
cat >"$T/conf/a.conf" <<EOF
# the lock store of this cluster
   # indented comments and blank lines are fine

store = sqlite://$T/from-config.db
EOF
DLOCK_CONFIG="$T/conf/a.conf" expect_rc 0 "DLOCK_CONFIG names the store" "$DLOCK" -v acquire --ttl 30s cfg
check "the config file's store was used" [ -e "$T/from-config.db" ]
check "-v says the config file and line" \
	grep -q "store sqlite://$T/from-config.db (sqlite) from config file $T/conf/a.conf line 4, named by DLOCK_CONFIG" "$T/err"
check "not the local file" [ ! -e "$DEFAULT_DB" ]
DLOCK_CONFIG="$T/conf/a.conf" expect_rc 0 "status from the config" "$DLOCK" status cfg
check "status says where the store came from" \
	grep -q "^store sqlite://$T/from-config.db (from config file $T/conf/a.conf line 4, named by DLOCK_CONFIG)" "$T/out"
DLOCK_CONFIG="$T/conf/a.conf" expect_rc 0 "status --json" "$DLOCK" --json status cfg
check "status --json has store_from" \
	grep -q "\"store\":\"sqlite://$T/from-config.db\",\"store_from\":\"config file $T/conf/a.conf line 4, named by DLOCK_CONFIG\"" "$T/out"

# precedence: DLOCK_STORE over the config, --store over both
DLOCK_CONFIG="$T/conf/a.conf" DLOCK_STORE="sqlite://$T/from-env.db" expect_rc 0 "DLOCK_STORE over config" \
	"$DLOCK" -v status
check "-v says DLOCK_STORE" grep -q "store sqlite://$T/from-env.db (sqlite) from DLOCK_STORE" "$T/err"
DLOCK_CONFIG="$T/conf/a.conf" DLOCK_STORE="sqlite://$T/from-env.db" expect_rc 0 "--store over both" \
	"$DLOCK" -v --store "sqlite://$T/from-flag.db" status
check "-v says --store" grep -q "store sqlite://$T/from-flag.db (sqlite) from --store" "$T/err"

# the user's file ($XDG_CONFIG_HOME, else ~/.config), for shells and cron alike
mkdir -p "$T/xdg/dlock" "$HOME/.config/dlock"
echo "store = sqlite://$T/xdg.db" >"$T/xdg/dlock/dlock.conf"
echo "store=sqlite://$T/home.db" >"$HOME/.config/dlock/dlock.conf"
XDG_CONFIG_HOME="$T/xdg" expect_rc 0 "XDG_CONFIG_HOME's file" "$DLOCK" -v status
check "-v names the XDG file" grep -q "store sqlite://$T/xdg.db (sqlite) from config file $T/xdg/dlock/dlock.conf line 1" "$T/err"
expect_rc 0 "~/.config's file" "$DLOCK" -v status
check "-v names ~/.config's file" grep -q "store sqlite://$T/home.db (sqlite) from config file $HOME/.config/dlock/dlock.conf line 1" "$T/err"
# a user file that names no store leaves the choice to the next (the system's, else the default)
echo "# nothing here yet" >"$HOME/.config/dlock/dlock.conf"
if [ ! -e "$ETC_CONF" ]; then
	expect_rc 0 "a user file naming no store" "$DLOCK" -v status
	check "-v says the default" grep -q "store sqlite://$DEFAULT_DB (sqlite) from the default: no --store, DLOCK_STORE or config file names a store" "$T/err"
	# DLOCK_CONFIG=/dev/null: explicitly no config file
	DLOCK_CONFIG=/dev/null expect_rc 0 "DLOCK_CONFIG=/dev/null" "$DLOCK" -v status
	check "-v says the config names no store" grep -q "from the default: no --store or DLOCK_STORE, and config file /dev/null names no store" "$T/err"
else
	echo "note: $ETC_CONF exists on this machine: the fall-through to the default is not checked"
fi
rm -f "$HOME/.config/dlock/dlock.conf" "$DEFAULT_DB"*

# --- bad config files: exit 64 with the file and line, nothing opened ---
bad() { # bad DESC TEXT GREP
	printf '%s\n' "$2" >"$T/conf/bad.conf"
	DLOCK_CONFIG="$T/conf/bad.conf" expect_rc 64 "$1" "$DLOCK" acquire job
	check "$1: message" grep -q -- "$3" "$T/err"
}
bad "an empty store line" "store =" "bad.conf line 1: empty store URI"
bad "an unknown setting" $'# c\nstorage = redis://h:1' "bad.conf line 2: unknown setting"
bad "a line without =" "redis://h:1" "bad.conf line 1: expected 'store = URI'"
bad "the store named twice" $'store = sqlite:///tmp/a.db\nstore = sqlite:///tmp/b.db' "bad.conf line 2: the store is named twice (first on line 1)"
DLOCK_CONFIG='' expect_rc 64 "DLOCK_CONFIG=''" "$DLOCK" status
check "empty DLOCK_CONFIG says so" grep -q "DLOCK_CONFIG is set but empty" "$T/err"
DLOCK_CONFIG="$T/conf/missing.conf" expect_rc 64 "a missing DLOCK_CONFIG file" "$DLOCK" status
check "missing file: message" grep -q "cannot read the config file $T/conf/missing.conf (DLOCK_CONFIG)" "$T/err"
# an unreadable user file is an error, not a fall-through to the default
mkdir -p "$HOME/.config/dlock"
echo "store = sqlite://$T/x.db" >"$HOME/.config/dlock/dlock.conf"
chmod 000 "$HOME/.config/dlock/dlock.conf"
if ! cat "$HOME/.config/dlock/dlock.conf" >/dev/null 2>&1; then
	expect_rc 64 "an unreadable user config file" "$DLOCK" status
	check "unreadable: message" grep -q "cannot read the config file $HOME/.config/dlock/dlock.conf" "$T/err"
fi
rm -f "$HOME/.config/dlock/dlock.conf"
check "no local file was made by any of these" [ ! -e "$DEFAULT_DB" ]

# --- a password in the config's URI never shows (unreachable store: exit 69) ---
echo "store = redis://:S3kr1tPw@127.0.0.1:1" >"$T/conf/pw.conf"
DLOCK_CONFIG="$T/conf/pw.conf" expect_rc 69 "unreachable store from the config" "$DLOCK" -v status
check "says the store came from the config file" grep -q "from config file $T/conf/pw.conf line 1" "$T/err"
check "the password is not shown" sh -c "! grep -q S3kr1tPw '$T/err' '$T/out'"

finish
