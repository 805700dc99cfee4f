#!/bin/bash
# Secrets stay secret (issues 16.2-3, 21.1-2, 21.5):
#  - status never shows an owner token (a handle's secret), only a public
#    holder id; a handle forged from status output frees nothing;
#    `dlock break --holder ID` frees exactly that holder;
#  - the holder process of `acquire` has no password in its argv;
#  - extend/release refuse a process that took the holder's socket name;
#  - no output of any command shows a password (raw '@', %40, ?password=).
# Runs on the embedded store, and (CLI_TEST_REDIS=1) on a private
# redis-server with a password that the test starts and stops itself.
. "$(dirname "$0")/lib.sh" "$@"
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3

# alive PID: the process exists and is not a zombie.
alive() { local s; s=$(ps -o stat= -p "$1" 2>/dev/null) && [ -n "$s" ] && [ "${s#Z}" = "$s" ]; }
# no_secret WHAT SECRET FILE...: none of FILE contains SECRET.
no_secret() {
	local what=$1 sec=$2; shift 2
	if grep -qF -- "$sec" "$@"; then fail "$what shows a secret: $(grep -hF -- "$sec" "$@" | head -c 300)"; else ok; fi
}

# ---- 1. status shows public ids; forged handles; break ----------------------
# on_store LABEL: the status/forge/break checks on the current store ($DLOCK_STORE or embedded).
on_store() {
	local L=$1 H O id H1 H2 id1 id2 pfx
	pfx="sec-$L-$$"
	H=$("$DLOCK" acquire --ttl 60s "$pfx-a")
	O=${H##*.}                  # the owner token: "<client id>-<serial>"
	check "$L: acquire printed a dl1 handle ($H)" grep -q '^dl1\.' <<<"$H"
	"$DLOCK" status "$pfx-a" >"$T/st.txt" 2>&1
	"$DLOCK" --json status "$pfx-a" >"$T/st.json" 2>&1
	"$DLOCK" --json status >"$T/st-all.json" 2>&1
	no_secret "$L: status" "${O%-*}" "$T/st.txt" "$T/st.json" "$T/st-all.json"
	id=$(grep -o '"id":"[0-9a-f]*"' "$T/st.json" | head -1 | cut -d'"' -f4)
	check "$L: status --json shows a 16-hex holder id ($id)" grep -Eq '^[0-9a-f]{16}$' <<<"$id"
	check "$L: the table shows the same id" grep -q "$id" "$T/st.txt"
	check "$L: no \"owner\" field" sh -c "! grep -q '\"owner\"' '$T/st.json'"

	# What an attacker can build from status: the id in the owner's place,
	# bare, padded to the owner's shape, or with the serial.
	for forged in "dl1.x.1.1.60000.$id" "dl1.x.1.1.60000.$id$id-1" "dl1.x.1.1.60000.$id-1"; do
		"$DLOCK" release "$pfx-a" "$forged" >"$T/out" 2>"$T/err"
		rc=$?
		check "$L: a forged handle ($forged) does not release (exit $rc: 1 or 64)" \
			[ "$rc" -eq 1 -o "$rc" -eq 64 ]
	done
	expect_rc 75 "$L: still held after forged handles" "$DLOCK" acquire --no-wait "$pfx-a"

	# break --holder frees exactly that holder of a 2-permit semaphore.
	H1=$("$DLOCK" acquire --ttl 60s --permits 2 "$pfx-s")
	H2=$("$DLOCK" acquire --ttl 60s --permits 2 "$pfx-s")
	"$DLOCK" --json status "$pfx-s" >"$T/s.json"
	id1=$(grep -o '"id":"[0-9a-f]*"' "$T/s.json" | sed -n 1p | cut -d'"' -f4)
	id2=$(grep -o '"id":"[0-9a-f]*"' "$T/s.json" | sed -n 2p | cut -d'"' -f4)
	check "$L: two holders, two ids ($id1 $id2)" [ -n "$id1" -a -n "$id2" -a "$id1" != "$id2" ]
	expect_rc 1 "$L: break --holder of an id that holds nothing" \
		"$DLOCK" break --holder 0123456789abcdef "$pfx-s"
	expect_rc 64 "$L: break --holder with a malformed id" "$DLOCK" break --holder "${O%-*}" "$pfx-s"
	expect_rc 0 "$L: break --holder $id1" "$DLOCK" break --holder "$id1" "$pfx-s"
	check "$L: break says what it freed" grep -q "freed '$pfx-s' holder $id1" "$T/out"
	"$DLOCK" --json status "$pfx-s" >"$T/s2.json"
	check "$L: the broken holder is gone" sh -c "! grep -q '$id1' '$T/s2.json'"
	check "$L: the other holder stays" grep -q "\"id\":\"$id2\"" "$T/s2.json"
	# Which handle was id1? The one whose release now fails.
	r1=0; "$DLOCK" release "$pfx-s" "$H1" 2>/dev/null || r1=$?
	r2=0; "$DLOCK" release "$pfx-s" "$H2" 2>/dev/null || r2=$?
	check "$L: exactly one of the two handles was freed (release exits $r1, $r2)" \
		[ $((r1 + r2)) -eq 1 ]

	# break without --holder frees every holder and says so first.
	"$DLOCK" acquire --ttl 60s --shared "$pfx-r" >/dev/null
	"$DLOCK" acquire --ttl 60s --shared "$pfx-r" >/dev/null
	expect_rc 0 "$L: break frees every holder" "$DLOCK" --json break "$pfx-r"
	check "$L: break --json lists two" [ "$(grep -o '"id":' "$T/out" | wc -l)" -eq 2 ]
	check "$L: break announced them on stderr" [ "$(grep -c 'freeing' "$T/err")" -eq 2 ]
	expect_rc 0 "$L: free after break" "$DLOCK" acquire --no-wait "$pfx-r"
	expect_rc 1 "$L: break of a free lock frees nothing" "$DLOCK" break "$pfx-free"
	"$DLOCK" break "$pfx-a" >/dev/null 2>&1
	"$DLOCK" break "$pfx-r" >/dev/null 2>&1
	"$DLOCK" break "$pfx-s" >/dev/null 2>&1
}
on_store sqlite

# ---- 2./3. the holder process: argv, socket directory, impostors -------------
export XDG_RUNTIME_DIR="$T/xdg"
mkdir -m 700 "$XDG_RUNTIME_DIR"
SOCKDIR="$XDG_RUNTIME_DIR/dlock"

H=$(DLOCK_TEST_HOLDER=1 "$DLOCK" acquire --ttl 30s held)
check "holder handle ($H)" grep -q '^dlh2\.' <<<"$H"
hpid=$(cut -d. -f6 <<<"$H")
sockid=$(cut -d. -f7 <<<"$H")
check "the holder process ($hpid) is alive" alive "$hpid"
check "its socket is in the private directory" test -S "$SOCKDIR/h-$sockid"
check "the directory is ours and 0700" [ "$(stat -c '%a %u' "$SOCKDIR")" = "700 $(id -u)" ]
check "the holder's argv names no store" [ "$(tr '\0' ' ' </proc/"$hpid"/cmdline)" = "dlock --lock-holder-process " ]

# A process that takes the socket's name once the holder is gone (here: the
# same user after a crash) is refused before it hears the secret.
kill -KILL "$hpid"
for _ in $(seq 1 100); do alive "$hpid" || break; sleep 0.05; done
rm -f "$SOCKDIR/h-$sockid"
"$PY" - "$SOCKDIR/h-$sockid" "$T/heard" <<'EOF' &
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1]); s.listen(4)
open(sys.argv[2] + ".ready", "w").close()
with open(sys.argv[2], "ab") as heard:
    while True:
        c, _ = s.accept()
        c.settimeout(2)
        try:
            heard.write(c.recv(4096)); heard.flush()
        except OSError:
            pass
        # what a hostile holder would answer: success, with a terminal escape
        try:
            c.sendall(b"0 30000 1 released\x1b]0;pwned\x07\n")
        except OSError:
            pass
        c.close()
