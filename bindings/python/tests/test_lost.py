"""The lost-lock signal: lock.lost (a threading.Event), lock.wait_lost()
and the on_lost callback, which runs on a libdlock thread."""
import sys
import threading
import time

import pytest

import dlock


def test_lost_when_the_lease_runs_out(store, other_store, name):
    calls = []

    def on_lost(lock):
        calls.append((lock, threading.get_ident()))

    lock = store.lock(name, ttl=1, renew=False, on_lost=on_lost)
    t0 = time.monotonic()
    with pytest.raises(dlock.LostError) as e:
        with lock:
            assert not lock.lost.is_set()
            assert lock.wait_lost(timeout=10) is True
            elapsed = time.monotonic() - t0
            assert not lock.held
    assert e.value.code == dlock.ELOST
    assert 0.8 <= elapsed < 5, elapsed
    deadline = time.monotonic() + 5
    while not calls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(calls) == 1
    assert calls[0][0] is lock
    assert calls[0][1] != threading.get_ident()
    # a new hold clears the flag (the store may count its lease a little longer)
    assert lock.acquire(timeout=10)
    assert not lock.lost.is_set()
    lock.release()


def test_lost_when_another_client_breaks_it(store, other_store, name):
    seen = threading.Event()
    lock = store.lock(name, ttl=1.5, on_lost=lambda l: seen.set())
    assert lock.acquire(0)
    (holder,) = other_store.status(name)
    try:
        freed = other_store.break_lock(name, holder["id"])
    except dlock.NotSupportedError as e:
        pytest.skip("%s cannot break a hold: %s" % (store.kind, e))
    assert freed["id"] == holder["id"]
    assert lock.lost.wait(timeout=10)
    assert seen.wait(timeout=5)
    assert not lock.held
    with pytest.raises(dlock.LostError):
        lock.release()
    rival = other_store.lock(name)
    assert rival.acquire(0)
    assert rival.fence > holder["fence"]
    rival.release()


def test_renewed_lock_is_not_lost(store, name):
    lock = store.lock(name, ttl=2)  # renewed every 0.67 s: room for a slow round trip
    with lock:
        assert lock.wait_lost(timeout=4.5) is False
        assert lock.held


def test_a_failing_callback_does_not_break_anything(store, name, monkeypatch):
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)

    def on_lost(lock):
        raise RuntimeError("callback error (expected in this test)")

    lock = store.lock(name, ttl=1, renew=False, on_lost=on_lost)
    assert lock.acquire(0)
    assert lock.wait_lost(timeout=10)
    with pytest.raises(dlock.LostError):
        lock.release()
    deadline = time.monotonic() + 5
    while not reported and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [type(r.exc_value) for r in reported] == [RuntimeError]
    assert lock.acquire(0)
    lock.release()
