"""The access-token example (examples/token_refresh.py, docs/python.md) on
the store under test: stale-token failures without the lock, none with it."""
import os
import re
import subprocess
import sys

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "token_refresh.py")


def test_token_refresh_example(uri):
    r = subprocess.run([sys.executable, EXAMPLE, uri], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^under dlock: +0 messages rejected", r.stdout, re.M), r.stdout
