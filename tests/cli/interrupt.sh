#!/bin/bash
# ^C stops a shell loop around `dlock run` as it stops one around flock:
# dlock forwards SIGINT to its command and, once the command has died of it
# and the lock is released, dies of SIGINT itself, so the shell sees a death
# by signal (not "exit 130") and ends its loop. A SIGINT that was ignored
# when dlock started (a script's background job) stays ignored while dlock
# waits for the lock. The hold form (`dlock run --hold NAME`) dies of the signal
# that ended it, after releasing the lock.
. "$(dirname "$0")/lib.sh" "$@"

# wait_for FILE: until FILE is non-empty (bounded: 10 s).
wait_for() { for _ in $(seq 1 400); do [ -s "$1" ] && return 0; sleep 0.025; done; return 1; }

# 1. A loop in its own process group; SIGINT to the group, as a terminal's ^C.
#    A loop that goes on writes the next command's pid: that is a failure too.
cat >"$T/loop.sh" <<EOF
while :; do
	"$DLOCK" run loop -- sh -c 'echo \$\$ >"$T/cmd.pid.tmp"; mv "$T/cmd.pid.tmp" "$T/cmd.pid"; exec sleep 30'
	echo "dlock exited \$?" >>"$T/loop.log"
done
EOF
# Background jobs of this script have SIGINT ignored: give the loop the default.
setsid env --default-signal=INT bash "$T/loop.sh" &
loop=$!
check "the first command started" wait_for "$T/cmd.pid"
first=$(cat "$T/cmd.pid")
kill -INT -- "-$loop"
ended=no
for _ in $(seq 1 400); do
	kill -0 "$loop" 2>/dev/null || { ended=yes; break; }
	[ "$(cat "$T/cmd.pid" 2>/dev/null)" != "$first" ] && break # the loop went on
	sleep 0.025
done
check "SIGINT to the group ended the loop (log: $(cat "$T/loop.log" 2>/dev/null))" [ "$ended" = yes ]
check "dlock never returned an exit status to the loop" [ ! -s "$T/loop.log" ]
kill -KILL -- "-$loop" 2>/dev/null
wait "$loop" 2>/dev/null
expect_rc 0 "the interrupted run released the lock" "$DLOCK" run --no-wait loop -- true

# 2. A command that catches SIGINT and exits by itself: its status is dlock's.
rm -f "$T/cmd.pid"
env --default-signal=INT "$DLOCK" run loop -- sh -c \
	"trap 'exit 3' INT; echo \$\$ >'$T/cmd.pid'; while :; do sleep 0.05; done" 2>"$T/run.err" &
run=$!
check "the trapping command started" wait_for "$T/cmd.pid"
kill -INT "$run"
wait "$run"
rc=$?
check "a command that handled SIGINT passes its exit 3 on (got $rc)" [ "$rc" -eq 3 ]

# 3. SIGINT ignored at start stays ignored while waiting: dlock outlives it
#    and runs its command once the lock is free.
expect_rc 0 "hold the lock" "$DLOCK" acquire --ttl 60s loop
H=$(cat "$T/out")
"$DLOCK" run loop -- sh -c "echo ran >'$T/bg.out'" 2>"$T/bg.err" & # SIGINT ignored: a script's job
bg=$!
for _ in $(seq 1 400); do
	"$DLOCK" --json status loop 2>/dev/null | grep -q '"waiters":[1-9]' && break
	sleep 0.025
done
kill -INT "$bg"
# It must still be there, waiting: the status still counts it after SIGINT
# was delivered (a dead waiter drops out of the count).
"$DLOCK" run --no-wait loop2 -- true # a full round trip after the kill
check "the waiting dlock ignored SIGINT" kill -0 "$bg"
expect_rc 0 "release the lock" "$DLOCK" release loop "$H"
wait "$bg"
rc=$?
check "the waiter then ran its command (exit $rc: $(cat "$T/bg.err"))" grep -q ran "$T/bg.out"

# 4. The hold form: prints the fence, holds until SIGTERM, releases, and dies
#    of SIGTERM (bash reports "Terminated" only for a death by signal).
: >"$T/hold.out"
bash -c "'$DLOCK' run --hold hold >'$T/hold.out'; echo \"status \$?\"" >"$T/bash.out" 2>"$T/bash.err" &
sh_pid=$!
check "the hold form printed the fence" wait_for "$T/hold.out"
check "the fence is a number ($(cat "$T/hold.out"))" grep -Eqx '[1-9][0-9]*' "$T/hold.out"
expect_rc 75 "the lock is held while dlock waits" "$DLOCK" run --no-wait hold -- true
hold_pid=$(pgrep -P "$sh_pid" | head -1)
check "found the holding dlock" [ -n "$hold_pid" ]
kill -TERM "$hold_pid"
wait "$sh_pid"
check "dlock died of SIGTERM (bash: $(cat "$T/bash.err" "$T/bash.out"))" grep -q Terminated "$T/bash.err"
check "with status 143" grep -qx "status 143" "$T/bash.out"
expect_rc 0 "released on SIGTERM" "$DLOCK" run --no-wait hold -- true
finish
