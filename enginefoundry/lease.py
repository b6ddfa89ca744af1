"""Build leases: two runs racing on one unit key build it once.

The lease is a small object created with the store's create-if-absent, like a manifest. The holder
builds and publishes, then releases it; the other run waits for the manifest and records a cache hit.
A lease that outlives its TTL (a crashed holder) is broken by the next run that needs the key.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Callable

from pydantic import BaseModel

from enginefoundry.store import Store

DEFAULT_TTL_S = float(os.environ.get("EF_LEASE_TTL_S", 4 * 3600))


class Lease(BaseModel):
    key: str  # store key of the lease object
    owner: str
    expires_at: float


def lease_key(model: str, unit_key: str) -> str:
    return f"leases/{model}/{unit_key}.json"


def new_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def try_acquire(store: Store, key: str, owner: str, ttl_s: float = DEFAULT_TTL_S) -> Lease | None:
    lease = Lease(key=key, owner=owner, expires_at=time.time() + ttl_s)
    if store.create_if_absent(key, lease.model_dump_json().encode()):
        return lease
    current = _read(store, key)
    if current is not None and current.expires_at < time.time():
        # Stale: its holder died. Delete and race again; create-if-absent lets one breaker win.
        store.delete(key)
        if store.create_if_absent(key, lease.model_dump_json().encode()):
            return lease
    return None


def release(store: Store, lease: Lease) -> None:
    current = _read(store, lease.key)
    if current is not None and current.owner == lease.owner:
        store.delete(lease.key)


def wait_for(
    store: Store, done_key: str, lease: str, *, timeout_s: float, poll_s: float = 2.0,
    progress: Callable[[str], None] = print,
) -> bool:
    """Wait until `done_key` exists (True) or the lease is gone without it (False: the holder failed)."""
    deadline = time.monotonic() + timeout_s
    next_note = time.monotonic()
    while time.monotonic() < deadline:
        if store.exists(done_key):
            return True
        current = _read(store, lease)
        if current is None or current.expires_at < time.time():
            return store.exists(done_key)
        if time.monotonic() >= next_note:
            progress(f"another run ({current.owner}) is building this unit; waiting for its manifest")
            next_note = time.monotonic() + 30
        time.sleep(poll_s)
    return False


def _read(store: Store, key: str) -> Lease | None:
    try:
        return Lease.model_validate(json.loads(store.read_bytes(key)))
    except Exception:
        return None
