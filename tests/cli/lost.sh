#!/bin/bash
# A `dlock run` whose lease runs out while it is stopped (SIGSTOP, short --ttl
# on the embedded store) loses the lock to another client. Its command does
# not outlive the lease even though dlock itself is stopped: a dead man's
# switch SIGTERMs the command's process group when the lease is at risk and
# SIGKILLs it before the lease ends if it ignores SIGTERM (outlive.sh checks
# that no second holder's command ever starts before the group is gone). When dlock continues it says the
# lock was lost and when (the deadline, not the time it woke up) and exits 76.
. "$(dirname "$0")/lib.sh" "$@"

# running PID: the process exists and is not a zombie (dlock, stopped, cannot reap it).
running() { [ -e "/proc/$1/stat" ] && ! grep -q '^[0-9]* (.*) Z ' "/proc/$1/stat" 2>/dev/null; }

# lose CHILD_SCRIPT KILL_AFTER: start a run, steal its lock, report via globals.
lose() {
	local script=$1 kill_after=$2
	rm -f "$T/ready" "$T/child.pid"
	mkfifo "$T/ready"
	"$DLOCK" run --ttl 1s --kill-after "$kill_after" victim -- \
		sh -c "echo \$\$ >'$T/child.pid'; $script" 2>"$T/run.err" &
	run_pid=$!
	read -r _ <"$T/ready"      # the command runs and holds the lock
	child=$(cat "$T/child.pid")
	kill -STOP "$run_pid"      # no renewals from here on
	# Another client takes the lock as soon as the 1 s lease has run out.
	t0=$(now_ms)
	"$DLOCK" acquire --ttl 60s --wait 20s victim >"$T/thief" 2>"$T/thief.err"
	thief_rc=$?
	stolen_ms=$(( $(now_ms) - t0 ))
	# dlock is still stopped: the command must go by itself (the switch).
	gone_while_stopped=no
	t1=$(now_ms)
	for _ in $(seq 1 $(( ${kill_after%s} * 50 + 150 ))); do
		running "$child" || { gone_while_stopped=yes; break; }
		sleep 0.02
	done
	gone_ms=$(( $(now_ms) - t1 ))
	t0=$(now_ms)
	kill -CONT "$run_pid"
	wait "$run_pid"
	run_rc=$?
	exit_ms=$(( $(now_ms) - t0 ))
}

# 1. A command that ignores SIGTERM (so do its children): SIGKILL after 1 s.
lose "trap '' TERM; echo go >'$T/ready'; while :; do sleep 0.1; done" 1s
check "the thief got the lock (exit $thief_rc: $(cat "$T/thief.err"))" [ "$thief_rc" -eq 0 ]
check "the lease ran out within a few seconds ($stolen_ms ms)" [ "$stolen_ms" -lt 5000 ]
check "dlock run exited 76 (got $run_rc)" [ "$run_rc" -eq 76 ]
check "the TERM-ignoring command is gone" sh -c "! kill -0 $child 2>/dev/null"
check "it went while dlock was still stopped" [ "$gone_while_stopped" = yes ]
check "no process of its group is left" sh -c "! pgrep -g $child >/dev/null"
check "message says the lock was lost, and when" \
	grep -Eq "lock 'victim' was LOST at [0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z" "$T/run.err"
check "message says SIGKILL was sent" grep -q "SIGKILL" "$T/run.err"
check "message says why: the lease ran out" grep -q "LOST at [^ ]*: its lease ran out: no renewal was confirmed" "$T/run.err"
# The thief still holds the lock: the loser did not release it on the way out.
"$DLOCK" --json status victim >"$T/st"
check "the lock is held by the thief" \
	grep -q "\"fence\":$(json_num fence "$T/st")" "$T/st"
check "the thief's hold is intact" sh -c "'$DLOCK' release victim '$(cat "$T/thief")'"

# 2. A command that obeys SIGTERM goes at once, long before --kill-after.
lose "echo go >'$T/ready'; exec sleep 600" 30s
check "thief 2 got the lock" [ "$thief_rc" -eq 0 ]
check "dlock run exited 76 (got $run_rc)" [ "$run_rc" -eq 76 ]
check "the command is gone" sh -c "! kill -0 $child 2>/dev/null"
check "it went while dlock was still stopped" [ "$gone_while_stopped" = yes ]
check "no SIGKILL needed: gone ${gone_ms} ms after the thief's grant" test "$gone_ms" -lt 10000
check "no SIGKILL message" sh -c "! grep -q 'SIGKILL$' '$T/run.err'"
"$DLOCK" release victim "$(cat "$T/thief")"

# 3. A hold broken by another client (dlock break) is lost at dlock's next
# renewal, and the message says the store no longer has it, not that the
# lease ran out (issue 33 row 4).
rm -f "$T/ready"
mkfifo "$T/ready"
"$DLOCK" run --ttl 3s broken -- sh -c "echo go >'$T/ready'; exec sleep 600" 2>"$T/run3.err" &
run_pid=$!
read -r _ <"$T/ready"
expect_rc 0 "break the running hold" "$DLOCK" break broken
timeout 30 tail --pid="$run_pid" -f /dev/null || kill -9 "$run_pid" 2>/dev/null # never hang the suite
wait "$run_pid"
run_rc=$?
check "broken: dlock run exited 76 (got $run_rc)" [ "$run_rc" -eq 76 ]
check "broken: the message says the store no longer has the hold ($(cat "$T/run3.err"))" \
	grep -q "lock 'broken' was LOST at [^ ]*: the store no longer has the hold" "$T/run3.err"
check "broken: it does not blame the lease" sh -c "! grep -q 'lease ran out' '$T/run3.err'"
finish
