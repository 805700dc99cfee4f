#!/bin/bash
# Bad usage exits 64 with a one-line message; --help on every command exits 0;
# --version; malformed input never reaches the store.
. "$(dirname "$0")/lib.sh" "$@"

# usage_error DESC ARGS...: exit 64, exactly one line on stderr, nothing on stdout.
usage_error() {
	local desc=$1; shift
	expect_rc 64 "$desc" "$DLOCK" "$@"
	check "$desc: one line on stderr" [ "$(wc -l <"$T/err")" -eq 1 ]
	check "$desc: message names dlock" grep -q '^dlock' "$T/err"
	check "$desc: nothing on stdout" [ ! -s "$T/out" ]
}

usage_error "unknown global flag" --frobnicate status
usage_error "unknown run flag" run --frobnicate L -- true
usage_error "unknown acquire flag" acquire --bogus L
usage_error "bad --ttl duration" run --ttl 5parsecs L -- true
usage_error "bad --wait duration" acquire --wait soon L
usage_error "negative duration" run --wait -1s L -- true
usage_error "bad --kill-after" run --kill-after x L -- true
usage_error "zero ttl" acquire --ttl 0 L
usage_error "missing command after --" run L --
usage_error "missing name" run -- true
usage_error "empty name (run)" run "" -- true
usage_error "empty name (acquire)" acquire ""
usage_error "empty name (status)" status ""
usage_error "--wait with --no-wait" run --wait 1s --no-wait L -- true
usage_error "--shared with --permits" acquire --shared --permits 3 L
usage_error "bad --permits" acquire --permits zero L
usage_error "option without value" acquire L --ttl
usage_error "flag with a value" acquire --no-wait=yes L
usage_error "no command" 
usage_error "unknown command" frobnicate
usage_error "release missing handle" release L
usage_error "extend missing handle" extend L
usage_error "malformed handle (release)" release L not-a-handle
usage_error "malformed handle (extend)" extend L dl1.x.1.1.1000.zzzz
usage_error "name too long" acquire "$(head -c 600 /dev/zero | tr '\0' n)"
usage_error "demo takes no arguments" demo now
# Nothing above may have created a lock.
expect_rc 0 "status after usage errors" "$DLOCK" --json status
check "no lock was taken by bad usage" grep -q '"locks":\[\]' "$T/out"

for cmd in run acquire extend release status demo; do
	expect_rc 0 "$cmd --help" "$DLOCK" "$cmd" --help
	check "$cmd --help prints usage" grep -q "^Usage: dlock $cmd" "$T/out"
	expect_rc 0 "help $cmd" "$DLOCK" help "$cmd"
done
expect_rc 0 "--help" "$DLOCK" --help
check "--help lists commands" grep -q "acquire" "$T/out"
expect_rc 0 "--version" "$DLOCK" --version
check "--version prints a version" grep -Eq '^dlock [0-9]+\.[0-9]+\.[0-9]+' "$T/out"

# Exit 127 for a command that does not exist, before the lock is taken.
expect_rc 127 "command not found" "$DLOCK" run L -- /nonexistent/command
expect_rc 0 "lock free after command-not-found" "$DLOCK" --json status L
check "no holder after command-not-found" grep -q '"holders":\[\]' "$T/out"

# A store that cannot be reached exits 69, and its password is never printed.
for uri in "redis://user:s3cretpw@127.0.0.1:1" "mysql://user:s3cretpw@127.0.0.1:1/db" \
	   "postgres://user:s3cretpw@127.0.0.1:1/db"; do
	expect_rc 69 "unreachable store $uri" "$DLOCK" --store "$uri" acquire --no-wait L
	check "password not shown for $uri" sh -c "! grep -q s3cretpw '$T/err' '$T/out'"
	DLOCK_STORE=$uri expect_rc 69 "DLOCK_STORE=$uri" "$DLOCK" status L
	check "password not shown via DLOCK_STORE" sh -c "! grep -q s3cretpw '$T/err' '$T/out'"
done
usage_error "bad store URI" --store "nosuchscheme://x" status

finish
