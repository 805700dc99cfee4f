#!/usr/bin/python3
"""The Python peers on dlock's workloads (docs/performance.md):

    pylocks.py PEER ADDRESS WORKLOAD SECONDS LOGDIR [CLIENTS]

PEER: redis-py (python3-redis Lock; ADDRESS host:port), etcd3 (python3-etcd3
Lock; host:port), etcdctl (`etcdctl lock NAME true`, a process per pair;
uncontended only), kazoo (python3-kazoo Lock; host:port[,...]), psycopg2
(python3-psycopg2: the usual advisory-lock recipe, `SELECT pg_advisory_lock(key)`
and `SELECT pg_advisory_unlock(key)` on an autocommit connection, the key a
CRC-32 of the name; ADDRESS a libpq URI).
WORKLOAD: uncontended (1 client, its own name) or contended (CLIENTS
processes, default 8, on one name: acquire, hold 1 ms, release, think 1 ms).
Each lock is used with its defaults, as its documentation shows it; only
timeouts are raised so that nothing gives up during the run. Writes grant
logs for stats.py. Run with Debian's /usr/bin/python3 (the packages live there).
"""
import multiprocessing as mp
import os
import resource
import sys
import time

HOLD = THINK = 0.001
WAIT = 15  # s: an acquire still waiting this long after the window ends is abandoned


def cpu_s():
    """This client's CPU, with the etcdctl processes it ran (RUSAGE_CHILDREN)."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def make_lock(peer, address, name):
    host, _, port = address.partition(",")[0].rpartition(":")
    if peer == "redis-py":
        import redis
        r = redis.Redis(host=host, port=int(port))
        lk = r.lock(name, timeout=30, blocking_timeout=WAIT)
        return lk.acquire, lk.release
    if peer == "etcd3":
        import etcd3
        lk = etcd3.client(host=host, port=int(port)).lock(name, ttl=30)
        return (lambda: lk.acquire(timeout=WAIT)), lk.release
    if peer == "kazoo":
        from kazoo.client import KazooClient
        zk = KazooClient(hosts=address, timeout=30)
        zk.start()
        lk = zk.Lock("/" + name, "bench")
        return (lambda: lk.acquire(timeout=WAIT)), lk.release
    if peer == "psycopg2":
        import zlib
        import psycopg2
        conn = psycopg2.connect(address)
        conn.autocommit = True
        cur = conn.cursor()
        cur.execute("SET lock_timeout = %s", ("%ds" % WAIT,))
        key = zlib.crc32(name.encode())

        def acquire():
            try:
                cur.execute("SELECT pg_advisory_lock(%s)", (key,))
                return True
            except psycopg2.errors.LockNotAvailable:
                return False

        def release():
            cur.execute("SELECT pg_advisory_unlock(%s)", (key,))
        return acquire, release
    if peer == "etcdctl":
        # A process per lock, as a shell script uses it: `etcdctl lock NAME true`
        # takes the lock, runs `true` while holding it, and releases. The pair
        # cannot be split, so "acquire" does all of it and "release" nothing.
        import subprocess
        cmd = ["etcdctl", "--endpoints=http://" + address.split(",")[0], "lock", name, "true"]
        env = dict(os.environ, ETCDCTL_API="3")

        def run():
            return subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL).returncode == 0
        return run, (lambda: None)
    sys.exit("pylocks.py: unknown peer " + peer)


def client(peer, address, name, contended, start, end, logdir, i, ready):
    # Warm-up (connections, scripts) on a name of its own: contention belongs
    # to the measured window only.
    acquire, release = make_lock(peer, address, "%s-warm-%d" % (name, i))
    for _ in range(20):
        if not acquire():
            sys.exit("%s: warm-up acquire failed" % peer)
        release()
    acquire, release = make_lock(peer, address, name)
    ready.put(i)
    while time.monotonic_ns() < start.value:
        time.sleep(0.001)
    c0 = cpu_s()
    rows = []
    mono = time.monotonic_ns
    while True:
        req = mono()
        if req >= end.value:
            break
        if not acquire():
            if mono() >= end.value:
                # Stuck past the end of the window: its missing grants
                # already count against it; stats.py reports the stall.
                open(os.path.join(logdir, "stalled-%d" % i), "w").close()
                break
            sys.exit("%s: not acquired in %d s" % (peer, WAIT))
        got = mono()
        if contended:
            time.sleep(HOLD)
        rel0 = mono()
        release()
        rows.append((req, got, rel0, mono()))
        if contended:
            time.sleep(THINK)
    with open(os.path.join(logdir, "cpu-%d" % i), "w") as f:
        f.write("%.6f" % (cpu_s() - c0))
    with open(os.path.join(logdir, "client-%d.log" % i), "w") as f:
        f.writelines("%d %d %d %d\n" % r for r in rows)


def main():
    peer, address, workload, seconds, logdir = sys.argv[1:6]
    contended = workload == "contended"
    n = int(sys.argv[6]) if len(sys.argv) > 6 else (8 if contended else 1)
    os.makedirs(logdir, exist_ok=True)
    name = "peer-%s-%d" % (peer, os.getpid())
    ctx = mp.get_context("fork")
    start, end, ready = ctx.Value("q", 1 << 62), ctx.Value("q", 1 << 62), ctx.Queue()
    ps = []
    for i in range(n):
        own = name if contended else "%s-%d" % (name, i)
        ps.append(ctx.Process(target=client, args=(peer, address, own, contended, start, end, logdir, i, ready)))
        ps[-1].start()
    deadline = time.monotonic() + 120
    for _ in ps:
        while True:  # a client that died (an import error, a refused connect) ends the run at once
            try:
                ready.get(timeout=0.5)
                break
            except Exception:
                if time.monotonic() > deadline or any(p.exitcode is not None for p in ps):
                    for p in ps:
                        p.kill()
                    sys.exit("%s: a client did not get ready (see its error above)" % peer)
    t0 = time.monotonic_ns() + 20_000_000
    end.value = t0 + int(float(seconds) * 1e9)
    start.value = t0
    for p in ps:
        p.join()
        if p.exitcode != 0:
            sys.exit("%s: a client failed" % peer)
    with open(os.path.join(logdir, "window"), "w") as f:
        f.write("%d %d\n" % (start.value, end.value))


if __name__ == "__main__":
    main()
