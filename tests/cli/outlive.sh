#!/bin/bash
# `dlock run`'s promise: COMMAND's whole process group is gone before the
# lease can end on the store — when dlock is SIGKILLed (the OOM killer), and
# (with a FAULTPROXY, on a lease store) when the link to the store is cut so
# that the lease runs out. COMMAND ignores SIGTERM (so SIGKILL must land in
# time). A second `dlock run` waits for the lock; its command, the moment it
# starts, looks whether any process of the first command's group still runs.
#   outlive.sh DLOCK [FAULTPROXY]     store: CLI_TEST_URI_FILE (see lib.sh)
. "$(dirname "$0")/lib.sh" "$@"
PROXY=${2:-}
[ -n "${DLOCK_STORE:-}" ] || { echo "needs CLI_TEST_URI_FILE" >&2; exit 1; }

# running PGID: how many processes of group PGID run (zombies are dead).
running() { ps -e -o pgid=,stat= | awk -v g="$1" '$1 == g && $2 !~ /^Z/ { n++ } END { print n + 0 }'; }

# first STORE_URI KILL_AFTER: start the TERM-ignoring command; sets run_pid, pgid.
first() {
	rm -f "$T/ready" "$T/pgid"
	mkfifo "$T/ready"
	"$DLOCK" --store "$1" run --ttl 3s --kill-after "$2" victim -- \
		sh -c "trap '' TERM; (trap '' TERM; while :; do sleep 0.05; done) & echo \$\$ >'$T/pgid'; echo go >'$T/ready'; wait" \
		2>"$T/first.err" &
	run_pid=$!
	read -r _ <"$T/ready"
	pgid=$(cat "$T/pgid")
}

# second: the waiter; its command records when it started and what still ran.
second() {
	rm -f "$T/second.out"
	"$DLOCK" run --ttl 3s --wait 30s victim -- \
		sh -c "echo \"\$(date +%s%3N) \$(ps -e -o pgid=,stat= | awk -v g=$pgid '\$1 == g && \$2 !~ /^Z/ { n++ } END { print n + 0 }')\" >'$T/second.out'" \
		2>"$T/second.err" &
	second_pid=$!
}

# watch_group: until the group is gone (at most 30 s); sets gone_at (ms).
watch_group() {
	gone_at=
	for _ in $(seq 1 3000); do
		[ "$(running "$pgid")" -eq 0 ] && { gone_at=$(now_ms); return; }
		sleep 0.01
	done
}

verdict() {
	local what=$1
	wait "$second_pid"
	local rc=$? started overlap
	read -r started overlap <"$T/second.out" 2>/dev/null
	check "$what: the second run got the lock (exit $rc: $(head -c 300 "$T/second.err"))" [ "$rc" -eq 0 ]
	check "$what: the first command's group was gone (watcher saw it go)" [ -n "$gone_at" ]
	check "$what: no process of the first command ran when the second started (${overlap:-?} ran; second started $(( ${started:-0} - ${gone_at:-0} )) ms after the group was seen gone)" \
		[ "${overlap:-1}" -eq 0 ]
	[ "${overlap:-1}" -eq 0 ] || cat "$T/first.err" >&2
}

# 1. SIGKILL of dlock run (no chance to clean up): its watcher ends the group
#    before the lease can end; on a session store it keeps the session until then.
first "$DLOCK_STORE" 30s
second
kill -KILL "$run_pid"
wait "$run_pid" 2>/dev/null
watch_group
verdict "dlock SIGKILLed"

# 2. The link cut (faultproxy blackholes it): renewals go unanswered, the lease
#    runs out on the store; SIGTERM is ignored; SIGKILL must land before that.
if [ -n "$PROXY" ]; then
	hostport=$(grep -Eo '127\.0\.0\.1:[0-9]+' <<<"$DLOCK_STORE" | head -1)
	"$PROXY" "$T/ctl" "$hostport" >"$T/ports" 2>"$T/proxy.err" &
	for _ in $(seq 1 100); do grep -q ready "$T/ports" 2>/dev/null && break; sleep 0.05; done
	check "the proxy started" grep -q ready "$T/ports"
	port=$(head -1 "$T/ports")
	first "${DLOCK_STORE/$hostport/127.0.0.1:$port}" 30s
	second
	echo blackhole | socat - "UNIX-CONNECT:$T/ctl" >/dev/null
	t0=$(now_ms)
	watch_group
	verdict "link cut"
	wait "$run_pid"
	rc=$?
	check "the first run exits 76 (got $rc)" [ "$rc" -eq 76 ]
	check "it said the lease was at risk" grep -q "at risk" "$T/first.err"
	echo "group gone $(( gone_at - t0 )) ms after the cut (lease 3 s)"
fi
finish
