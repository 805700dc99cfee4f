#!/usr/bin/env bash
# CPU accounting for Redlock on N masters against one Redis master: per
# acquire+release pair, the elapsed time, the client's CPU and all servers'
# CPU (utime+stime from /proc/PID/stat). On a machine with C cores a pair
# cannot take less than (client + servers CPU) / C, however parallel the
# requests are: that lower bound is what the 5-vs-1 latency target meets on
# a small machine.
#
#   bench/redlock_cpu.sh DLOCK_BINARY [SECONDS]
#
# Starts one redis-server and five masters (tests/servers/redis.sh, free
# loopback ports, temp dirs), runs `dlock bench --workload uncontended`
# against each twice, alternating, and stops them. Benchmark only.
set -euo pipefail
dlock=${1:?usage: redlock_cpu.sh DLOCK_BINARY [SECONDS]}
secs=${2:-5}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'bash "$root/tests/servers/redis.sh" stop "$work/one" >/dev/null 2>&1 || true;
      bash "$root/tests/servers/redis.sh" stop "$work/five" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
bash "$root/tests/servers/redis.sh" start "$work/one" 1 >/dev/null
bash "$root/tests/servers/redis.sh" start "$work/five" 5 >/dev/null
hz=$(getconf CLK_TCK)

ticks() { # PID... -> utime+stime in clock ticks, summed
	local t=0 p f
	for p in "$@"; do
		read -ra f <"/proc/$p/stat"
		t=$((t + f[13] + f[14]))
	done
	echo "$t"
}

measure() { # LABEL DIR
	local uri pids t0 t1 out
	uri=$(cat "$2/uri")
	pids=$(cat "$2"/*/redis.pid)
	# shellcheck disable=SC2086
	t0=$(ticks $pids)
	out=$("$dlock" --store "$uri" --json bench --workload uncontended --duration "${secs}s" --no-baseline)
	# shellcheck disable=SC2086
	t1=$(ticks $pids)
	python3 - "$1" "$out" $((t1 - t0)) "$hz" "$(nproc)" <<'EOF'
import json, sys
label, d, ticks, hz, cores = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
ops = d["ops"]
el = d["duration_s"] / ops * 1e6
cli = d["cpu_s_per_1000"] / 1000 * 1e6
srv = ticks / hz / ops * 1e6
print(f"{label:10} {d['rate']:8.0f} pairs/s  {el:7.1f} us/pair elapsed  CPU us/pair: client {cli:6.1f}"
      f"  servers {srv:6.1f}  total {cli + srv:6.1f}  -> >= {(cli + srv) / cores:6.1f} us on {cores} cores")
EOF
}

for _ in 1 2; do
	measure "1 master" "$work/one"
	measure "5 masters" "$work/five"
done
