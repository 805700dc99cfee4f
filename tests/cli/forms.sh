#!/bin/bash
# The forms of `dlock run` that flock users type: COMMAND without `--`,
# -c 'command string' (/bin/sh -c), -E/--conflict-exit-code for "not
# acquired", a NAME starting with '-' after `--`, and the hold form
# (`--hold`, no COMMAND). A missing COMMAND without `--hold` is a usage
# error: `dlock run job "$@"` with an empty "$@" must not hold job forever.
. "$(dirname "$0")/lib.sh" "$@"

# Optional `--`: the first word after NAME that is not an option is COMMAND;
# what follows it is COMMAND's, options included.
expect_rc 0 "NAME COMMAND without --" "$DLOCK" run f echo plain
check "the command ran" grep -qx plain "$T/out"
expect_rc 0 "options before and after NAME" "$DLOCK" run --ttl 5s f --wait 5s echo after
check "options after NAME are dlock's" grep -qx after "$T/out"
expect_rc 0 "COMMAND's own options stay its own" "$DLOCK" run f sh -c 'echo "$0 $1"' --ttl x
check "sh got '--ttl x'" grep -qx -- "--ttl x" "$T/out"
expect_rc 0 "the old form NAME -- COMMAND" "$DLOCK" run f -- echo old
check "the old form ran" grep -qx old "$T/out"
expect_rc 0 "a NAME that starts with '-'" "$DLOCK" run -- -odd -- sh -c 'echo "$DLOCK_NAME"'
check "DLOCK_NAME is -odd" grep -qx -- "-odd" "$T/out"
expect_rc 0 "NAME after -- without a second --" "$DLOCK" run -- -odd2 echo two
check "ran echo" grep -qx two "$T/out"
expect_rc 127 "a second word is COMMAND, not a second NAME" "$DLOCK" run A B -- true
check "it says B was not found" grep -q "B: command not found" "$T/err"

# -c: one command string for /bin/sh, with the lock's environment.
expect_rc 0 "-c" "$DLOCK" run f -c 'echo "$DLOCK_NAME:$DLOCK_FENCE" | tr a-z A-Z'
check "-c ran through the shell ($(cat "$T/out"))" grep -Eqx 'F:[1-9][0-9]*' "$T/out"
expect_rc 7 "-c before NAME, exit status passed on" "$DLOCK" run -c 'exit 7' f
expect_rc 0 "--command=S" "$DLOCK" run --command='echo long' f
check "--command ran" grep -qx long "$T/out"
expect_rc 64 "-c with a COMMAND too" "$DLOCK" run f -c 'true' echo x
check "says they exclude each other" grep -q "exclude" "$T/err"

# -E: the exit code when the lock is not acquired (--no-wait or --wait ran out).
expect_rc 0 "hold f" "$DLOCK" acquire --ttl 60s f
H=$(cat "$T/out")
expect_rc 75 "default: 75" "$DLOCK" run --no-wait f true
expect_rc 3 "-E 3 with --no-wait" "$DLOCK" run -E 3 --no-wait f true
expect_rc 4 "--conflict-exit-code 4 with --wait" "$DLOCK" run --conflict-exit-code 4 --wait 200ms f true
expect_rc 0 "-E 0" "$DLOCK" run --no-wait -E 0 f -c 'echo should-not-run'
check "the command did not run" sh -c "! grep -q should-not-run '$T/out'"
expect_rc 64 "-E 256 is refused" "$DLOCK" run -E 256 f true
expect_rc 64 "-E x is refused" "$DLOCK" run -E x f true
expect_rc 42 "-E does not change the command's status" "$DLOCK" run -E 3 g -c 'exit 42'
"$DLOCK" release f "$H"

# The hold form: prints the fence, holds (renewing) until interrupted.
: >"$T/hold.out"
"$DLOCK" --json run --hold --ttl 2s h >"$T/hold.out" 2>"$T/hold.err" &
hold=$!
for _ in $(seq 1 400); do [ -s "$T/hold.out" ] && break; sleep 0.025; done
check "--json line ($(cat "$T/hold.out"))" grep -Eq '^\{"name":"h","fence":[1-9][0-9]*,"ttl_ms":[0-9]+\}$' "$T/hold.out"
# Longer than the 2 s TTL: renewals keep it.
"$DLOCK" run --wait 3s h true >/dev/null 2>&1
rc=$?
check "still held after more than a TTL (exit $rc)" [ "$rc" -eq 75 ]
kill -INT "$hold" # no effect: a background job of this script ignores SIGINT
kill -HUP "$hold"
wait "$hold"
rc=$?
check "ended by SIGHUP: 129 (got $rc)" [ "$rc" -eq 129 ]
expect_rc 0 "released" "$DLOCK" run --no-wait h true

# No COMMAND without --hold: a usage error that says how to hold, and
# nothing is taken (another takes the name at once).
expect_rc 64 "NAME alone" "$DLOCK" run f
check "says to use --hold" grep -q "use --hold: dlock run --hold f" "$T/err"
expect_rc 0 "NAME alone took nothing" "$DLOCK" run --no-wait f true
set --
expect_rc 64 "a script's empty \"\$@\"" "$DLOCK" run --wait 1s f "$@"
expect_rc 64 "--hold with a COMMAND" "$DLOCK" run --hold f true
check "says --hold takes no COMMAND" grep -q -- "--hold takes no COMMAND (got 'true')" "$T/err"
expect_rc 64 "--hold with -c" "$DLOCK" run --hold f -c true

# Usage errors that stay errors.
expect_rc 64 "NAME -- with nothing after" "$DLOCK" run f --
expect_rc 64 "-- NAME with no COMMAND" "$DLOCK" run -- f
expect_rc 64 "no NAME" "$DLOCK" run
finish
