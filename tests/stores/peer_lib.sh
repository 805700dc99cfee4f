# Shared by the interop tests against other lock clients (etcd_etcdctl.sh,
# zookeeper_curator.sh): sourced, not run. The sourcing script defines fail().

# wait_line FILE WORD SECONDS: until FILE has a line WORD (a process said so)
wait_line() {
	local i
	for ((i = 0; i < $3 * 20; i++)); do
		grep -qx "$2" "$1" 2>/dev/null && return 0
		sleep 0.05
	done
	return 1
}

# waits_quietly COUNT_FN MAX WHAT GOT_SECONDS WHO HELD_FILE RELEASE_FILE GOT_FILE [QUEUED_FN]:
# with a holder holding (HELD_FILE says held) and a waiter started, count the
# server's WHAT with COUNT_FN over 3 s of waiting — at most MAX, where a
# poller would send hundreds — then release (RELEASE_FILE) and see the waiter
# get the lock (GOT_FILE written within GOT_SECONDS). The count starts once
# QUEUED_FN succeeds (the waiter is in the queue: its queueing requests are
# not the point; up to 30 s), or, without one, half a second after the
# holder said held.
waits_quietly() {
	local count=$1 max=$2 what=$3 secs=$4 who=$5 i c0 c1
	wait_line "$6" held 30 || { fail "$who: the holder did not start"; return; }
	if [ -n "${9:-}" ]; then
		for ((i = 0; i < 600; i++)); do "$9" && break; sleep 0.05; done
		"$9" || { fail "$who: the waiter did not queue"; return; }
	else
		sleep 0.5
	fi
	c0=$($count)
	sleep 3
	c1=$($count)
	touch "$7"
	for ((i = 0; i < secs * 20; i++)); do [ -s "$8" ] && break; sleep 0.05; done
	[ -s "$8" ] || fail "$who: the waiter never got the lock"
	echo "$who waited 3 s with $((c1 - c0)) $what at the server"
	[ $((c1 - c0)) -le "$max" ] || fail "$who: $((c1 - c0)) $what in 3 s of waiting (polling?)"
}
