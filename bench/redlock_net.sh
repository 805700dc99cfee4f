#!/usr/bin/env bash
# Redlock over a network delay, not over two shared cores: each master
# behind its own route of the fault proxy in delay mode (DELAY ms each way,
# default 1: a LAN/AZ round trip of 2 ms), acquire and release latency for
# 1 (redis://), 3 and 5 masters through the same delay, then 5 (and 3)
# masters with one of them SLOW ms each way (default 10: a far zone). Prints p50
# and p99 of acquire and of release (µs), pairs/s and the client's CPU per
# pair, and the ratios to one master (redis://: Redlock needs 3 or more).
#
#   bench/redlock_net.sh BUILD_DIR [SECONDS] [DELAY_MS] [SLOW_MS]
#
# Starts five redis-servers (tests/servers/redis.sh) and the proxy
# (BUILD_DIR/tests/servers/faultproxy) on loopback, stops them at the end.
# How this differs from a real network: the delay is added per chunk by one
# proxy thread on this machine (no loss, no jitter beyond scheduling, no
# bandwidth limit), and the servers, the proxy and the client share 2 cores.
set -euo pipefail
build=${1:?usage: redlock_net.sh BUILD_DIR [SECONDS] [DELAY_MS] [SLOW_MS]}
secs=${2:-5}
delay=${3:-1}
slow=${4:-10}
root=$(cd "$(dirname "$0")/.." && pwd)
dlock=$build/src/cli/dlock
proxy=$build/tests/servers/faultproxy
work=$(mktemp -d)
ppid_=""
trap '[ -n "$ppid_" ] && kill "$ppid_" 2>/dev/null; bash "$root/tests/servers/redis.sh" stop "$work/r" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
bash "$root/tests/servers/redis.sh" start "$work/r" 5 >/dev/null
IFS=, read -ra hosts <<<"$(sed 's|^redlock://||' "$work/r/uri")"
"$proxy" "$work/ctl" "${hosts[@]}" >"$work/proxy.out" 2>&1 &
ppid_=$!
for _ in $(seq 1 100); do grep -q ready "$work/proxy.out" 2>/dev/null && break; sleep 0.05; done
mapfile -t ports < <(grep -v ready "$work/proxy.out" | grep -oE '[0-9]+$')
[ "${#ports[@]}" -eq 5 ] || { echo "the proxy did not start: $(cat "$work/proxy.out")" >&2; exit 1; }

ctl() { # COMMAND: one line to the proxy's control socket, its reply checked
	python3 - "$work/ctl" "$1" <<'EOF'
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall((sys.argv[2] + "\n").encode())
r = s.makefile().readline()
sys.exit(0 if r.startswith("ok") else f"proxy: {r}")
EOF
}

uri_of() { # N [scheme]: the first N proxied masters
	local n=$1 scheme=${2:-redlock} list="" i
	for ((i = 0; i < n; i++)); do list+="${list:+,}127.0.0.1:${ports[i]}"; done
	echo "$scheme://$list"
}

declare -A p50 p99 r50 r99 rate cpu
measure() { # LABEL URI
	local out
	out=$("$dlock" --store "$2" --json bench --workload uncontended --duration "${secs}s" --no-baseline)
	read -r p50["$1"] p99["$1"] r50["$1"] r99["$1"] rate["$1"] cpu["$1"] < <(python3 -c '
import json, sys
d = json.loads(sys.argv[1])
print(d["latency_us"]["p50"], d["latency_us"]["p99"], d["release_latency_us"]["p50"],
      d["release_latency_us"]["p99"], d["rate"], d["cpu_s_per_1000"] * 1000)' "$out")
}

ctl "delay $delay"
for round in 1 2; do
	measure "redis://, 1 master" "$(uri_of 1 redis)"
	measure "redlock, 3 masters" "$(uri_of 3)"
	measure "redlock, 5 masters" "$(uri_of 5)"
done
ctl "delay $slow 4" # the fifth master in a far zone
measure "5 masters, 1 far" "$(uri_of 5)"
ctl "delay $slow 2" # the third too: 3 masters with one far
ctl "delay $delay 4"
measure "3 masters, 1 far" "$(uri_of 3)"

base="redis://, 1 master"
printf '%s ms each way (far: %s ms); %ss per run; load %s\n' "$delay" "$slow" "$secs" "$(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-20s %9s %9s %9s %9s %9s %12s %14s\n' "" "acq p50" "acq p99" "rel p50" "rel p99" "pairs/s" "CPU us/pair" "p50 / p99 x"
for k in "redis://, 1 master" "redlock, 3 masters" "redlock, 5 masters" "5 masters, 1 far" "3 masters, 1 far"; do
	python3 -c '
import sys
k, a50, a99, r50, r99, rate, cpu, b50, b99 = sys.argv[1], *map(float, sys.argv[2:])
print(f"{k:20} {a50:9.0f} {a99:9.0f} {r50:9.0f} {r99:9.0f} {rate:9.0f} {cpu:12.1f} {a50 / b50:6.2f} / {a99 / b99:5.2f}")' \
		"$k" "${p50[$k]}" "${p99[$k]}" "${r50[$k]}" "${r99[$k]}" "${rate[$k]}" "${cpu[$k]}" "${p50[$base]}" "${p99[$base]}"
done
