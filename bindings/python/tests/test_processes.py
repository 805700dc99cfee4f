"""Processes: mutual exclusion across processes, and fork()."""
import os
import subprocess
import sys

import pytest

import dlock

WORKERS = 4
ROUNDS = 15


def test_mutual_exclusion_across_processes(uri, name, tmp_path):
    counter = tmp_path / "counter"
    counter.write_text("0 0")
    worker = os.path.join(os.path.dirname(__file__), "counter_worker.py")
    procs = [subprocess.Popen([sys.executable, worker, uri, name, str(counter), str(ROUNDS)])
             for _ in range(WORKERS)]
    codes = [p.wait(timeout=300) for p in procs]
    assert codes == [0] * WORKERS
    count, fence = (int(x) for x in counter.read_text().split())
    assert count == WORKERS * ROUNDS
    assert fence > 0


def test_fork_child_is_not_the_holder(uri, store, name):
    lock = store.lock(name, ttl=10)
    assert lock.acquire(0)
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the inherited handles refuse, a new store works
        os.close(rd)
        verdict = b"ok"
        try:
            if lock.held or lock.fence != 0:
                verdict = b"child sees the parent's hold"
            try:
                lock.release()
                verdict = b"child released the parent's lock"
            except dlock.InvalidError as e:
                if "fork" not in str(e):
                    verdict = b"no word of fork: " + str(e).encode()
            with dlock.Store(uri) as mine:  # store.uri hides the password
                if mine.lock(name).acquire(0):
                    verdict = b"child acquired a lock its parent holds"
        except BaseException as e:  # noqa: BLE001 - report anything to the parent
            verdict = repr(e).encode()
        os.write(wr, verdict)
        os._exit(0)
    os.close(wr)
    with os.fdopen(rd, "rb") as f:
        verdict = f.read().decode()
    os.waitpid(pid, 0)
    assert verdict == "ok"
    assert lock.held
    lock.release()
