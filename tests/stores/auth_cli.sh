#!/usr/bin/env bash
# auth_cli.sh DLOCK KIND URI_FILE (etcd: -) — credentials through the dlock tool, against
# the store's real test server (the URI in URI_FILE is the fixture's, with its
# own password where the server has one).
#
# For each store with authentication:
#  - a wrong password (or an unknown user) makes `status`, `acquire` and
#    `run` exit 69, via --store and via DLOCK_STORE, with and without -v;
#    neither stdout nor stderr ever contains the password tried;
#  - with the right password, `status`, `-v status`, `--json status` and a
#    failing `acquire` never print it either;
#  - `dlock --store URI run NAME -- env`: the child's environment does not
#    contain the password; a DLOCK_STORE the caller set reaches the child
#    unchanged (it had it already; a nested dlock must work), and no message
#    shows it.
# KIND: redis, redlock, etcd, zookeeper, postgres, mysql. Redis and Redlock
# get an ACL user of this test (redis-cli ACL SETUSER on every master); etcd
# gets a member of its own (tests/servers/etcd.sh, URI_FILE ignored) with a
# root user and auth enabled by etcdctl; ZooKeeper uses digest credentials
# (a login is never refused: a wrong password meets our nodes' ACL instead).
. "$(dirname "$0")/../cli/lib.sh" "$1"
KIND=${2:?usage: auth_cli.sh DLOCK KIND URI_FILE}
if [ "$KIND" = etcd ]; then
	URI=etcd://set-below # a member of its own, started below
else
	URI=$(cat "${3:?usage: auth_cli.sh DLOCK KIND URI_FILE}")
fi
[ -n "$URI" ] || { echo "empty URI in $3" >&2; exit 1; }

SECRET="Wr0ngS3cretXq$RANDOM"   # the wrong password we try
NAME="auth-cli-$$"
rest=${URI#*://}                 # [user[:pass]@]hosts[/path][?query]
scheme=${URI%%://*}
case $rest in
*@*) userinfo=${rest%%@*}; hosts=${rest#*@} ;;
*) userinfo=; hosts=$rest ;;
esac
user=${userinfo%%:*}
goodpass=
[[ $userinfo == *:* ]] && goodpass=${userinfo#*:}

# no_secret DESC WORD FILE...: WORD appears in none of FILE.
no_secret() {
	local desc=$1 word=$2; shift 2
	if [ -n "$word" ] && grep -qF -- "$word" "$@"; then
		fail "$desc: output contains the password: $(grep -hF -- "$word" "$@" | head -3)"
	else
		ok
	fi
}

here=$(cd "$(dirname "$0")" && pwd)
hl=()
etcd_dir=
# Leave the shared fixture as we found it: drop our ACL user, stop our etcd.
auth_cleanup() {
	for hp in "${hl[@]}"; do
		redis-cli -h "${hp%:*}" -p "${hp##*:}" ACL DELUSER "$user" >/dev/null 2>&1
	done
	[ -n "$etcd_dir" ] && bash "$here/../servers/etcd.sh" stop "$etcd_dir" >/dev/null 2>&1
	cleanup
}
trap auth_cleanup EXIT
case $KIND in
redis | redlock)
	goodpass="R1ghtS3cret$RANDOM"
	user=dlockcli$$
	IFS=, read -ra hl <<<"${hosts%%[/?]*}"
	for hp in "${hl[@]}"; do
		redis-cli -h "${hp%:*}" -p "${hp##*:}" ACL SETUSER "$user" on ">$goodpass" '~*' '&*' +@all \
			>"$T/acl.out" 2>&1 && grep -q OK "$T/acl.out" ||
			{ echo "ACL SETUSER on $hp failed: $(cat "$T/acl.out")" >&2; exit 1; }
	done
	URI="$scheme://$user:$goodpass@$hosts"
	;;
etcd)
	etcd_dir=$T/etcd
	bash "$here/../servers/etcd.sh" start "$etcd_dir" >"$T/etcd.log" 2>&1 ||
		{ cat "$T/etcd.log" >&2; exit 1; }
	hosts=$(sed 's|^etcd://||' "$T/etcd/uri")
	goodpass="R1ghtS3cret$RANDOM"
	ETCDCTL_API=3 etcdctl --endpoints="http://$hosts" user add "root:$goodpass" >/dev/null &&
		ETCDCTL_API=3 etcdctl --endpoints="http://$hosts" auth enable >/dev/null 2>>"$T/etcd.log" ||
		{ echo "cannot enable auth on etcd" >&2; exit 1; }
	URI="etcd://root:$goodpass@$hosts"
	;;
esac

# The URI with the wrong password: the fixture's user (or one of ours).
case $KIND in
redis | redlock) bad="$scheme://$user:$SECRET@$hosts" ;;       # WRONGPASS
etcd) bad="etcd://root:$SECRET@$hosts" ;;
zookeeper)
	# A prefix of our own: the prefix node gets alice's digest ACL, which
	# would shut other clients of the shared fixture out of the default one
	# until ZooKeeper reaps the empty container (reported).
	hosts="${hosts%%\?*}?prefix=authcli-$$"
	bad="$scheme://alice:$SECRET@$hosts"
	;;
