#!/bin/bash
# `dlock run` forwards SIGTERM/SIGINT to its command's process group, releases
# the lock after the command exits, and exits with the command's status
# (7 stays 7; 128+N for a command killed by signal N). Stdin, stdout and
# stderr pass through untouched.
. "$(dirname "$0")/lib.sh" "$@"

mkfifo "$T/ready"

# start_run SIGNAL_TRAP: a run whose command reports when it is ready.
start_run() {
	# A script's background jobs start with SIGINT ignored (and dlock leaves
	# ignored signals ignored, for itself and its command): reset it.
	env --default-signal=INT "$DLOCK" run sig -- sh -c "$1; echo go >'$T/ready'; while :; do sleep 0.1; done" \
		>"$T/run.out" 2>"$T/run.err" &
	run_pid=$!
	read -r _ <"$T/ready"
}

# 1. SIGTERM to dlock reaches the command, whose exit code 7 becomes ours.
start_run "trap 'echo got-TERM; exit 7' TERM"
kill -TERM "$run_pid"
wait "$run_pid"
rc=$?
check "exit code 7 passed through (got $rc)" [ "$rc" -eq 7 ]
check "the command saw SIGTERM" grep -q got-TERM "$T/run.out"
expect_rc 0 "lock released after the command exited" "$DLOCK" run --no-wait sig -- true

# 2. SIGINT is forwarded too; a command that dies of it gives 128+2.
start_run "trap - INT"
kill -INT "$run_pid"
wait "$run_pid"
rc=$?
check "died of SIGINT: exit 130 (got $rc)" [ "$rc" -eq 130 ]
expect_rc 0 "lock released after SIGINT" "$DLOCK" run --no-wait sig -- true

# 3. Exit status and signals of the command itself.
expect_rc 0 "exit 0" "$DLOCK" run sig -- true
expect_rc 1 "exit 1" "$DLOCK" run sig -- false
expect_rc 42 "exit 42" "$DLOCK" run sig -- sh -c 'exit 42'
expect_rc 137 "killed by SIGKILL: 137" "$DLOCK" run sig -- sh -c 'kill -KILL $$'
expect_rc 141 "SIGPIPE is not ignored in the command: 141" "$DLOCK" run sig -- sh -c 'kill -PIPE $$'
expect_rc 126 "not executable: 126" "$DLOCK" run sig -- "$T"

# 4. stdin/stdout/stderr are the command's own; the environment names the lock.
out=$(printf 'line one\nline two\n' | "$DLOCK" run sig -- cat)
check "stdin reaches the command and stdout comes back" [ "$out" = "$(printf 'line one\nline two')" ]
err=$("$DLOCK" run sig -- sh -c 'echo to-stderr >&2' 2>&1 >/dev/null)
check "stderr passes through" [ "$err" = "to-stderr" ]
env=$("$DLOCK" run sig -- sh -c 'echo "$DLOCK_NAME:$DLOCK_FENCE"')
check "DLOCK_NAME and DLOCK_FENCE set ($env)" sh -c "echo '$env' | grep -Eq '^sig:[1-9][0-9]*$'"
pg=$("$DLOCK" run sig -- sh -c 'ps -o pgid= -p $$')
check "the command leads its own process group" [ "$(echo $pg)" != "$(ps -o pgid= -p $$ | tr -d ' ')" ]
check "DLOCK_NAME from the caller is replaced" \
	[ "$(DLOCK_NAME=wrong "$DLOCK" run sig -- sh -c 'echo $DLOCK_NAME')" = sig ]

# On a terminal the command gets the foreground (like a shell job): reading
# the terminal must not stop it with SIGTTIN. script(1) provides the pty.
if command -v script >/dev/null; then
	out=$(printf 'typed\n' | timeout 20 script -qec "'$DLOCK' run sig -- sh -c 'read x; echo got:\$x'" /dev/null)
	check "the command reads the terminal ($out)" grep -q "got:typed" <<<"$out"
	timeout 20 script -qec "'$DLOCK' run sig -- sh -c 'exit 5'" /dev/null >/dev/null
	rc=$?
	check "exit status through a terminal (got $rc)" [ "$rc" -eq 5 ]
else
	fail "script(1) (bsdutils) is needed for the terminal test"
fi

# 5. A signal while still waiting for the lock ends dlock as the signal would;
#    the command never runs and nothing stays held.
expect_rc 0 "hold the lock" "$DLOCK" acquire --ttl 60s sig
H=$(cat "$T/out")
"$DLOCK" run sig -- echo should-not-run >"$T/run.out" 2>&1 &
run_pid=$!
for _ in $(seq 1 300); do
	"$DLOCK" --json status sig 2>/dev/null | grep -q '"waiters":[1-9]' && break
	sleep 0.05
done
kill -TERM "$run_pid"
wait "$run_pid"
rc=$?
check "waiting dlock died of SIGTERM (got $rc)" [ "$rc" -eq 143 ]
check "the command never ran" sh -c "! grep -q should-not-run '$T/run.out'"
expect_rc 0 "the first holder still holds and releases" "$DLOCK" release sig "$H"
finish
