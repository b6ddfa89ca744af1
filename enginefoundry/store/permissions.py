"""File modes that follow the umask: what `open(..., "w")` gives plain files, and the same for executables.

`tempfile.mkstemp` creates files 0600 whatever the umask (Python docs, tempfile.mkstemp: "readable and
writable only by the creating user ID"), so a file written through it and renamed into place must be
chmod-ed to `mode_for(executable)` afterwards.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

_LOCK = threading.Lock()


def current_umask() -> int:
    """The process umask, read without changing it (Linux ≥ 4.7 shows it in /proc/self/status)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _LOCK:  # elsewhere: set and restore, serialised within this process
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def mode_for(executable: bool = False) -> int:
    """0o666 & ~umask for data, 0o777 & ~umask for executables (0644 / 0755 under the usual umask 022)."""
    return (0o777 if executable else 0o666) & ~current_umask()


def write_file_atomic(path: Path, data: bytes, *, executable: bool = False) -> Path:
    """Write beside the target, fsync, chmod to the umask's mode and rename: readers see all or nothing."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        tmp.chmod(mode_for(executable))
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
