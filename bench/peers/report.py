#!/usr/bin/python3
"""Write docs/performance.md and docs/performance.svg from one bench/run-all
run (the JSON of `dlock bench --json` and of stats.py, one file per
STORE.WHO.TAG.json).

    report.py RESULTS OUTDIR COMMAND ELAPSED_S BUILD_DIR

Every number in the output comes from that one run; targets (issue 9) are
checked here and marked met / NOT met with the shortfall.
"""
import datetime
import glob
import json
import math
import os
import platform
import subprocess
import sys

STORES = ["sqlite", "redis", "redlock", "etcd", "zookeeper", "postgres", "mysql", "memcached"]
PEERS = {
    "redis": ["redis-py", "redlock", "redis-semaphore"],
    "redlock": ["redlock"],
    "etcd": ["etcd3", "etcdctl"],
    "zookeeper": ["curator", "kazoo"],
    "postgres": ["psycopg2"],
}
PEER_NAMES = {
    "redis-py": "redis-py `Lock` (python3-redis)",
    "redlock": "npm `redlock` (ioredis)",
    "redis-semaphore": "npm `redis-semaphore` `Mutex`",
    "etcd3": "python3-etcd3 `Lock`",
    "etcdctl": "`etcdctl lock NAME true` (a process per pair)",
    "curator": "Apache Curator `InterProcessMutex`",
    "kazoo": "python3-kazoo `Lock`",
    "psycopg2": "psycopg2 `pg_advisory_lock` / `pg_advisory_unlock`",
}