EOF
for _ in $(seq 1 600); do [ -e "$T/heard.ready" ] && break; sleep 0.05; done
: >>"$T/heard"
expect_rc 1 "release through an impostor's socket is refused" "$DLOCK" release held "$H"
check "  with a clear error" grep -q "not the holder of this handle" "$T/err"
check "  and no terminal escape in the output" sh -c "! grep -q \$'\\x1b' '$T/out' '$T/err'"
expect_rc 1 "extend through an impostor's socket is refused" "$DLOCK" extend held "$H"
check "the impostor heard nothing (no secret)" [ ! -s "$T/heard" ]
kill %1 2>/dev/null
wait 2>/dev/null
"$DLOCK" break held >/dev/null 2>&1

# A socket directory that is a symlink (someone else's trap) is never used.
rm -rf "$SOCKDIR"
mkdir -m 700 "$T/trap"
ln -s "$T/trap" "$SOCKDIR"
H=$(DLOCK_TEST_HOLDER=1 "$DLOCK" acquire --ttl 30s trapped)
check "acquire works beside a symlinked directory ($H)" grep -q '^dlh2\.' <<<"$H"
check "nothing was bound in the symlink's target" [ -z "$(ls -A "$T/trap")" ]
expect_rc 0 "release through the fallback directory" "$DLOCK" release trapped "$H"
rm -f "$SOCKDIR"

