"""Threads: the GIL is released while libdlock waits, and one Lock object is
not used by two threads at once."""
import threading
import time

import pytest

import dlock


def test_gil_released_while_waiting(store, other_store, name):
    holder = store.lock(name, ttl=10)
    assert holder.acquire(0)
    rival = other_store.lock(name)
    result = {}

    def wait():
        t0 = time.monotonic()
        result["acquired"] = rival.acquire(timeout=1.5)
        result["waited"] = time.monotonic() - t0

    t = threading.Thread(target=wait)
    t.start()
    # This thread runs Python the whole time the other waits in libdlock: if
    # the wait kept the GIL, no step would happen until it ended.
    steps, last, gap = 0, time.monotonic(), 0.0
    while t.is_alive():
        now = time.monotonic()
        gap = max(gap, now - last)
        last = now
        steps += 1
        time.sleep(0.001)
    t.join()
    holder.release()
    assert result["acquired"] is False
    assert result["waited"] >= 1.4
    assert steps > 100, steps
    assert gap < 0.75, gap


def test_one_lock_object_one_thread_at_a_time(store, other_store, name):
    holder = store.lock(name, ttl=10)
    assert holder.acquire(0)
    rival = other_store.lock(name)
    got = []

    def wait_then_release():  # a hold belongs to the thread that took it
        got.append(rival.acquire(30))
        if got[-1]:
            rival.release()

    t = threading.Thread(target=wait_then_release)
    t.start()
    # until the thread is inside its acquire (before, a try answers False:
    # the holder has the lock), however slow the machine
    deadline = time.monotonic() + 20
    busy = None
    while busy is None and time.monotonic() < deadline:
        try:
            assert rival.acquire(0) is False
            time.sleep(0.02)
        except dlock.BusyError as e:
            busy = e
    assert busy is not None and busy.code == dlock.EBUSY
    with pytest.raises(dlock.BusyError):
        other_store.close()  # a call of its lock is under way
    holder.release()  # the waiting thread gets the lock
    t.join()
    assert got == [True]


def test_locks_of_one_store_in_many_threads(store, name):
    total = {"n": 0, "inside": 0, "overlap": 0}

    def work():
        lock = store.lock(name, ttl=10)
        for _ in range(10):
            with lock:
                total["inside"] += 1
                if total["inside"] > 1:
                    total["overlap"] += 1
                n = total["n"]
                time.sleep(0.001)
                total["n"] = n + 1
                total["inside"] -= 1

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert total["overlap"] == 0
    assert total["n"] == 40
