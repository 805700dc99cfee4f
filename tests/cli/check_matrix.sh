#!/bin/bash
# The table of docs/safety.md: `dlock check` against real servers, per store
# and fault, with fencing on and off. Not a CI test (minutes, every server):
#   bash tests/cli/check_matrix.sh BUILD/src/cli/dlock [STORE...] > table.md
# STOREs: sqlite postgres mysql memcached zookeeper redis etcd redlock zookeeper3
# (default: all). Each server is started by tests/servers/<kind>.sh on free
# loopback ports in a temp dir and stopped afterwards. Progress on stderr.
# Env: CHECK_DURATION (default 10s), CHECK_TTL (1s), CHECK_HOLD (100ms), CHECK_SEED (42).
set -u
DLOCK=${1:?usage: check_matrix.sh PATH/TO/dlock [STORE...]}
shift
here=$(cd "$(dirname "$0")" && pwd)
servers=$here/../servers
stores=("$@")
[ ${#stores[@]} -gt 0 ] || stores=(sqlite postgres mysql memcached zookeeper redis etcd redlock zookeeper3)
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

echo "| store | fault | fencing | grants | overlaps (store at fault) | overlaps after pause | stale writes accepted | lost updates | fences out of order | worst fault end → next grant (ms) | exit |"
echo "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
for store in "${stores[@]}"; do
	script= faults="pause kill" extra=()
	case $store in
	sqlite) uri="sqlite://$T/sqlite.db" ;;
	zookeeper3) script=$servers/zookeeper.sh faults="pause kill member" ;;
	redis|redlock) script=$servers/$store.sh faults="pause kill restart"; [ "$store" = redlock ] && faults="pause kill member" ;;
	mysql) script=$servers/mysql.sh faults="pause kill restart" ;;
	*) script=$servers/$store.sh ;;
	esac
	if [ -n "$script" ]; then
		dir=$T/$store
		echo "starting $store" >&2
		n=; [ "$store" = zookeeper3 ] && n=3
		if ! bash "$script" start "$dir" $n >"$T/$store.start.log" 2>&1; then
			echo "| $store | — | — | server failed to start | | | | | | | |"
			tail -5 "$T/$store.start.log" >&2
			continue
		fi
		started+=("$(basename "$script" .sh):$dir")
		uri=$(cat "$dir/uri")
		extra=(--server-script "$script" --server-dir "$dir")
	fi
	for fault in $faults; do
		for fencing in on off; do
			out=$T/$store-$fault-$fencing.json
			echo "  $store $fault fencing $fencing" >&2
			"$DLOCK" --store "$uri" --json check --clients 3 --duration "$dur" --ttl "$ttl" --hold "$hold" \
				--faults "$fault" --fencing "$fencing" --seed "$seed" "${extra[@]}" >"$out" 2>"$out.err"
			rc=$?
			if [ ! -s "$out" ]; then
				echo "| $store | $fault | $fencing | error: $(head -c 200 "$out.err" | tr '\n|' '  ') | | | | | | | $rc |"
				continue
			fi
			nf=$(grep -o "\"kind\":\"$fault\",[^}]*\"ok\":true" "$out" | wc -l)
			echo "| $store | $fault ×$nf | $fencing | $(field grants "$out") | $(field overlaps "$out") | $(field overlaps_after_pause "$out") | $(field stale_writes_accepted "$out") | $(field lost_updates "$out") | $(field fence_order_violations "$out") | $(field worst_heal_to_grant_ms "$out") | $rc |"
		done
	done
	if [ -n "$script" ]; then
		bash "$script" stop "$dir" >/dev/null 2>&1
	fi
done
