#!/bin/bash
# A `dlock run` that waits for a lock while its store goes down (a private
# redis-server, killed: its loopback port is closed) says so on stderr at
# once — without -v — and keeps waiting; it says it once, not at every
# retry (a reminder follows every 30 s); when the store is back it says so,
# takes the lock and runs its command.
#   unreachable.sh DLOCK
. "$(dirname "$0")/lib.sh" "$@"
SERVERS=$(cd "$(dirname "$0")/../servers" && pwd)

command -v redis-server >/dev/null || { fail "redis-server is needed"; finish; }
trap 'bash "$SERVERS/redis.sh" stop "$T/redis" >/dev/null 2>&1; cleanup' EXIT
bash "$SERVERS/redis.sh" start "$T/redis" >"$T/redis.out" 2>&1 ||
	{ fail "redis-server did not start: $(cat "$T/redis.out")"; finish; }
DLOCK_STORE=$(cat "$T/redis/uri")
export DLOCK_STORE

expect_rc 0 "another client holds the lock" "$DLOCK" acquire --ttl 60s down
"$DLOCK" run down -- sh -c "echo ran >'$T/ran'" 2>"$T/run.err" &
run=$!
for _ in $(seq 1 400); do
	"$DLOCK" --json status down 2>/dev/null | grep -q '"waiters":[1-9]' && break
	sleep 0.025
done
check "the run waits" grep -q '"waiters":[1-9]' <("$DLOCK" --json status down 2>/dev/null)

bash "$SERVERS/redis.sh" kill "$T/redis"
t0=$(now_ms)
for _ in $(seq 1 600); do
	grep -q unreachable "$T/run.err" && break
	sleep 0.025
done
took=$(( $(now_ms) - t0 ))
check "it says the store is unreachable (stderr: $(cat "$T/run.err"))" \
	grep -q "the store is unreachable (.*); still trying to acquire lock 'down'" "$T/run.err"
check "within 10 s of the outage ($took ms)" [ "$took" -lt 10000 ]
echo "measured: store killed -> message in $took ms"
# An observation window, not a wait for an event: tries go on at least every
# second meanwhile, and none of them may repeat the message.
sleep 3
check "said once in 3 s of retries ($(grep -c unreachable "$T/run.err") lines)" \
	[ "$(grep -c unreachable "$T/run.err")" -eq 1 ]
check "still waiting" kill -0 "$run"

# Back on the same port (empty: no persistence, so the old hold is gone).
bash "$SERVERS/redis.sh" restart "$T/redis" >/dev/null 2>&1
wait "$run"
rc=$?
check "the run went on and ran its command (exit $rc)" [ "$rc" -eq 0 -a -s "$T/ran" ]
check "it says the store answers again" grep -q "the store answers again" "$T/run.err"

# -q: nothing but errors; the outage is not one.
expect_rc 0 "hold again" "$DLOCK" acquire --ttl 60s down
"$DLOCK" -q run down -- true 2>"$T/q.err" &
run=$!
for _ in $(seq 1 400); do
	"$DLOCK" --json status down 2>/dev/null | grep -q '"waiters":[1-9]' && break
	sleep 0.025
done
bash "$SERVERS/redis.sh" kill "$T/redis"
bash "$SERVERS/redis.sh" restart "$T/redis" >/dev/null 2>&1
wait "$run"
check "-q: silent" [ ! -s "$T/q.err" ]
finish
