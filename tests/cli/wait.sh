#!/bin/bash
# --no-wait on a held lock exits 75 at once; --wait 1s exits 75 after about a
# second; a lock freed during --wait is taken.
. "$(dirname "$0")/lib.sh" "$@"

expect_rc 0 "acquire" "$DLOCK" acquire --ttl 60s busy
H=$(cat "$T/out")

t0=$(now_ms)
expect_rc 75 "run --no-wait on a held lock" "$DLOCK" run --no-wait busy -- echo ran
t=$(( $(now_ms) - t0 ))
check "--no-wait returns at once (${t} ms)" [ "$t" -lt 1500 ]
check "--no-wait did not run the command" sh -c "! grep -q ran '$T/out'"
check "--no-wait says why" grep -q "held" "$T/err"

expect_rc 75 "acquire --no-wait on a held lock" "$DLOCK" acquire --no-wait busy

t0=$(now_ms)
expect_rc 75 "run --wait 1s on a held lock" "$DLOCK" run --wait 1s busy -- echo ran
t=$(( $(now_ms) - t0 ))
check "--wait 1s took about a second (${t} ms)" test "$t" -ge 950 -a "$t" -lt 3000
check "--wait 1s did not run the command" sh -c "! grep -q ran '$T/out'"

t0=$(now_ms)
expect_rc 75 "acquire --wait 500ms" "$DLOCK" acquire --wait 500ms busy
t=$(( $(now_ms) - t0 ))
check "acquire --wait 500ms took about 500 ms (${t} ms)" test "$t" -ge 450 -a "$t" -lt 2500

# A waiter gets the lock when it is released: release once the waiter is
# registered as a waiter (status shows it), not after a guessed sleep.
"$DLOCK" run --wait 30s busy -- echo got-it >"$T/waiter.out" 2>&1 &
wpid=$!
for _ in $(seq 1 300); do
	"$DLOCK" --json status busy >"$T/st" 2>/dev/null
	grep -q '"waiters":[1-9]' "$T/st" && break
	kill -0 $wpid 2>/dev/null || break
	sleep 0.05
done
check "status counted the waiter" grep -q '"waiters":[1-9]' "$T/st"
expect_rc 0 "release while a waiter waits" "$DLOCK" release busy "$H"
wait $wpid
check "the waiter ran after the release (exit $?)" grep -q got-it "$T/waiter.out"
finish