postgres | mysql) bad="$scheme://${user:-dlock}:$SECRET@$hosts" ;;
*) echo "auth_cli.sh: no authentication to test for $KIND" >&2; exit 1 ;;
esac

# ZooKeeper's digest scheme never refuses a login: a wrong password is only
# refused where our nodes' ACL says so. Hold NAME as alice (right password)
# so the wrong one meets the ACL.
holder=
if [ "$KIND" = zookeeper ]; then
	goodpass="R1ghtS3cret$RANDOM"
	good="$scheme://alice:$goodpass@$hosts"
	"$DLOCK" --store "$good" run "$NAME" -- sleep 60 >"$T/holder.out" 2>"$T/holder.err" &
	holder=$!
	for _ in $(seq 1 100); do
		"$DLOCK" --store "$good" --json status "$NAME" 2>/dev/null | grep -q '"id"' && break
		sleep 0.1
	done
	check "zookeeper: alice holds $NAME" \
		sh -c "'$DLOCK' --store '$good' --json status '$NAME' | grep -q '\"id\"'"
	URI=$good
fi

# --- a wrong password: exit 69, the password never echoed -------------------
# (ZooKeeper: reading is open to everyone, so status works: exit 0.)
st_rc=69
[ "$KIND" = zookeeper ] && st_rc=0
for verbose in "" -v; do
	# shellcheck disable=SC2086
	expect_rc $st_rc "$KIND: $verbose status with a wrong password" \
		"$DLOCK" $verbose --store "$bad" status "$NAME"
	no_secret "$KIND: $verbose status (wrong password)" "$SECRET" "$T/out" "$T/err"
	# shellcheck disable=SC2086
	expect_rc 69 "$KIND: $verbose acquire with a wrong password" \
		"$DLOCK" $verbose --store "$bad" acquire --no-wait "$NAME"
	no_secret "$KIND: $verbose acquire (wrong password)" "$SECRET" "$T/out" "$T/err"
	grep -q . "$T/err" && ok || fail "$KIND: no message for a wrong password"
	# shellcheck disable=SC2086
	expect_rc 69 "$KIND: $verbose run with a wrong password" \
		"$DLOCK" $verbose --store "$bad" run --no-wait "$NAME" -- echo "must-not-run"
	no_secret "$KIND: $verbose run (wrong password)" "$SECRET" "$T/out" "$T/err"
	grep -q must-not-run "$T/out" && fail "$KIND: run started the command without the lock" || ok
	# the same URI from the environment
	# shellcheck disable=SC2086
	expect_rc 69 "$KIND: $verbose DLOCK_STORE with a wrong password" \
		env DLOCK_STORE="$bad" "$DLOCK" $verbose acquire --no-wait "$NAME"
	no_secret "$KIND: $verbose DLOCK_STORE acquire (wrong password)" "$SECRET" "$T/out" "$T/err"
done
# The JSON output of a failure carries no password either.
expect_rc $st_rc "$KIND: --json status with a wrong password" "$DLOCK" --json --store "$bad" status "$NAME"
no_secret "$KIND: --json status (wrong password)" "$SECRET" "$T/out" "$T/err"

# --- the right password: nowhere in what dlock prints or hands the child ----
if [ -n "$goodpass" ]; then
	for args in "status" "-v status" "--json status" "-v status $NAME"; do
		# shellcheck disable=SC2086
		"$DLOCK" --store "$URI" $args >"$T/out" 2>"$T/err"
		no_secret "$KIND: $args (right password)" "$goodpass" "$T/out" "$T/err"
	done
	expect_rc 0 "$KIND: -v run -- env" "$DLOCK" -v --store "$URI" run --wait 30s "$NAME-env" -- env
	no_secret "$KIND: child environment (--store)" "$goodpass" "$T/out"
	no_secret "$KIND: -v run messages (--store)" "$goodpass" "$T/err"
	grep -q "^DLOCK_NAME=$NAME-env$" "$T/out" && ok || fail "$KIND: child saw no DLOCK_NAME"
	expect_rc 0 "$KIND: DLOCK_STORE run -- env" \
		env DLOCK_STORE="$URI" "$DLOCK" -v run --wait 30s "$NAME-env" -- env
	grep -qxF "DLOCK_STORE=$URI" "$T/out" && ok || fail "$KIND: the child's DLOCK_STORE is not the caller's"
	no_secret "$KIND: -v run messages (DLOCK_STORE)" "$goodpass" "$T/err"
	if [ "$KIND" = zookeeper ]; then
		# NAME is held by alice: a waiting run with the right password times
		# out (75) and prints nothing secret.
		expect_rc 75 "$KIND: run --wait while held" "$DLOCK" -v --store "$URI" run --wait 3s "$NAME" -- env
		no_secret "$KIND: -v run timeout messages" "$goodpass" "$T/out" "$T/err"
	fi
fi
if [ -n "$holder" ]; then
	kill -TERM "$holder" 2>/dev/null
	wait "$holder" 2>/dev/null
fi
finish
