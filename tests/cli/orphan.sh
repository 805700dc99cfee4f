#!/bin/bash
# The command of `dlock run` does not outlive dlock: when dlock is killed
# (SIGKILL, as the OOM killer does), its command and the command's own
# children go at once, long before the lease (--ttl 60s) would end, whether
# dlock alone is killed or its whole process group (`kill -9 -- -PGID`,
# which must not take the watcher along with it).
. "$(dirname "$0")/lib.sh" "$@"

# running PID: the process exists and is not a zombie.
running() { [ -e "/proc/$1/stat" ] && ! grep -q '^[0-9]* (.*) Z ' "/proc/$1/stat" 2>/dev/null; }

# start: a run whose command leaves a child (a grandchild of dlock) behind a
# trap-free shell, and reports both pids when they run. dlock leads a
# process group of its own (setsid), as a job of an interactive shell does.
start() {
	rm -f "$T/pids"
	setsid "$DLOCK" run --ttl 60s "$1" -- sh -c \
		"sleep 1000 & echo \"\$\$ \$!\" >'$T/pids.tmp'; mv '$T/pids.tmp' '$T/pids'; wait" \
		2>"$T/run.err" &
	run_pid=$!
	for _ in $(seq 1 400); do [ -s "$T/pids" ] && break; sleep 0.025; done
	read -r cmd_pid gc_pid <"$T/pids"
}

# gone_within MS PID...: every PID has ended within MS milliseconds; sets $took.
gone_within() {
	local bound=$1; shift
	local t0 left
	t0=$(now_ms)
	while :; do
		left=0
		for p in "$@"; do running "$p" && left=1; done
		took=$(( $(now_ms) - t0 ))
		[ "$left" -eq 0 ] && return 0
		[ "$took" -ge "$bound" ] && return 1
		sleep 0.02
	done
}

# 1. SIGKILL to dlock alone.
start orphan1
check "the command and its child run" running "$cmd_pid"
check "setsid made dlock its own group leader" \
	[ "$(ps -o pgid= -p "$run_pid" | tr -d ' ')" = "$run_pid" ]
kill -KILL "$run_pid"
gone_within 5000 "$cmd_pid" "$gc_pid"
rc=$?
check "kill -9 dlock: command and grandchild gone within 5 s (took $took ms)" [ "$rc" -eq 0 ]
echo "measured: kill -9 dlock -> command group gone in $took ms"
wait "$run_pid" 2>/dev/null
kill -KILL "$cmd_pid" "$gc_pid" 2>/dev/null

# 2. SIGKILL to dlock's whole process group (dlock and anything that shares it).
start orphan2
check "the command runs (2)" running "$cmd_pid"
kill -KILL -- "-$run_pid"
gone_within 5000 "$cmd_pid" "$gc_pid"
rc=$?
check "kill -9 -- -PGID: command and grandchild gone within 5 s (took $took ms)" [ "$rc" -eq 0 ]
echo "measured: kill -9 dlock's group -> command group gone in $took ms"
wait "$run_pid" 2>/dev/null
kill -KILL "$cmd_pid" "$gc_pid" 2>/dev/null

# 3. The lock was not released (dlock could not): it is still held until
#    its lease ends.
expect_rc 75 "the killed run's lease still holds the lock" "$DLOCK" run --no-wait orphan1 -- true
finish
