#!/usr/bin/python3
"""Turn a peer's grant logs into the JSON `dlock bench --json` prints, with the
same definitions (src/tools/bench.c summarize()), so peers and dlock are judged
alike.

    stats.py LOGDIR PEER WORKLOAD

LOGDIR holds `window` ("START END" in CLOCK_MONOTONIC ns) and one
`client-N.log` per client: a line per grant, "REQ GOT REL0 REL1" in
CLOCK_MONOTONIC ns (request, acquire returned, release called, release
returned). Python's time.monotonic_ns(), Node's process.hrtime.bigint() and
Java's System.nanoTime() all read CLOCK_MONOTONIC on Linux.
"""
import glob
import json
import math
import os
import sys


def pct(v, p):
    if not v:
        return 0.0
    i = max(0, math.ceil(p * len(v)) - 1)
    return float(v[min(i, len(v) - 1)])


def main():
    logdir, peer, workload = sys.argv[1], sys.argv[2], sys.argv[3]
    start, end = (int(x) for x in open(os.path.join(logdir, "window")).read().split())
    clients = []
    for path in sorted(glob.glob(os.path.join(logdir, "client-*.log"))):
        rows = [tuple(int(x) for x in line.split()) for line in open(path) if line.strip()]
        # Only grants inside the measuring window count (warm-up is outside it).
        clients.append([r for r in rows if start <= r[0] and r[1] <= end])
    if not clients:
        sys.exit("stats.py: no client logs in " + logdir)
    n = [len(c) for c in clients]
    ops = sum(n)
    seconds = (end - start) / 1e9
    allg = sorted(((r, i) for i, c in enumerate(clients) for r in c), key=lambda x: x[0][1])
    lat = sorted(r[1] - r[0] for r, _ in allg)
    gaps = []
    inversions = 0
    for (p, pc), (q, qc) in zip(allg, allg[1:]):
        if qc != pc and q[0] < p[2]:
            gaps.append(q[1] - p[2])
        if q[0] + 100000 < p[0]:
            inversions += 1
    gaps.sort()
    s2 = sum(x * x for x in n)
    out = {
        "peer": peer, "workload": workload, "clients": len(clients),
        "duration_s": round(seconds, 3), "ops": ops, "rate": round(ops / seconds, 1),
        "latency_us": {k: round(pct(lat, q) / 1e3, 1)
                       for k, q in (("p50", .5), ("p90", .9), ("p99", .99), ("max", 1.0))},
        "share": {"min": min(n), "max": max(n),
                  "jain": round(sum(n) ** 2 / (len(n) * s2), 4) if s2 else 0},
        "load": list(os.getloadavg()),
    }
    if workload == "contended":
        out["handoff"] = {
            "count": len(gaps), "fraction": round(len(gaps) / ops, 4) if ops else 0,
            "gap_mean_ms": round(sum(gaps) / len(gaps) / 1e6, 3) if gaps else 0,
            "gap_p50_ms": round(pct(gaps, .5) / 1e6, 3), "gap_p99_ms": round(pct(gaps, .99) / 1e6, 3),
            "gap_max_ms": round(pct(gaps, 1.0) / 1e6, 3)}
        out["order_inversions"] = inversions
    # A client whose acquire never returned before the run ended (pylocks.py).
    out["stalled_clients"] = len(glob.glob(os.path.join(logdir, "stalled-*")))
    # Each client writes cpu-N: its process CPU seconds inside the window.
    cpu = [float(open(f).read()) for f in glob.glob(os.path.join(logdir, "cpu-*"))]
    if cpu and ops:
        out["cpu_s_per_1000"] = round(sum(cpu) / ops * 1000, 5)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
