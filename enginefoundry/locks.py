"""Host-local exclusive locks (flock on a lock file): the kernel drops a lock when its holder dies, so a
kill -9 never leaves one behind."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def host_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created, with its folder) for the block; other holders wait."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