# A second local user cannot enter the directory (root runs CI: add one, then remove it).
if [ "$(id -u)" = 0 ] && command -v useradd >/dev/null && command -v runuser >/dev/null; then
	U="dlt$$"
	trap 'userdel "$U" 2>/dev/null; cleanup' EXIT
	if useradd -M -N -s /bin/sh "$U" 2>/dev/null; then
		H=$(DLOCK_TEST_HOLDER=1 "$DLOCK" acquire --ttl 30s other)
		sockid=$(cut -d. -f7 <<<"$H")
		chmod 711 "$T" "$XDG_RUNTIME_DIR" # let the other user reach our directory's door
		runuser -u "$U" -- "$PY" -c "
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect('$SOCKDIR/h-$sockid'); sys.exit(0)
except OSError as e:
    sys.exit(3)" 2>/dev/null
		rc=$?
		check "another user cannot connect to the holder's socket (exit $rc)" [ "$rc" -eq 3 ]
		runuser -u "$U" -- "$PY" -c "
import socket
s = socket.socket(socket.AF_UNIX)
s.bind('$SOCKDIR/h-fake')" 2>/dev/null
		check "another user cannot bind in our socket directory" [ ! -e "$SOCKDIR/h-fake" ]
		chmod 700 "$XDG_RUNTIME_DIR"
		expect_rc 0 "release (after the other user tried)" "$DLOCK" release other "$H"
		userdel "$U" 2>/dev/null
	else
		echo "note: useradd failed; second-user checks not run" >&2
	fi
fi

