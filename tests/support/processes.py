"""Finding a test's processes by a marker in their environment (children inherit it), and polling."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path


def marked_processes(variable: str, marker: str) -> list[str]:
    """Live (not zombie) processes whose environment has `variable=marker`: 'pid cmdline' each."""
    needle = f"{variable}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:160]
        except (OSError, IndexError):
            continue
        if state != "Z":
            found.append(f"{entry.name} {cmd}")
    return found


def poll(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.1) -> bool:
    """True once `predicate()` holds, polled every `interval_s` for up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()
