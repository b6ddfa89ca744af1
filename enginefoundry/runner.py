"""Run external tools: log streamed to a file, live progress, timeout, process-group kill, log tail in errors."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel

from enginefoundry.errors import ToolError


class ToolRun(BaseModel):
    argv: list[str]
    returncode: int
    wall_s: float
    peak_rss_mb: float
    log_path: str


def tail(path: Path, lines: int = 30) -> str:
    """The last lines of a log file, for error messages."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 16384))
            text = f.read().decode(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def exited_after_error(alive: Callable[[], bool], *, grace_s: float = 5.0, poll_s: float = 0.05) -> bool:
    """After a connection error to a server: has its process exited, or does it exit within `grace_s`?

    A killed server closes its sockets before its process can be reaped, so a client sees "connection
    refused/reset" while `poll()` still says running. Asking once would race; asking until the grace period
    ends does not. A server that is alive but not answering costs the grace period, once, on the error path.
    """
    deadline = time.monotonic() + grace_s
    while alive():
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def kill_process_group(proc: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    """TERM the whole group, then KILL what is left. The tool's children (workers, servers) die with it."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=grace_s)
    # Reap any group member that outlived the leader.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _children_peak_rss_mb() -> float:
    # ru_maxrss of reaped children is in KiB on Linux; it is the max over all children so far.
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def run_tool(
    argv: Sequence[str],
    log_path: Path,
    *,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    unset_env: Sequence[str] = (),
    cwd: Path | None = None,
    what: str | None = None,
    progress: Callable[[str], None] | None = None,
    progress_every_s: float = 10.0,
) -> ToolRun:
    """Run a command to completion. Raises ToolError (with the log tail) on a missing tool, timeout or failure."""
    what = what or Path(argv[0]).name
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = {k: v for k, v in {**os.environ, **(env or {})}.items() if k not in unset_env}
    start = time.monotonic()
    with log_path.open("wb") as log:
        try:
            proc = subprocess.Popen(
                list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=full_env, cwd=cwd, start_new_session=True,
            )
        except FileNotFoundError:
            raise ToolError(f"{what}: command '{argv[0]}' not found; install it or put it on PATH") from None
        try:
            next_note = start + progress_every_s
            while True:
                try:
                    proc.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    now = time.monotonic()
                    if now - start > timeout_s:
                        kill_process_group(proc)
                        raise ToolError(
                            f"{what} timed out after {timeout_s:.0f}s; log {log_path}:\n{tail(log_path)}"
                        ) from None
                    if progress and now >= next_note:
                        progress(f"{what}: running for {now - start:.0f}s")
                        next_note = now + progress_every_s
        except BaseException:
            # Ctrl-C or any error in this process: never leave the tool's process group behind.
            kill_process_group(proc)
            raise
    wall = time.monotonic() - start
    run = ToolRun(argv=list(argv), returncode=proc.returncode, wall_s=wall,
                  peak_rss_mb=_children_peak_rss_mb(), log_path=str(log_path))
    if proc.returncode != 0:
        raise ToolError(f"{what} failed with exit code {proc.returncode}; log {log_path}:\n{tail(log_path)}")
    return run