# ---- a store with a password: redis-server with requirepass ------------------
if [ "${CLI_TEST_REDIS:-0}" = 1 ]; then
	. "$(dirname "$0")/../servers/lib.sh"
	set +e
	PW='p@ss:w0rd'                       # a raw '@' and ':' in the password
	PW_ENC='p%40ss%3Aw0rd'
	mkdir -p "$T/redis"
	stop_redis() { [ -s "$T/redis/pid" ] && kill "$(cat "$T/redis/pid")" 2>/dev/null; }
	trap 'stop_redis; [ -n "${U:-}" ] && userdel "$U" 2>/dev/null; cleanup' EXIT
	up=0
	for attempt in 1 2 3 4 5; do # a free port can be taken before redis binds it
		port=$(free_port)
		rm -f "$T/redis/pid"; : >"$T/redis/log"
		redis-server --port "$port" --bind 127.0.0.1 --requirepass "$PW" --save '' --appendonly no \
			--dir "$T/redis" --daemonize yes --pidfile "$T/redis/pid" --logfile "$T/redis/log"
		for _ in $(seq 1 600); do
			if [ "$(redis-cli -p "$port" -a "$PW" --no-auth-warning ping 2>/dev/null)" = PONG ] &&
				[ -s "$T/redis/pid" ]; then
				up=1
				break
			fi
			grep -q "Address already in use" "$T/redis/log" 2>/dev/null && break
			sleep 0.05
		done
		[ "$up" = 1 ] && break
		stop_redis
	done
	check "a private redis-server with a password started (log: $(tail -c 300 "$T/redis/log" 2>/dev/null))" [ "$up" = 1 ]
	RAW="redis://:$PW@127.0.0.1:$port"
	ENC="redis://:$PW_ENC@127.0.0.1:$port"
	QRY="redis://127.0.0.1:$port?password=$PW_ENC"
	expect_rc 0 "redis: raw '@' password opens" "$DLOCK" --store "$RAW" status x
	expect_rc 0 "redis: %40 password opens" "$DLOCK" --store "$ENC" status x

	export DLOCK_STORE=$ENC
	on_store redis
	unset DLOCK_STORE

	# Every command's output, for each way of writing the password.
	: >"$T/all"
	for u in "$RAW" "$ENC" "$QRY" "redis://:${PW_ENC}x@127.0.0.1:$port" "redis://:$PW_ENC@127.0.0.1:1"; do
		for cmd in "status" "--json status" "-v status" "-v --json status n1" \
			"bench --duration 300ms --no-baseline" "--json bench --duration 300ms" \
			"check --duration 1s --clients 2" "--json check --duration 1s --clients 2" \
			"acquire --no-wait n2" "run --no-wait n3 -- true"; do
			# shellcheck disable=SC2086
			timeout 60 "$DLOCK" --store "$u" $cmd >>"$T/all" 2>&1
		done
		DLOCK_STORE=$u timeout 60 "$DLOCK" -v status >>"$T/all" 2>&1
	done
	check "the commands ran (bench printed a result)" grep -q "dlock bench: redis://" "$T/all"
	check "a wrong password gave an error" grep -qi "auth\|password" "$T/all"
	no_secret "a command" "$PW" "$T/all"
	no_secret "a command" "$PW_ENC" "$T/all"
	no_secret "a command" "ss:w0rd" "$T/all"
	no_secret "a command" "ss%3Aw0rd" "$T/all"
	no_secret "a command" "w0rd" "$T/all"

	# The holder process: no password in argv or environment.
	H=$(DLOCK_TEST_HOLDER=1 "$DLOCK" --store "$RAW" acquire --ttl 30s pw-held)
	hpid=$(cut -d. -f6 <<<"$H")
	check "redis: holder started ($H)" alive "$hpid"
	tr '\0' '\n' </proc/"$hpid"/cmdline >"$T/cmdline"
	tr '\0' '\n' </proc/"$hpid"/environ >"$T/environ"
	no_secret "the holder's /proc/PID/cmdline" "w0rd" "$T/cmdline"
	no_secret "the holder's /proc/PID/environ" "w0rd" "$T/environ"
	DLOCK_STORE=$ENC DLOCK_TEST_HOLDER=1 "$DLOCK" acquire --ttl 30s pw-held2 >"$T/h2"
	hpid2=$(cut -d. -f6 <"$T/h2")
	tr '\0' '\n' </proc/"$hpid2"/environ >"$T/environ2"
	no_secret "the holder's environment (DLOCK_STORE)" "w0rd" "$T/environ2"
	expect_rc 0 "redis: release the holder's lock" "$DLOCK" release pw-held "$H"
	expect_rc 0 "redis: release the second" "$DLOCK" release pw-held2 "$(cat "$T/h2")"

	# A nested dlock under `dlock run` uses the same store, password and all.
	export DLOCK_STORE=$RAW
	expect_rc 0 "nested dlock under run with a password in DLOCK_STORE" \
		"$DLOCK" run --no-wait outer -- "$DLOCK" run --no-wait inner -- true
	unset DLOCK_STORE
	stop_redis
else
	echo "note: CLI_TEST_REDIS unset: the password checks on redis were not run" >&2
fi

finish
