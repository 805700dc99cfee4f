#!/bin/bash
# `dlock bench` on the embedded SQLite store: every workload prints its table
# and valid JSON with the fields docs/performance.md documents, and bad usage
# is refused with exit 64. Functional only: no figure is asserted, so the
# machine's load cannot make it flaky.
. "$(dirname "$0")/lib.sh" "$@"
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
S="sqlite://$T/bench.db"

expect_rc 0 "uncontended table" "$DLOCK" --store "$S" bench --duration 1s
check "table has pairs/s, the floor ratio and latencies: $(cat "$T/out")" \
	grep -q 'pairs/s' "$T/out"
check "table shows the floor" grep -q 'floor, iterations/s .*ratio' "$T/out"
check "table shows latency percentiles" grep -q 'p50 .* p99 .* max' "$T/out"

# The floor comes from a module (dlock-floor.so next to dlock): without it the
# bench still runs and says why it has no floor.
DLOCK_FLOOR_MODULE=$T/no-such-module.so expect_rc 0 "without the floor module" "$DLOCK" --store "$S" bench --duration 300ms
check "says the floor module is missing: $(grep floor "$T/out")" grep -q 'floor  *none: no floor module (.*no-such-module.so' "$T/out"

expect_rc 0 "uncontended --json" "$DLOCK" --store "$S" --json bench --duration 1s
check "uncontended JSON: $(head -c 600 "$T/out")" "$PY" -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["store"] == "sqlite" and d["workload"] == "uncontended" and d["clients"] == 1, d
assert d["ops"] > 0 and d["rate"] > 0, d
l = d["latency_us"]
assert 0 <= l["p50"] <= l["p90"] <= l["p99"] <= l["max"], l
assert d["share"]["jain"] == 1.0, d["share"]
b = d["baseline"]
assert b["rate"] > 0 and b["ratio"] > 0 and "BEGIN IMMEDIATE" in b["what"], b
' "$T/out"

expect_rc 0 "contended --json" "$DLOCK" --store "$S" --json bench --workload contended --clients 3 --duration 1s
check "contended JSON: $(head -c 600 "$T/out")" "$PY" -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["workload"] == "contended" and d["clients"] == 3 and d["hold_ms"] == 1, d
assert d["ops"] > 0 and 0 < d["share"]["jain"] <= 1, d
h = d["handoff"]
assert 0 <= h["count"] <= d["ops"] and h["gap_mean_ms"] >= 0 and h["gap_p99_ms"] <= h["gap_max_ms"], h
assert d["baseline"]["ideal_grants"] > 0, d["baseline"]
# --duration is the measured time: the ops counted over it match the rate
assert d["duration_s"] == 1.0 and abs(d["ops"] / d["rate"] - 1.0) < 0.1, (d["ops"], d["rate"])
' "$T/out"
# and the run lasts that long (measuring, plus set-up), not a multiple of it
t0=$(date +%s%N)
expect_rc 0 "contended --duration 2s" "$DLOCK" --store "$S" --json bench --workload contended --clients 3 --duration 2s --no-baseline
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
check "--duration 2s took $ms ms" test "$ms" -ge 2000 -a "$ms" -lt 8000

expect_rc 0 "reentrant --json" "$DLOCK" --store "$S" --json bench --workload reentrant --duration 1s
check "reentrant JSON: $(head -c 400 "$T/out")" "$PY" -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["workload"] == "reentrant" and d["rate"] > 0, d
' "$T/out"

expect_rc 0 "renewal --json" "$DLOCK" --store "$S" --json bench --workload renewal --locks 50 --ttl 600ms --duration 1s
check "renewal JSON: nothing lost, ticks counted: $(head -c 400 "$T/out")" "$PY" -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["workload"] == "renewal" and d["ops"] == 50 and d["lost"] == 0 and d["ticks"] > 0, d
' "$T/out"
check "bench left no lock held" sh -c "! '$DLOCK' --store '$S' status 2>/dev/null | grep -q dlock-bench"

expect_rc 64 "unknown workload" "$DLOCK" --store "$S" bench --workload nope
check "unknown workload is named" grep -q "unknown 'nope'" "$T/err"
expect_rc 64 "zero clients" "$DLOCK" --store "$S" bench --clients 0
expect_rc 64 "renewal with clients" "$DLOCK" --store "$S" bench --workload renewal --clients 2
expect_rc 64 "stray argument" "$DLOCK" --store "$S" bench extra
expect_rc 0 "help" "$DLOCK" bench --help
check "help lists the workloads" grep -q 'contended' "$T/out"
finish
