#!/bin/bash
# The CLI paths under valgrind (a build without sanitizers): no invalid
# accesses, no definite or possible leaks. valgrind's own error exit is 99 so
# it cannot be mistaken for one of dlock's exit codes.
. "$(dirname "$0")/lib.sh" "$1"
VG=${2:-valgrind}
VGOPTS=(-q --leak-check=full --errors-for-leak-kinds=definite,possible --error-exitcode=99
	--child-silent-after-fork=yes --log-file="$T/vg.%p")
vg() { "$VG" "${VGOPTS[@]}" "$DLOCK" "$@"; }
vg_clean() {
	local desc=$1
	if cat "$T"/vg.* 2>/dev/null | grep -q .; then
		fail "$desc: valgrind reported: $(cat "$T"/vg.* | head -40)"
	else
		ok
	fi
	rm -f "$T"/vg.*
}

expect_rc 0 "acquire" vg acquire --ttl 30s v
H=$(cat "$T/out"); vg_clean acquire
expect_rc 75 "acquire --no-wait held" vg acquire --no-wait v; vg_clean "acquire --no-wait"
expect_rc 75 "acquire --wait 300ms held" vg acquire --wait 300ms v; vg_clean "acquire --wait"
expect_rc 0 "status" vg status; vg_clean status
expect_rc 0 "status --json NAME" vg --json status v nothere; vg_clean "status --json"
expect_rc 0 "extend" vg extend --ttl 30s v "$H"
H=$(cat "$T/out"); vg_clean extend
expect_rc 1 "release wrong handle" vg release v "${H%-*}-999"; vg_clean "release wrong"
expect_rc 64 "release malformed handle" vg release v junk; vg_clean "release malformed"
expect_rc 0 "release" vg release v "$H"; vg_clean release
# dlock break: status, the core's lookup by public id, the owner's release.
expect_rc 0 "acquire to break" "$DLOCK" acquire --ttl 30s vb
"$DLOCK" --json status vb >"$T/st"
bid=$(grep -o '"id":"[0-9a-f]*"' "$T/st" | head -1 | cut -d'"' -f4)
expect_rc 0 "break --holder" vg break --holder "$bid" vb; vg_clean "break --holder"
expect_rc 1 "break of a free lock" vg --json break vb; vg_clean "break free"
# The holder-process path (stores whose holds die with their session).
DLOCK_TEST_HOLDER=1 expect_rc 0 "holder acquire" vg acquire --ttl 30s hv
H=$(cat "$T/out"); vg_clean "holder acquire"
expect_rc 0 "holder extend" vg extend hv "$H"
H=$(cat "$T/out"); vg_clean "holder extend"
expect_rc 1 "holder release, wrong name" vg release nothv "$H"; vg_clean "holder release wrong"
expect_rc 0 "holder release" vg release hv "$H"; vg_clean "holder release"
expect_rc 0 "run" vg run --ttl 3s v -- sh -c 'exit 0'; vg_clean run
expect_rc 3 "run exit 3" vg run v -- sh -c 'exit 3'; vg_clean "run exit 3"
expect_rc 127 "run not found" vg run v -- /no/such/cmd; vg_clean "run not found"
expect_rc 64 "run usage" vg run v --; vg_clean "run usage"
# Loss under valgrind: renewal stops while dlock is stopped; another client
# takes the lock; dlock continues, kills its command, exits 76.
mkfifo "$T/ready"
# Not through vg(): $! must be valgrind itself, not a subshell around it.
"$VG" "${VGOPTS[@]}" "$DLOCK" run --ttl 1s --kill-after 1s v -- \
	sh -c "echo go >'$T/ready'; exec sleep 600" >"$T/run.out" 2>"$T/run.err" &
pid=$!
read -r _ <"$T/ready"
# Stopped outside a write of its own: a process stopped inside one (its
# renewal's, slow under valgrind) keeps the database's write lock, and every
# other name waits behind it (docs/stores/sqlite.md). A try-once of another
# name is the probe: it needs that lock; refused, the holder runs on a
# little and is stopped again.
stopped_outside_write=0
for _ in $(seq 1 20); do
	kill -STOP $pid
	if "$DLOCK" run --no-wait vprobe -- true >/dev/null 2>&1; then
		stopped_outside_write=1
		break
	fi
	kill -CONT $pid
	sleep 0.05
done
check "holder stopped outside a write" [ "$stopped_outside_write" = 1 ]
expect_rc 0 "steal after the lease" "$DLOCK" acquire --wait 20s v
kill -CONT $pid
wait $pid
rc=$?
check "lost run exits 76 under valgrind (got $rc: $(cat "$T/run.err"))" [ "$rc" -eq 76 ]
vg_clean "run lost"
finish
