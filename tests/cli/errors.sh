#!/usr/bin/env bash
# Error texts (issue 16 item 9): clear, not doubled or cut, no pointers or
# source paths, no "timed out" for a refused connection; with --json, an
# error is one JSON object on stdout; a SQLite path in a missing directory
# is refused without creating anything.
#   errors.sh DLOCK
set -u
dlock=${1:?dlock}
work=$(mktemp -d /tmp/dlock-errors-XXXXXX)
trap 'rm -rf "$work"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
db="sqlite://$work/e.db"

"$dlock" status --store "$db?ttl=abc" x 2>"$work/e" && fail "ttl=abc accepted"
n=$(grep -o 'option ttl' "$work/e" | wc -l)
{ [ "$n" = 1 ] && grep -q "bad duration 'abc': expected a number" "$work/e"; } ||
	fail "ttl=abc: $(cat "$work/e")"
"$dlock" status --store "$db?ttl=" x 2>"$work/e" && fail "ttl= accepted"
grep -q 'option ttl: empty duration' "$work/e" || fail "ttl=: $(cat "$work/e")"

"$dlock" status --store "sqlite://$work/missing/dir/x.db" x 2>"$work/e"
rc=$?
[ $rc = 64 ] || fail "missing directory: exit $rc, want 64"
grep -q "directory $work/missing/dir does not exist" "$work/e" || fail "missing directory: $(cat "$work/e")"
[ -e "$work/missing" ] && fail "status created $work/missing"

out=$("$dlock" --json status --store "$db?ttl=abc" x 2>/dev/null)
rc=$?
python3 - "$out" "$rc" <<'PY' || fail "--json error: $out"
import json, sys
o = json.loads(sys.argv[1])["error"]
assert o["exit"] == int(sys.argv[2]) == 64, o
assert o["code"] == "DLOCK_EINVAL" and o["command"] == "status", o
assert "bad duration 'abc'" in o["message"], o
PY
out=$("$dlock" --json run --bogus x -- true 2>/dev/null)
python3 -c 'import json,sys; o=json.loads(sys.argv[1])["error"]; assert o["exit"]==64 and "--bogus" in o["message"]' "$out" ||
	fail "--json usage error: $out"
out=$("$dlock" --json run --store "$db" x -- sh -c 'exit 3' 2>/dev/null)
rc=$?
{ [ $rc = 3 ] && [ -z "$out" ]; } || fail "a command's own exit status is not a dlock error: exit $rc, '$out'"

"$dlock" status --store 'memcached://127.0.0.1:1?connect_timeout=500ms' x 2>"$work/e"
grep -qE '0x[0-9a-f]|\.cc:|\.c:[0-9]| -> ' "$work/e" && fail "memcached: a pointer or source position: $(cat "$work/e")"
grep -q 'memcached connect on 127.0.0.1:1' "$work/e" || fail "memcached: $(cat "$work/e")"
"$dlock" status --store 'redis://127.0.0.1:1?connect_timeout=500ms' x 2>"$work/e"
grep -q 'timed out' "$work/e" && fail "redis: a refused connection said timed out: $(cat "$work/e")"
grep -q 'Connection refused' "$work/e" || fail "redis: $(cat "$work/e")"

# a Redis listener that never answers: "timed out", by connect_timeout, not errno text
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
python3 -c 'import socket,sys,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1",int(sys.argv[1]))); s.listen(8); time.sleep(30)' "$port" &
lp=$!
for ((i = 0; i < 100; i++)); do python3 -c 'import socket,sys; socket.create_connection(("127.0.0.1",int(sys.argv[1])),0.2)' "$port" 2>/dev/null && break; sleep 0.05; done
t0=$(date +%s%N)
"$dlock" status --store "redis://127.0.0.1:$port?connect_timeout=1s" x 2>"$work/e"
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
kill $lp 2>/dev/null
{ grep -q 'timed out' "$work/e" && ! grep -q 'Resource temporarily unavailable' "$work/e" && [ $ms -ge 900 ] && [ $ms -lt 5000 ]; } ||
	fail "silent redis listener: after $ms ms: $(cat "$work/e")"

# A conflict (exit 75) names the holder; with --json it is one error object
# with the holders (issue 33 rows 1 and 4); the wait is the one asked for.
"$dlock" --store "$db" acquire --ttl 60s held >/dev/null || fail "acquire held"
out=$("$dlock" --json --store "$db" acquire --no-wait held 2>"$work/e")
rc=$?
python3 - "$out" "$rc" "$$" <<'PY' || fail "--json conflict: exit $rc: '$out'"
import json, sys
o = json.loads(sys.argv[1])["error"]
assert int(sys.argv[2]) == 75 and o["exit"] == 75 and o["code"] == "DLOCK_ELOCKED", o
assert o["name"] == "held" and len(o["holders"]) == 1, o
h = o["holders"][0]
assert h["mode"] == "exclusive" and h["fence"] > 0 and 0 < h["ttl_left_ms"] <= 60000 and h["pid"] > 0, h
assert "held by %s:%d (fence %d" % (h["host"], h["pid"], h["fence"]) in o["message"], o
PY
grep -q "lock 'held' is held by .*:[0-9]* (fence [0-9]*, .* left) (--no-wait)" "$work/e" || fail "conflict text: $(cat "$work/e")"
out=$("$dlock" --json --store "$db" run --wait 300ms held -- true 2>"$work/e")
rc=$?
python3 -c 'import json,sys; o=json.loads(sys.argv[1])["error"]; assert o["exit"]==75 and o["code"]=="DLOCK_ETIMEOUT" and o["name"]=="held", o' "$out" ||
	fail "--json run conflict: exit $rc: '$out'"
