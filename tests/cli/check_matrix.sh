#!/bin/bash
# The table of docs/safety.md: `dlock check` against real servers, per store
# and fault, with fencing on and off. Not a CI test (tens of minutes, every
# server):
#   bash tests/cli/check_matrix.sh BUILD/src/cli/dlock [STORE...] > table.md
# STOREs: sqlite postgres mysql memcached zookeeper redis etcd redlock
# zookeeper3 sentinel (default: all). Each server is started by
# tests/servers/<kind>.sh on free loopback ports in a temp dir and stopped
# afterwards (the Sentinel setup afresh for every run: a failover kills its
# master for good). Progress on stderr.
# Faults per store: pause and kill everywhere; file-delete on SQLite;
# partition, lose-reply, delay and server-pause on every network store;
# restart on MySQL and Redis; member on the ensembles; member-restart on
# Redlock (masters without persistence, holds of 1.5 × TTL so that one hold
# spans several restarts, and runs 3 × as long: one rolling restart of 5
# masters takes about 10 s); failover on Redis + Sentinel.
# Env: CHECK_DURATION (default 10s), CHECK_TTL (1s), CHECK_HOLD (100ms), CHECK_SEED (42).
set -u
DLOCK=${1:?usage: check_matrix.sh PATH/TO/dlock [STORE...]}
shift
here=$(cd "$(dirname "$0")" && pwd)
servers=$here/../servers
stores=("$@")
[ ${#stores[@]} -gt 0 ] || stores=(sqlite postgres mysql memcached zookeeper redis etcd redlock zookeeper3 sentinel)
dur=${CHECK_DURATION:-10s} ttl=${CHECK_TTL:-1s} hold=${CHECK_HOLD:-100ms} seed=${CHECK_SEED:-42}
T=$(mktemp -d "${TMPDIR:-/tmp}/dlock-check-matrix.XXXXXX")
started=()
cleanup() {
	for s in "${started[@]}"; do bash "$servers/${s%%:*}.sh" stop "${s#*:}" >/dev/null 2>&1; done
	rm -rf "$T"
}
trap cleanup EXIT

# field KEY FILE: first value of "KEY": in FILE.
field() { grep -o "\"$1\":\"\?[^,\"}]*" "$2" | head -1 | sed 's/^"[^"]*":"\{0,1\}//'; }
# heal FAULT FILE: the worst time from that fault's end to the next grant over
# the faults carried out; "no grant after one" when a fault had none.
heal() {
	grep -o "\"kind\":\"$1\",[^}]*\"ok\":true,\"heal_to_grant_ms\":[0-9.-]*" "$2" | sed 's/.*://' |
		awk 'BEGIN { m = 0; none = 0; n = 0 } { n++; if ($1 < 0) none = 1; else if ($1 > m) m = $1 }
		     END { if (n == 0) print "—"; else if (none) print "no grant after one"; else print m }'
}
# worst KEY FILE: the largest value of KEY over the faults in FILE ("—" when none is >= 0).
worst() { grep -o "\"$1\":[0-9.-]*" "$2" | cut -d: -f2 | awk 'BEGIN { m = -1 } $1 > m { m = $1 } END { if (m < 0) print "—"; else print m }'; }

# to_ms D: a duration (250ms, 1s, 2) in milliseconds.
to_ms() { case $1 in *ms) echo "${1%ms}" ;; *s) echo $(( ${1%s} * 1000 )) ;; *) echo $(( $1 * 1000 )) ;; esac; }

# start SCRIPT DIR [N]: start a server; 0 when up (its URI in DIR/uri).
start() {
	local script=$1 dir=$2 n=${3:-}
	if ! bash "$script" start "$dir" $n >"$T/start.log" 2>&1; then
		tail -5 "$T/start.log" >&2
		return 1
	fi
	started+=("$(basename "$script" .sh):$dir")
}

net="partition lose-reply delay server-pause"
echo "| store | fault | fencing | grants | overlaps (store at fault) | overlaps after pause | stale writes accepted | lost updates | fences out of order | worst fault end → next grant (ms) | longest overlap after a fault's end (ms) | workers stuck at the end | exit |"
echo "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for store in "${stores[@]}"; do
	script= n= fresh=0 runs=0
	case $store in
	sqlite) faults="pause kill file-delete" ;;
	zookeeper3) script=$servers/zookeeper.sh n=3 faults="pause kill member $net" ;;
	redis) script=$servers/redis.sh faults="pause kill restart $net" ;;
	redlock) script=$servers/redlock.sh faults="pause kill member member-restart $net" ;;
	mysql) script=$servers/mysql.sh faults="pause kill restart $net" ;;
	sentinel) script=$servers/redis-sentinel.sh fresh=1 faults="failover" ;;
	*) script=$servers/$store.sh faults="pause kill $net" ;;
	esac
	dir=$T/$store
	uri="sqlite://$T/sqlite.db"
	extra=()
	if [ -n "$script" ]; then
		echo "starting $store" >&2
		if ! start "$script" "$dir" $n; then
			echo "| $store | — | — | server failed to start | | | | | | | | | |"
			continue
		fi
		uri=$(cat "$dir/uri")
		extra=(--server-script "$script" --server-dir "$dir")
	fi
	for fault in $faults; do
		for fencing in on off; do
			out=$T/$store-$fault-$fencing.json
			h=$hold label=$fault d=$dur
			if [ "$fault" = member-restart ]; then
				# one sweep of 5 masters takes ~10 s (redis.sh kill waits ~1 s for the pid to go)
				h=$(( $(to_ms "$ttl") * 3 / 2 ))ms d=$(( $(to_ms "$dur") * 3 ))ms label="member-restart (hold $h, $d)"
			fi
			if [ "$fresh" = 1 ] && [ "$runs" -gt 0 ]; then
				bash "$script" stop "$dir" >/dev/null 2>&1
				if ! start "$script" "$dir"; then
					echo "| $store | $label | $fencing | server failed to start | | | | | | | | | |"
					continue
				fi
				uri=$(cat "$dir/uri")
			fi
			echo "  $store $fault fencing $fencing" >&2
			"$DLOCK" --store "$uri" --json check --clients 3 --duration "$d" --ttl "$ttl" --hold "$h" \
				--faults "$fault" --fencing "$fencing" --seed "$seed" "${extra[@]}" >"$out" 2>"$out.err"
			rc=$?
			runs=$((runs + 1))
			if [ ! -s "$out" ]; then
				echo "| $store | $label | $fencing | error: $(head -c 200 "$out.err" | tr '\n|' '  ') | | | | | | | | | $rc |"
				continue
			fi
			nf=$(grep -o "\"kind\":\"$fault\",[^}]*\"ok\":true" "$out" | wc -l)
			echo "| $store | ${label/$fault/$fault ×$nf} | $fencing | $(field grants "$out") | $(field overlaps "$out") | $(field overlaps_after_pause "$out") | $(field stale_writes_accepted "$out") | $(field lost_updates "$out") | $(field fence_order_violations "$out") | $(heal "$fault" "$out") | $(worst split_ms "$out") | $(field workers_stuck "$out") | $rc |"
		done
	done
	if [ -n "$script" ]; then
		bash "$script" stop "$dir" >/dev/null 2>&1
	fi
done
