#!/bin/bash
# The seams table of docs/safety.md: `dlock check` with the ops and faults of
# issue 30 on every store, real servers. Not a CI test (a few minutes, every
# server; cli.check_seams* are the short CI runs):
#   bash tests/cli/check_seams_matrix.sh BUILD/src/cli/dlock [STORE...] > table.md
# STOREs: sqlite postgres mysql memcached zookeeper redis etcd redlock
# (default: all). Per store: --ops extend,handle with --faults kill-tool;
# then the store's own fault: session-kill on PostgreSQL (mode=advisory) and
# MySQL (mode=get_lock), evict on a memcached of 2 MB that may evict (no -M),
# failback on Redis (a second redis-server as its replica, fence_replicas=1,
# wait_replicas=0). Each server is started by tests/servers/<kind>.sh (the
# evicting memcached directly) on free loopback ports in a temp dir and
# stopped afterwards. Progress on stderr.
# Env: CHECK_DURATION (default 12s), CHECK_TTL (500ms), CHECK_HOLD (50ms), CHECK_SEED (42).
set -u
DLOCK=${1:?usage: check_seams_matrix.sh PATH/TO/dlock [STORE...]}
shift
here=$(cd "$(dirname "$0")" && pwd)
servers=$here/../servers
stores=("$@")
[ ${#stores[@]} -gt 0 ] || stores=(sqlite postgres mysql memcached zookeeper redis etcd redlock)
dur=${CHECK_DURATION:-12s} ttl=${CHECK_TTL:-500ms} hold=${CHECK_HOLD:-50ms} seed=${CHECK_SEED:-42}
T=$(mktemp -d "${TMPDIR:-/tmp}/dlock-seams-matrix.XXXXXX")
started=() mcpid=
cleanup() {
	for s in "${started[@]}"; do bash "$servers/${s%%:*}.sh" stop "${s#*:}" >/dev/null 2>&1; done
	[ -n "$mcpid" ] && kill "$mcpid" 2>/dev/null
	rm -rf "$T"
}
trap cleanup EXIT

field() { grep -o "\"$1\":\"\?[^,\"}]*" "$2" | head -1 | sed 's/^"[^"]*":"\{0,1\}//'; }
# done_n KIND FILE: faults of KIND carried out; count_n KIND FILE: the sum of their counts.
done_n() { grep -o "{\"kind\":\"$1\",[^}]*\"ok\":true" "$2" | wc -l; }
count_n() { grep -o "{\"kind\":\"$1\",[^}]*\"ok\":true[^}]*" "$2" | grep -o '"count":[0-9-]*' | cut -d: -f2 |
	awk '{ s += $1 } END { print s + 0 }'; }
start() {
	local script=$1 dir=$2 n=${3:-}
	if ! bash "$script" start "$dir" $n >"$T/start.log" 2>&1; then
		tail -5 "$T/start.log" >&2
		return 1
	fi
	started+=("$(basename "$script" .sh):$dir")
}

# row STORE LABEL URI ARGS...: one run, one table row.
row() {
	local store=$1 label=$2 uri=$3; shift 3
	local out=$T/run.json
	echo "  $store: $label" >&2
	"$DLOCK" --store "$uri" --json check --clients 3 --duration "$dur" --ttl "$ttl" --hold "$hold" \
		--seed "$seed" "$@" >"$out" 2>"$out.err"
	local rc=$?
	if [ ! -s "$out" ]; then
		echo "| $store | $label | error: $(head -c 200 "$out.err" | tr '\n|' '  ') | | | | | | | | $rc |"
		return
	fi
	local what=""
	for k in kill-tool session-kill evict failback; do
		local n; n=$(done_n "$k" "$out")
		[ "$n" -gt 0 ] && what="$what$k ×$n (count $(count_n "$k" "$out")) "
	done
	local kinds
	kinds="$(field plain "$out")/$(field extend "$out")/$(field handle "$out")/$(field run "$out")"
	echo "| $store | $label | $kinds | $(field extends "$out") | $(field renewals_delayed "$out") | ${what:-—} | $(field grants "$out") | $(field overlaps "$out") | $(field fence_order_violations "$out") | $(field verdict "$out")$( [ "$(field not_run "$out")" != 0 ] && echo ": $(field not_run_why "$out" | head -c 120)") | $rc |"
}

echo "| store | run | holds plain/extend/handle/dlock run | extends | renewals delayed | faults carried out | grants | overlaps (store at fault) | fences out of order | verdict | exit |"
echo "|---|---|---|---:|---:|---|---:|---:|---:|---|---:|"
for store in "${stores[@]}"; do
	script= n=
	case $store in
	sqlite) ;;
	redis) script=$servers/redis.sh n=2 ;;
	redlock) script=$servers/redlock.sh ;;
	*) script=$servers/$store.sh ;;
	esac
	dir=$T/$store uri="sqlite://$T/sqlite.db"
	if [ -n "$script" ]; then
		echo "starting $store" >&2
		if ! start "$script" "$dir" $n; then
			echo "| $store | — | server failed to start | | | | | | | | |"
			continue
		fi
		uri=$(cat "$dir/uri")
	fi
	if [ "$store" = redis ]; then
		p0=$(cat "$dir/0/port") p1=$(cat "$dir/1/port")
		uri="redis://127.0.0.1:$p0"
		redis-cli -p "$p1" replicaof 127.0.0.1 "$p0" >/dev/null
		for _ in $(seq 1 100); do redis-cli -p "$p1" info replication | grep -q master_link_status:up && break; sleep 0.1; done
	fi
	row "$store" "--ops extend,handle --faults kill-tool" "$uri" --ops extend,handle --faults kill-tool
	case $store in
	postgres) row "$store" "session-kill (mode=advisory)" "$uri?mode=advisory" --faults session-kill ;;
	mysql) row "$store" "session-kill (mode=get_lock)" "$uri?mode=get_lock" --faults session-kill ;;
	redis) row "$store" "failback (fence_replicas=1&wait_replicas=0)" "$uri?fence_replicas=1&wait_replicas=0" \
		--faults failback --replica "127.0.0.1:$p1" ;;
	memcached)
		port=$(bash -c ". '$servers/lib.sh'; free_port")
		user=(); [ "$(id -u)" -eq 0 ] && user=(-u nobody)
		memcached -l 127.0.0.1 -p "$port" -U 0 -m 2 -t 1 "${user[@]}" >"$T/mc.log" 2>&1 &
		mcpid=$!
		for _ in $(seq 1 50); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
		row "$store" "evict (-m 2, no -M) with --ops extend" "memcached://127.0.0.1:$port" --faults evict --ops extend
		kill "$mcpid"; mcpid=
		;;
	esac
	[ -n "$script" ] && bash "$script" stop "$dir" >/dev/null 2>&1
done