def load(results):
    """{(store, who, tag): result}. Repeated rounds (TAG.rN) collapse to the
    median round by rate, which keeps that round's other figures with it."""
    r, rounds = {}, {}
    for f in glob.glob(os.path.join(results, "*.json")):
        store, who, tag = os.path.basename(f)[:-5].split(".", 2)
        try:
            d = json.load(open(f))
        except ValueError:
            d = {"error": open(f).read()[-300:]}
        if ".r" in tag:
            tag = tag.split(".r")[0]
            rounds.setdefault((store, who, tag), []).append(d)
        else:
            r[(store, who, tag)] = d
    for k, ds in rounds.items():
        good = sorted((d for d in ds if "error" not in d), key=lambda d: d["rate"])
        if good:
            med = dict(good[(len(good) - 1) // 2])
            med["rounds"] = [round(d["rate"], 1) for d in good]
            med["round_ratios"] = [d["rate"] / d["baseline"]["rate"] for d in good
                                   if (d.get("baseline") or {}).get("rate")]
            r[k] = med
        else:
            r[k] = ds[-1]
    return r


def num(x, nd=0):
    if x is None:
        return "–"
    if isinstance(x, float) and math.isnan(x):
        return "–"
    return f"{x:,.{nd}f}"


def ok(d):
    return d is not None and "error" not in d


def cell_err(d):
    if not d:
        return "not run"
    lines = d["error"].strip().splitlines() or ["?"]
    # The exception's own line says more than the harness's exit line.
    errs = [x for x in lines if "Error:" in x or "error:" in x]
    return "failed: " + (errs or lines)[-1].strip()[:160].replace("|", "/")


def machine():
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "?"
    try:
        kb = int(open("/proc/meminfo").readline().split()[1])
        mem = f"{kb / 1048576:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    osr = "?"
    try:
        osr = dict(line.rstrip().split("=", 1) for line in open("/etc/os-release") if "=" in line)["PRETTY_NAME"].strip('"')
    except (OSError, KeyError):
        pass
    return f"{cpu}, {os.cpu_count()} cores, {mem} RAM, {osr}, Linux {platform.release()}"


def versions():
    v = []
    for cmd in (["redis-server", "--version"], ["etcd", "--version"], ["psql", "--version"],
                ["mariadb", "--version"], ["memcached", "-V"], ["node", "--version"], ["java", "-version"]):
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
            v.append((p.stdout or p.stderr).strip().splitlines()[0])
        except (OSError, IndexError, subprocess.TimeoutExpired):
            pass
    return v


def check(cond, text, short=""):
    if cond is None:
        return f"| {text} | not measured |"
    return f"| {text} | {'met' if cond else 'NOT met'}{(' — ' + short) if short else ''} |"


def store_section(store, R, out, targets, chart):
    rows = [k for k in R if k[0] == store]
    if not rows:
        return
    g = lambda who, tag: R.get((store, who, tag))
    u, c, cf = g("dlock", "uncontended"), g("dlock", "contended"), g("dlock", "contended-fair")
    out.append(f"\n## {store}\n")
    if ok(u):
        out.append(f"Server: `{u.get('uri', '')}`.\n")
    out.append("| | uncontended pairs/s | × floor | acquire p50 / p99 µs | CPU s / 1000 | "
               "contended grants/s | Jain | handoffs | gap mean / p99 ms | out of order |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    floor = u["baseline"]["rate"] if ok(u) and u.get("baseline") and u["baseline"].get("rate") else None
    ideal = c["baseline"].get("ideal_grants") if ok(c) and c.get("baseline") else None

    def line(label, du, dc):
        cells = [label]
        if ok(du):
            spread = (f" ({num(min(du['rounds']))}–{num(max(du['rounds']))})"
                      if len(du.get("rounds", [])) > 1 else "")
            b = du.get("baseline") or {}
            fl = b.get("rate") if b.get("rate") and label.startswith("**dlock") else floor  # its own run's floor
            cells += [num(du["rate"]) + spread, num(du["rate"] / fl, 2) if fl else "–",
                      f"{num(du['latency_us']['p50'])} / {num(du['latency_us']['p99'])}",
                      num(du.get("cpu_s_per_1000"), 3)]
        else:
            cells += [cell_err(du) if du else "–", "", "", ""]
        if ok(dc):
            h = dc.get("handoff", {})
            cells += [num(dc["rate"]), num(dc["share"]["jain"], 3), f"{100 * h.get('fraction', 0):.0f}%",
                      f"{num(h.get('gap_mean_ms'), 2)} / {num(h.get('gap_p99_ms'), 2)}",
                      str(dc.get("order_inversions", "–"))
                      + (f" ({dc['stalled_clients']} client(s) stalled)" if dc.get("stalled_clients") else "")]
        else:
            cells += [cell_err(dc) if dc else "–", "", "", "", ""]
        out.append("| " + " | ".join(cells) + " |")

    line("**dlock**", u, c)
    up = g("dlock-pipelined", "uncontended")
    if up:
        line("**dlock** `release=pipelined`", up, None)
    ua, uac = g("dlock-advisory", "uncontended"), g("dlock-advisory", "contended")
    if ua or uac:
        line("**dlock** `mode=advisory`", ua, uac)
    if cf:
        line("**dlock** `--fair`", None, cf)
    for p in PEERS.get(store, []):
        pu, pc = g(p, "uncontended"), g(p, "contended")
        if pu or pc:
            line(PEER_NAMES[p], pu, pc)
    if floor:
        out.append(f"| floor: {u['baseline']['what']} | {num(floor)} | 1.00 | | "
                   f"{num(u['baseline'].get('cpu_s_per_1000'), 3)} | "
                   f"{'ideal ' + num(ideal) if ideal else ''} | | | | |")
    elif ok(u) and u.get("baseline"):
        out.append(f"| floor | none: {u['baseline'].get('why', '')} | | | | | | | | |")
    out.append("")
    if ok(u) and u.get("context_switches_per_op") is not None:
        b = u.get("baseline") or {}

        def vs(key, digits=2):
            own = f"**{u[key]:.{digits}f}**"
            return own + (f" (floor {b[key]:.{digits}f})" if b.get(key) is not None else "")
        parts = [vs("context_switches_per_op") + " context switches of the client process"]
        if u.get("server_commands_per_op") is not None:
            parts.append(vs("server_commands_per_op") + " commands received by the server")
        if b.get("cpu_s_per_1000"):
            parts.append(f"client CPU **{u['cpu_s_per_1000'] / b['cpu_s_per_1000']:.2f} ×** the floor's")
        out.append("Per uncontended pair (dlock, counted in the same run): " + ", ".join(parts) + ".  ")
    re_, rn = g("dlock", "reentrant"), g("dlock", "renewal")
    if ok(re_):
        out.append(f"Reentrant re-acquire: **{num(re_['rate'] / 1e6, 1)} million/s** on one thread "
                   f"({num(re_['cpu_s_per_1000'] * 1e9 / 1000, 0)} ns CPU each).  ")
    elif re_:
        out.append(f"Reentrant: {cell_err(re_)}  ")
    if ok(rn):
        so = rn.get("server_reads_per_tick", -1)
        out.append(f"Renewal: {num(rn['ops'])} locks held by one process (acquired in {rn['acquire_all_s']:.1f} s), "
                   f"TTL 3 s, {rn['ticks']:.0f} renewal ticks in {rn['duration_s']:.0f} s: "
                   f"**{rn['cpu_ms_per_tick']:.1f} ms CPU per tick**"
                   + (f", **{so:.1f} server socket reads (≈ round trips) per tick**" if so is not None and so >= 0 else "")
                   + (f", **{rn['script_calls_per_tick']:.2f} script calls (requests) per tick**"
                      if rn.get("script_calls_per_tick", -1) >= 0 else "")
                   + f", {rn['lost']} lost.")
    elif rn:
        out.append(f"Renewal: {cell_err(rn)}")
    out.append("")

    # chart rows: (store, who, uncontended rate, contended rate)
    extra = [("dlock-pipelined", up, None)] if up else []
    for who, du, dc in [("dlock", u, c)] + extra + [(p, g(p, "uncontended"), g(p, "contended")) for p in PEERS.get(store, [])]:
        chart.append((store, who, du["rate"] if ok(du) else None, dc["rate"] if ok(dc) else None))
    if floor:
        chart.append((store, "floor", floor, ideal))

    # targets
    def best(tag, peers):
        v = [(R[(store, p, tag)]["rate"], p) for p in peers if ok(R.get((store, p, tag)))]
        return max(v) if v else (None, None)

    if store == "redis":
        if ok(u) and floor:
            ratio = u["rate"] / floor
            targets.append(check(ratio >= 0.95, "Redis uncontended ≥ 0.95 × 2×PING floor", f"{ratio:.2f}"))
            if ok(up):
                pf = (up.get("baseline") or {}).get("rate") or floor
                targets.append(check(up["rate"] >= 0.95 * pf,
                                     "Redis uncontended, `release=pipelined`, ≥ 0.95 × 2×PING floor",
                                     f"{up['rate'] / pf:.2f}"))
            b, who = best("uncontended", PEERS["redis"])
            if b:
                targets.append(check(u["rate"] >= b, f"Redis uncontended ≥ fastest peer ({who})",
                                     f"{u['rate'] / b:.2f} ×"))
                top = up if ok(up) and up["rate"] > u["rate"] else u
                targets.append(check(top["rate"] >= 1.5 * b, "stretch: Redis uncontended"
                                     + (", `release=pipelined`," if top is up else "") + " ≥ 1.5 × fastest peer",
                                     f"{top['rate'] / b:.2f} ×"))
        if ok(c):
            rp = g("redis-py", "contended")
            if ok(rp):
                targets.append(check(c["rate"] >= 2 * rp["rate"], "Redis contended ≥ 2 × redis-py",
                                     f"{c['rate'] / rp['rate']:.2f} ×"))
            b, who = best("contended", ["redlock", "redis-semaphore"])
            if b:
                targets.append(check(c["rate"] >= b, f"Redis contended ≥ best npm peer ({who})",
                                     f"{c['rate'] / b:.2f} ×"))
            targets.append(check(c["share"]["jain"] >= 0.95, "Redis contended Jain ≥ 0.95",
                                 f"{c['share']['jain']:.3f}"))
            targets.append(check(c["handoff"]["gap_mean_ms"] <= 0.5, "Redis contended mean handoff gap ≤ 0.5 ms",
                                 f"{c['handoff']['gap_mean_ms']:.2f} ms"))
        if ok(cf):
            targets.append(check(cf["order_inversions"] == 0, "Redis `--fair`: grants in request order",
                                 f"{cf['order_inversions']} out of order"))
            targets.append(check(cf["handoff"]["gap_p99_ms"] <= 2, "Redis `--fair`: p99 handoff gap ≤ 2 ms",
                                 f"{cf['handoff']['gap_p99_ms']:.2f} ms"))
    if store == "etcd":
        if ok(u):
            for p in ("etcdctl", "etcd3"):
                d = g(p, "uncontended")
                if ok(d):
                    targets.append(check(u["rate"] > d["rate"], f"etcd faster than {p}", f"{u['rate'] / d['rate']:.2f} ×"))
            if floor:
                t = floor / u["rate"]
                targets.append(check(t <= 1.3, "etcd acquire+release ≤ 1.3 × Txn+DeleteRange time", f"{t:.2f} ×"))
        if ok(c):
            targets.append(check(c["handoff"]["gap_mean_ms"] <= 3, "etcd contended handoff gap ≤ 3 ms (mean)",
                                 f"{c['handoff']['gap_mean_ms']:.2f} ms"))
    if store == "zookeeper" and ok(u):
        for p, f in (("curator", 1.0), ("kazoo", 1.3)):
            d = g(p, "uncontended")
            if ok(d):
                targets.append(check(u["rate"] >= f * d["rate"], f"ZooKeeper ≥ {f:g} × {p}",
                                     f"{u['rate'] / d['rate']:.2f} ×"))
    if store in ("sqlite", "mysql") and ok(u) and floor:
        targets.append(check(u["rate"] >= 0.8 * floor, f"{store} ≥ 0.8 × its floor", f"{u['rate'] / floor:.2f}"))
    if store == "postgres" and floor:
        # Every round, each against its own run's floor.
        for who, f, what in (("dlock", 0.45, "table mode"), ("dlock-advisory", 0.8, "advisory mode")):
            d = g(who, "uncontended")
            if ok(d):
                rs = d.get("round_ratios") or [d["rate"] / ((d.get("baseline") or {}).get("rate") or floor)]
                targets.append(check(min(rs) >= f, f"PostgreSQL {what} ≥ {f:g} × 2 × SELECT 1 (every round)",
                                     f"{min(rs):.2f}" + (f"–{max(rs):.2f}" if len(rs) > 1 else "")))
    if store == "postgres" and ok(c):
        targets.append(check(c["handoff"]["gap_mean_ms"] <= 3, "PostgreSQL contended handoff gap ≤ 3 ms (mean)",
                             f"{c['handoff']['gap_mean_ms']:.2f} ms"))
    if ok(re_):
        targets.append(check(re_["rate"] >= 5e6, f"{store}: reentrant ≥ 5 million/s", f"{re_['rate'] / 1e6:.1f} M/s"))


def svg(chart, path):
    """Two panels: uncontended pairs/s and contended grants/s, one bar per
    library, grouped by store; each store's bars are scaled to its largest."""
    stores = []
    for s, *_ in chart:
        if s not in stores:
            stores.append(s)
    rowh, pad, left, width = 16, 10, 150, 300
    colors = {"dlock": "#2b6cb0", "dlock-pipelined": "#63b3ed", "floor": "#a0aec0"}
    height = 40 + sum(pad + 18 + rowh * sum(1 for c in chart if c[0] == s) for s in stores)
    W = left + 2 * (width + 110)
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" font-family="sans-serif" font-size="11">',
         '<rect width="100%" height="100%" fill="white"/>',
         f'<text x="{left}" y="16" font-weight="bold">uncontended acquire+release pairs/s</text>',
         f'<text x="{left + width + 110}" y="16" font-weight="bold">contended grants/s (8 clients; floor row: ideal)</text>']
    y = 30
    for s in stores:
        y += pad
        o.append(f'<text x="4" y="{y + 12}" font-weight="bold">{s}</text>')
        y += 18
        rows = [c for c in chart if c[0] == s]
        for panel in (0, 1):
            m = max([r[2 + panel] or 0 for r in rows] + [1])
            yy = y
            for _, who, *vals in rows:
                v = vals[panel]
                x0 = left + panel * (width + 110)
                if panel == 0:
                    o.append(f'<text x="{left - 6}" y="{yy + 11}" text-anchor="end">{who}</text>')
                if v:
                    w = max(1, int(width * v / m))
                    o.append(f'<rect x="{x0}" y="{yy + 2}" width="{w}" height="{rowh - 4}" '
                             f'fill="{colors.get(who, "#ed8936")}"/>')
                    o.append(f'<text x="{x0 + w + 4}" y="{yy + 11}">{v:,.0f}</text>')
                else:
                    o.append(f'<text x="{x0}" y="{yy + 11}" fill="#888">–</text>')
                yy += rowh
        y += rowh * len(rows)
    o.append("</svg>")
    open(path, "w").write("\n".join(o) + "\n")


def main():
    results, outdir, command, elapsed, build = sys.argv[1:6]
    R = load(results)
    load_avgs = [d["load"][0] for d in R.values() if isinstance(d, dict) and "load" in d]
    out = ["# dlock performance", "",
           "Generated by `bench/run-all`; every number below comes from one run on one machine, "
           "dlock and its peers against the same fresh servers (loopback), one after another. "
           "Do not compare numbers across runs or machines; compare ratios within a table.", "",
           f"- Date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
           f"- Command: `{command}` ({int(elapsed) // 60} min {int(elapsed) % 60} s)",
           f"- Machine: {machine()}",
           f"- Load average (1 min) during the runs: {min(load_avgs):.1f}–{max(load_avgs):.1f}"
           if load_avgs else "- Load average: unknown",
           f"- Servers and runtimes: {'; '.join(versions())}",
           f"- dlock build: RelWithDebInfo (`-O2 -g`) in `{os.path.relpath(build, os.getcwd()) if build.startswith(os.getcwd()) else build}`",
           "", "![chart](performance.svg)", "",
           "## How to read this", "",
           "- **uncontended**: 1 client process, acquire+release of its own name in a loop; where "
           "there are peers, dlock and the peers take turns for `--rounds` rounds and the median "
           "round is shown, the range of all rounds in brackets. dlock "
           "alternates 100 ms slices with the **floor** (the store's own cost for the same round "
           "trips through its client library: Redis 2×PING, etcd Txn+DeleteRange, ZooKeeper "
           "create+delete, PostgreSQL 2×`SELECT 1`, MariaDB 2×`DO 1`, SQLite 2×`BEGIN IMMEDIATE`/`COMMIT`) "
           "in the same process (the tool loads them from `dlock-floor.so`, bench/floor.c, so that it "
           "links no store client library itself), so load from elsewhere hits both alike; **× floor** "
           "is the ratio.",
           "- **contended**: 8 client processes on one name, each looping acquire → hold 1 ms → "
           "release → think 1 ms. **Jain** is Jain's fairness index over per-client grants (1 = "
           "equal). A **handoff** is a grant to a different client that was already waiting when "
           "the previous holder called release; the **gap** runs from that release call to the new "
           "holder's acquire returning (CLOCK_MONOTONIC, one machine). **Out of order**: "
           "consecutive grants where the later one was requested > 0.1 ms earlier. The floor row's "
           "contended figure is the ideal 1 / (hold + one floor iteration).",
           "- Peers use their documented defaults (polling intervals included); only give-up "
           "timeouts are raised so that nothing fails during a run. Curator clients are threads "
           "with a session each; the other peers' clients are processes.",
           "- CPU is the client process's own (user + system), per 1000 acquire+release pairs; "
           "server CPU is not included.", ""]
    targets = ["| target (issues 9 and 17) | this run |", "|---|---|"]
    chart = []
    for s in STORES:
        store_section(s, R, out, targets, chart)
    out += ["## Targets", ""] + targets + [""]
    os.makedirs(outdir, exist_ok=True)
    svg(chart, os.path.join(outdir, "performance.svg"))
    notes = os.path.join(os.path.dirname(os.path.abspath(__file__)), "analysis.md")
    if os.path.exists(notes):
        out += [open(notes).read()]
    open(os.path.join(outdir, "performance.md"), "w").write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
