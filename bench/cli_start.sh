#!/usr/bin/env bash
# bench/cli_start.sh — the tool's fixed cost against flock(1), side by side:
# `flock F true`, `dlock --version` and `dlock run x -- true` on the embedded
# store, interleaved N times each (default 200), medians and ratios printed.
# Issue targets: --version <= 5 ms; run <= 2 x flock.
#
#   bench/cli_start.sh [DLOCK] [N]      (DLOCK default: build/src/cli/dlock)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dlock=${1:-$here/../build/src/cli/dlock}
n=${2:-200}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
DLOCK_HOME=$tmp/home python3 - "$dlock" "$n" "$tmp" <<'PY'
import os, statistics, subprocess, sys, time
dlock, n, tmp = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cmds = {
    "flock F true": ["flock", os.path.join(tmp, "f"), "true"],
    "dlock --version": [dlock, "--version"],
    "dlock run x -- true": [dlock, "run", "x", "--", "true"],
}
subprocess.run(cmds["dlock run x -- true"], check=True)  # the store file exists before timing
t = {k: [] for k in cmds}
for _ in range(n):
    for k, c in cmds.items():
        a = time.perf_counter()
        subprocess.run(c, stdout=subprocess.DEVNULL, check=True)
        t[k].append((time.perf_counter() - a) * 1000)
base = statistics.median(t["flock F true"])
for k, v in t.items():
    m = statistics.median(v)
    print(f"{k:22s} median {m:6.2f} ms   x flock {m / base:4.2f}")
PY
