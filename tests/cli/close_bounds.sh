#!/bin/bash
# The CLI keeps its bounds when the store stops answering, closing the store
# included (issue 31, row 6), on a private redis-server:
#  - `run --wait 3s` with the server SIGSTOPped mid-wait ends within
#    3 s + max(50 ms, 5 %);
#  - a try-once whose request goes unanswered (the fault proxy drops the
#    replies of that connection) ends within the URI's timeout= (a guard:
#    redis answers the undo on a fresh connection, so this held before too);
#  - `run` whose lock is lost (server stopped) exits 76 within 1 s of its
#    command's death.
# Each bound adds the scheduling delay measured in this run: what a whole
# `dlock run --no-wait NAME -- true` takes on the live store.
#   close_bounds.sh DLOCK FAULTPROXY
. "$(dirname "$0")/lib.sh" "$@"
PROXY=${2:?usage: close_bounds.sh DLOCK FAULTPROXY}
SERVERS=$(cd "$(dirname "$0")/../servers" && pwd)

command -v redis-server >/dev/null || { fail "redis-server is needed"; finish; }
trap 'bash "$SERVERS/redis.sh" resume "$T/redis" >/dev/null 2>&1;
	bash "$SERVERS/redis.sh" stop "$T/redis" >/dev/null 2>&1; cleanup' EXIT
bash "$SERVERS/redis.sh" start "$T/redis" >"$T/redis.out" 2>&1 ||
	{ fail "redis-server did not start: $(cat "$T/redis.out")"; finish; }
URI=$(cat "$T/redis/uri")
export DLOCK_STORE=$URI

# The fixed cost of a `dlock run` on the live store (lib.sh), measured again
# after each timed case.
measure_sched

# 1. --wait 3s, the server stopped mid-wait.
expect_rc 0 "another client holds the lock" "$DLOCK" acquire --ttl 60s w
t0=$(now_ms)
"$DLOCK" run --wait 3s w -- true 2>"$T/w.err" &
run=$!
for _ in $(seq 1 400); do
	"$DLOCK" --json status w 2>/dev/null | grep -q '"waiters":[1-9]' && break
	sleep 0.025
done
check "the run waits" grep -q '"waiters":[1-9]' <("$DLOCK" --json status w 2>/dev/null)
bash "$SERVERS/redis.sh" pause "$T/redis"
wait "$run"
rc=$?
took=$(( $(now_ms) - t0 ))
bash "$SERVERS/redis.sh" resume "$T/redis"
measure_sched
check "--wait 3s with the server stopped: not acquired (exit $rc; $(head -c 300 "$T/w.err"))" \
	[ "$rc" -eq 75 -o "$rc" -eq 69 ]
check "--wait 3s with the server stopped ended in $took ms (bound 3150 + $sched)" \
	[ "$took" -le $((3150 + sched)) ]
echo "measured: run --wait 3s, server stopped mid-wait: $took ms"

# 2. try-once, its request unanswered: within timeout=500ms.
"$PROXY" "$T/ctl" "${URI#redis://}" >"$T/ports" 2>"$T/proxy.err" &
for _ in $(seq 1 100); do grep -q ready "$T/ports" 2>/dev/null && break; sleep 0.05; done
check "the proxy started" grep -q ready "$T/ports"
port=$(head -1 "$T/ports")
ctl() { python3 -c 'import socket,sys
s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall((sys.argv[2]+"\n").encode())
print(s.makefile().readline().strip())' "$T/ctl" "$1"; }
check "dropmatch set" [ "$(ctl "dropmatch unanswered-try" | cut -c1-2)" = ok ]
t0=$(now_ms)
"$DLOCK" --store "redis://127.0.0.1:$port?timeout=500ms" run --no-wait unanswered-try -- true 2>"$T/t.err"
rc=$?
took=$(( $(now_ms) - t0 ))
measure_sched
check "try-once unanswered: exit 69 (got $rc; $(head -c 300 "$T/t.err"))" [ "$rc" -eq 69 ]
check "try-once unanswered ended in $took ms (bound 500 + 50 + $sched)" [ "$took" -le $((550 + sched)) ]
echo "measured: run --no-wait, request unanswered, timeout=500ms: $took ms"
ctl quit >/dev/null

# 3. The lock lost (server stopped while the command runs): exit 76 within
# 1 s of the command's death. The command notes when it dies.
cat >"$T/cmd.sh" <<EOF
trap 'date +%s%3N >"$T/died"; exit 143' TERM
echo up >"$T/up"
while :; do sleep 0.05; done
EOF
"$DLOCK" run --ttl 1s lostw -- bash "$T/cmd.sh" 2>"$T/l.err" &
run=$!
for _ in $(seq 1 400); do [ -s "$T/up" ] && break; sleep 0.025; done
check "the command runs" [ -s "$T/up" ]
bash "$SERVERS/redis.sh" pause "$T/redis"
wait "$run"
rc=$?
end=$(now_ms)
bash "$SERVERS/redis.sh" resume "$T/redis"
measure_sched
check "lost: exit 76 (got $rc; $(head -c 300 "$T/l.err"))" [ "$rc" -eq 76 ]
check "the command was told (SIGTERM)" [ -s "$T/died" ]
if [ -s "$T/died" ]; then
	after=$(( end - $(cat "$T/died") ))
	check "exit 76 came $after ms after the command's death (bound 1000 + $sched)" \
		[ "$after" -le $((1000 + sched)) ]
	echo "measured: command death -> exit 76: $after ms"
fi
finish
