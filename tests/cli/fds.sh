#!/bin/bash
# No descriptor that dlock opened reaches COMMAND (store sockets, pipes,
# files: whatever the store's client library made, close-on-exec or not);
# the descriptors the caller handed to dlock do, as with flock. COMMAND
# lists its own descriptors (/proc/PID/fd of the shell that runs it) on the
# store of CLI_TEST_URI_FILE (see lib.sh), or the embedded one.
. "$(dirname "$0")/lib.sh" "$@"

# list: the descriptors a program started by this shell gets, one line.
list() { "$@" sh -c 'ls /proc/$$/fd; :' 2>>"$T/err" | sort -n | tr '\n' ' '; }

exec 7<"$T" 9>"$T/nine"
want=$(list env)
got=$(list "$DLOCK" run fds --)
check "COMMAND has exactly the caller's descriptors: want '$want', got '$got' ($(cat "$T/err"))" \
	[ "$got" = "$want" ]
check "the caller's fd 7 and 9 are among them ($got)" grep -Eq '(^| )7 .*9 ' <<<"$got"
# A closed stdin: whatever dlock opens first takes fd 0, and must not reach COMMAND.
want=$(list env 0<&-)
got=$(list "$DLOCK" run fds -- 0<&-)
check "with stdin closed: want '$want', got '$got'" [ "$got" = "$want" ]
finish
