"""A lease whose holder process was killed (a real process: moved out of tests/unit/test_lease.py, the unit tier starts
none)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from enginefoundry.store.backends import FileStore
from enginefoundry.store.layout import lease_key
from enginefoundry.store.lease import read_lease, try_acquire

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    return FileStore(f"file://{tmp_path}/store")


_HOLDER = """
import sys, time
from enginefoundry.store.lease import try_acquire
from enginefoundry.store.backends import FileStore
held = try_acquire(FileStore(sys.argv[1]), sys.argv[2], "child", ttl_s=3600)
print("held" if held else "refused", flush=True)
time.sleep(600)
"""


def test_lease_of_a_killed_process_on_this_host_is_taken_at_once(store: FileStore):
    lk = lease_key("m", "k4")
    child = subprocess.Popen([sys.executable, "-c", _HOLDER, store.uri, lk], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert child.stdout.readline().strip() == "held"
        lease = read_lease(store, lk)
        assert lease.pid == child.pid and lease.expires_at > time.time() + 3000
        assert try_acquire(store, lk, "me") is None  # its owner is alive
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert read_lease(store, lk).owner_alive() is False
    t0 = time.monotonic()
    taken = try_acquire(store, lk, "me")
    assert taken is not None and time.monotonic() - t0 < 2  # not after the hour-long TTL
    taken.release()
