"""The access-token race that `dlock demo` tells, in Python.

Worker processes send messages through a stand-in for an API that needs an
access token (shared memory): fetching a token invalidates the previous one,
and a token expires after USES messages. First the workers refresh the
shared token without a lock (messages sent with a token another worker just
replaced are rejected as stale), then under a dlock lock (none are).

    PYTHONPATH=build/bindings/python python3 bindings/python/examples/token_refresh.py [URI]
"""
import multiprocessing as mp
import sys
import time

import dlock

WORKERS, MESSAGES, USES, LATENCY = 5, 40, 20, 0.02
MAX_TOKENS = 4096


def send(api, token):
    """'ok', 'expired' (refresh and retry) or 'stale' (replaced too early)."""
    with api["mu"]:
        if token == api["current"].value:
            if api["uses"].value >= USES:
                return "expired"
            api["uses"].value += 1
            return "ok"
        return "expired" if api["expired"][token] else "stale"


def refresh(api, token):
    fresh = api["cache"].value
    if fresh != token:  # someone refreshed since we read it: use theirs
        return fresh
    time.sleep(LATENCY)  # the API's latency
    with api["mu"]:
        old = api["current"].value
        api["expired"][old] = api["uses"].value >= USES
        api["current"].value = old + 1
        api["uses"].value = 0
        api["cache"].value = old + 1
        api["fetches"].value += 1
        return old + 1


def worker(uri, locked, api):
    # The store is opened in the worker, after the fork (docs/python.md).
    store = dlock.Store(uri) if locked else None
    lock = store.lock("dlock-demo/py-token-refresh", ttl=10, wait=60) if locked else None
    api["start"].wait()
    token = api["cache"].value
    for _ in range(MESSAGES):
        while True:
            r = send(api, token)
            if r == "ok":
                time.sleep(0.002)  # the message's own work
                break
            if r == "stale":
                with api["mu"]:
                    api["stale"].value += 1
            if lock:
                with lock:
                    token = refresh(api, token)
            else:
                token = refresh(api, token)
    if store:
        store.close()


def phase(uri, locked):
    ctx = mp.get_context("fork")
    api = {"mu": ctx.Lock(), "start": ctx.Event(), "expired": ctx.Array("b", MAX_TOKENS, lock=False)}
    for k in ("current", "uses", "cache", "fetches", "stale"):
        api[k] = ctx.Value("q", 1 if k in ("current", "cache") else 0, lock=False)
    procs = [ctx.Process(target=worker, args=(uri, locked, api)) for _ in range(WORKERS)]
    for p in procs:
        p.start()
    time.sleep(0.2)
    api["start"].set()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            sys.exit("a worker failed")
    return api["stale"].value, api["fetches"].value


def main():
    uri = sys.argv[1] if len(sys.argv) > 1 else None
    unlocked = phase(uri, False)
    locked = phase(uri, True)
    print("without a lock: %d messages rejected for a stale token, %d fetches" % unlocked)
    print("under dlock:    %d messages rejected for a stale token, %d fetches" % locked)
    ok = locked[0] == 0
    print("verdict: " + ("the lock prevented every stale-token failure" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
