#!/bin/bash
# `dlock run` honours --shared, --permits and --fair; --ttl reaches the store.
. "$(dirname "$0")/lib.sh" "$@"

# waiters NAME: how many waiters status reports for NAME.
waiters() { "$DLOCK" --json status "$1" 2>/dev/null | grep -o '"waiters":[0-9]*' | cut -d: -f2; }
# wait_waiters NAME N: until status shows N waiters (an observable state, not a guess).
wait_waiters() {
	for _ in $(seq 1 400); do
		[ "$(waiters "$1")" = "$2" ] && return 0
		sleep 0.05
	done
	return 1
}

# --shared: two readers hold the lock at the same time. Each signals it is
# in, then waits for the other: only concurrent holders can both finish.
mkfifo "$T/a" "$T/b"
"$DLOCK" run --shared --wait 20s rw -- sh -c "echo in >'$T/a'; read x <'$T/b'" &
r1=$!
"$DLOCK" run --shared --wait 20s rw -- sh -c "read x <'$T/a'; echo in >'$T/b'" &
r2=$!
wait $r1; rc1=$?
wait $r2; rc2=$?
check "two --shared runs held the lock together ($rc1 $rc2)" [ "$rc1" -eq 0 -a "$rc2" -eq 0 ]

# A writer is excluded while a reader holds it.
mkfifo "$T/in" "$T/out.fifo"
"$DLOCK" run --shared rw -- sh -c "echo in >'$T/in'; read x <'$T/out.fifo'" &
r=$!
read -r _ <"$T/in"
expect_rc 75 "exclusive run while shared is held" "$DLOCK" run --no-wait rw -- true
expect_rc 0 "another reader may join" "$DLOCK" run --shared --no-wait rw -- true
echo done >"$T/out.fifo"
wait $r

# --permits 2: two holders at once, a third is refused. (One fifo per
# holder: two readers of one fifo could both see the first writer's EOF.)
# Nor may a fifo be reused at once: the last writer may still have it open.
mkfifo "$T/go1" "$T/go2" "$T/in1" "$T/in2"
"$DLOCK" run --permits 2 sem -- sh -c "echo in >'$T/in1'; read x <'$T/go1'" &
p1=$!
read -r _ <"$T/in1"
"$DLOCK" run --permits 2 sem -- sh -c "echo in >'$T/in2'; read x <'$T/go2'" &
p2=$!
read -r _ <"$T/in2"
"$DLOCK" --json status sem >"$T/st0"
expect_rc 75 "third permit refused (status before: $(cat "$T/st0"))" "$DLOCK" run --permits 2 --no-wait sem -- true
"$DLOCK" --json status sem >"$T/st"
check "status shows 2 holders of the semaphore" [ "$(grep -o '"id":' "$T/st" | wc -l)" -eq 2 ]
check "status shows permits 2" grep -q '"permits":2' "$T/st"
echo done >"$T/go1"
echo done >"$T/go2"
wait $p1 $p2

# --fair: waiters run in the order they asked.
expect_rc 0 "hold" "$DLOCK" acquire --ttl 60s fair
H=$(cat "$T/out")
: >"$T/order"
for w in A B C D; do
	"$DLOCK" run --fair --wait 30s fair -- sh -c "echo $w >>'$T/order'" &
	n=$(( $(printf 'ABCD' | sed "s/$w.*//" | wc -c) + 1 ))
	wait_waiters fair "$n" || fail "waiter $w never showed in status"
done
expect_rc 0 "release to the queue" "$DLOCK" release fair "$H"
wait
check "fair waiters ran in request order: $(tr -d '\n' <"$T/order")" [ "$(tr -d '\n' <"$T/order")" = ABCD ]

# --ttl reaches the store.
"$DLOCK" run --ttl 7s ttl -- "$DLOCK" --json status ttl >"$T/st"
ttl=$(json_num ttl_left_ms "$T/st")
check "--ttl 7s: the lease is 7 s ($ttl ms left)" test "${ttl:-0}" -gt 5000 -a "${ttl:-0}" -le 7000
finish