grep -q "(not acquired within 300ms)" "$work/e" || fail "the wait asked for: $(cat "$work/e")"

# near misses: a command or a flock/timeout habit gets "did you mean"
"$dlock" sttaus 2>"$work/e"
rc=$?
{ [ $rc = 64 ] && grep -q "unknown command 'sttaus' (did you mean 'status'?)" "$work/e"; } || fail "sttaus: exit $rc: $(cat "$work/e")"
"$dlock" --store "$db" acquire -n held 2>"$work/e"
grep -q "unknown option '-n' (did you mean --no-wait?)" "$work/e" || fail "-n: $(cat "$work/e")"
"$dlock" --store "$db" run --timeout 3 held -- true 2>"$work/e"
grep -q "unknown option '--timeout' (did you mean --wait?)" "$work/e" || fail "--timeout: $(cat "$work/e")"
"$dlock" --store "$db" run --no-wiat held -- true 2>"$work/e"
grep -q "(did you mean --no-wait?)" "$work/e" || fail "--no-wiat: $(cat "$work/e")"
out=$("$dlock" --json relase x 2>/dev/null)
python3 -c 'import json,sys; o=json.loads(sys.argv[1])["error"]; assert o["exit"]==64 and "did you mean" in o["message"], o' "$out" ||
	fail "--json unknown command: '$out'"

# dlock check --report to a path it cannot write fails before the run (30 s)
t0=$(date +%s)
"$dlock" check --store "$db" --duration 30s --report "$work/no/such/dir/r.html" 2>"$work/e"
rc=$?
{ [ $rc = 64 ] && [ $(($(date +%s) - t0)) -lt 10 ] && grep -q 'cannot write it' "$work/e"; } ||
	fail "check --report to a missing directory: exit $rc after $(($(date +%s) - t0)) s: $(cat "$work/e")"

# An unknown URI option is a usage error (64) before any connection (port 1
# would answer "unavailable", 69), naming the option and the scheme's own
# (issue 33 row 4: ?password= on Redis was answered NOAUTH after connecting).
for u in "redis://127.0.0.1:1?password=x:redis:release" "redis+sentinel://127.0.0.1:1/m?bogus=1:redis+sentinel:wait_replicas" \
	"redis+cluster://127.0.0.1:1?bogus=1:redis+cluster:remap" "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?bogus=1:redlock:drift" \
	"etcd://127.0.0.1:1?recipes=x:etcd:recipe" "zk://127.0.0.1:1?bogus=1:zk:session_timeout" \
	"postgres://u:p@127.0.0.1:1/db?sslmod=require:postgres:sslmode" "mysql://u:p@127.0.0.1:1/db?tls=1:mysql:ssl_ca" \
	"memcached://127.0.0.1:1?bogus=1:memcached:connect_timeout" "sqlite://$work/o.db?bogus=1:sqlite:busy_timeout"; do
	want=${u##*:} rest=${u%:*} scheme=${rest##*:} uri=${rest%:*}
	opt=$(sed 's/.*?\([a-z_]*\)=.*/\1/' <<<"$uri")
	"$dlock" --store "$uri" status x 2>"$work/e"
	rc=$?
	{ [ $rc = 64 ] && grep -qF "unknown option '$opt' ($scheme: URIs take " "$work/e" && grep -q "take [a-z_, ]*\b$want\b" "$work/e"; } ||
		fail "unknown option of $scheme: exit $rc: $(cat "$work/e")"
done
# a name that does not resolve did not time out; etcd's errors say etcd
"$dlock" --store "redis://nonexistent.invalid:6379?connect_timeout=2s" status x 2>"$work/e"
{ grep -q 'cannot resolve nonexistent.invalid' "$work/e" && ! grep -q 'timed out' "$work/e"; } ||
	fail "an unknown host: $(cat "$work/e")"
"$dlock" --store "etcd://127.0.0.1:1?connect_timeout=500ms" status x 2>"$work/e"
grep -q 'etcd http://127.0.0.1:1/' "$work/e" || fail "etcd unreachable: $(cat "$work/e")"

[ $fails = 0 ] && echo "cli.errors: all checks passed" || echo "cli.errors: $fails check(s) FAILED"
[ $fails = 0 ]
