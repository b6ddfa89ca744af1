"""Run external tools: log streamed to a file, live progress, timeout, process-group kill, log tail in errors.

No child outlives this process, even under `kill -9`: every tool and server runs in its own process group,
its leader gets a parent-death signal where the starting thread also waits for it (PR_SET_PDEATHSIG, prctl(2):
"the signal is sent when the parent thread terminates"), and every group is registered with a reaper — a
tiny process that holds the read end of a pipe whose only write end is ours. When this process dies in any
way the kernel closes that end; the reaper reads EOF and SIGKILLs every group still registered, grandchildren
included (AIPerf's workers, a server's workers), which a parent-death signal alone cannot reach.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType

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


_PR_SET_PDEATHSIG = 1  # linux/prctl.h
try:
    _LIBC: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
except OSError:  # pragma: no cover - no libc to load
    _LIBC = None


_HELD_SIGNALS = {signal.SIGINT, signal.SIGTERM}
_Handler = Callable[[int, FrameType | None], object]


_held_depth = 0  # signals_held blocks entered by the main thread and not yet left


def _deferring(previous: _Handler, pending: list[int]) -> Callable[[int, FrameType | None], None]:
    """A handler that, while signals are held, only notes the signal (and the SIGTERM flag); otherwise it is
    `previous`. It never raises while held, so nothing can be swallowed inside an at-fork hook."""

    def handler(signum: int, frame: FrameType | None) -> None:
        if _held_depth > 0:
            if signum == signal.SIGTERM:
                _TERMINATING.set()
            pending.append(signum)
            return
        previous(signum, frame)

    return handler


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGINT/SIGTERM while the main thread forks a child; they are delivered when the block ends.

    A fork with a preexec_fn runs Python's at-fork hooks (logging's _acquireLock/_releaseLock). An exception a
    signal handler raises inside them is swallowed ("Exception ignored in _releaseLock") and leaves logging's
    lock held: a run cancelled as AIPerf started went on with a dead server, and hung at exit in Prefect's log
    drain, whose thread waited for that lock. Blocking the signals in the main thread is not enough: the kernel
    then hands a process-directed signal to another thread, and CPython still runs the Python handler in the
    main thread at its next bytecode, which can be inside the hook. So the Python handlers are swapped for ones
    that only note the signal, and the noted signals are raised again once the fork is done. The mask stays
    (the child unblocks it in its preexec_fn, die_with_parent)."""
    global _held_depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    swapped: dict[signal.Signals, _Handler] = {}
    for sig in _HELD_SIGNALS:
        previous = signal.getsignal(sig)
        if callable(previous):  # SIG_DFL and SIG_IGN keep their meaning: nothing Python runs for them
            swapped[sig] = previous
            signal.signal(sig, _deferring(previous, pending))
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD_SIGNALS)
    _held_depth += 1
    try:
        yield
    finally:
        # Unmask while still holding (a signal that runs its handler now is only noted), then put the
        # handlers back, stop holding and deliver what was noted, outside any fork.
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for held, previous in swapped.items():
            signal.signal(held, previous)
        _held_depth -= 1
        for noted in dict.fromkeys(pending):
            signal.raise_signal(noted)


def die_with_parent(parent_pid: int | None = None) -> Callable[[], None]:
    """A preexec_fn: the child gets SIGKILL when the thread that started it ends (Linux; a no-op elsewhere).
    Checks the parent is still the one that forked, closing the race where the parent died before prctl."""
    parent = parent_pid or os.getpid()

    def preexec() -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD_SIGNALS)  # the fork inherited signals_held's mask
        if _LIBC is not None:
            _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


# The reaper: reads "+G pgid" / "+P pid" / "-G pgid" / "-P pid" lines; on EOF kills what is registered.
_REAPER_CODE = r"""
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
live = set()
for line in sys.stdin:
    parts = line.split()
    if len(parts) == 2 and parts[0][0] in "+-" and parts[1].isdigit():
        item = (parts[0][1:], int(parts[1]))
        (live.add if parts[0][0] == "+" else live.discard)(item)
for kind, num in live:
    try:
        (os.killpg if kind == "G" else os.kill)(num, signal.SIGKILL)
    except OSError:
        pass
"""


class _Reaper:
    """One reaper process per process that starts children; started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._owner_pid = 0

    def _send(self, line: str) -> None:
        with self._lock:
            if self._proc is None or self._owner_pid != os.getpid() or self._proc.poll() is not None:
                if line.startswith("-"):
                    return
                self._proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", "-c", _REAPER_CODE], stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True,
                    env=tool_env(),  # it kills processes; it signs nothing
                )
                self._owner_pid = os.getpid()
            assert self._proc.stdin is not None
            try:
                self._proc.stdin.write(line.encode() + b"\n")
                self._proc.stdin.flush()
            except (BrokenPipeError, OSError):
                pass

    def add(self, pid: int, *, group: bool) -> None:
        self._send(f"+{'G' if group else 'P'} {pid}")

    def discard(self, pid: int, *, group: bool) -> None:
        self._send(f"-{'G' if group else 'P'} {pid}")


_REAPER = _Reaper()


def reap_with_this_process(pid: int, *, group: bool = True) -> None:
    """Kill this process group (or single process) when the current process dies, however it dies."""
    _REAPER.add(pid, group=group)


def forget_reaped(pid: int, *, group: bool = True) -> None:
    """The group is gone (we killed and reaped it): its id may be reused, so the reaper must forget it."""
    _REAPER.discard(pid, group=group)


def kill_process_group(proc: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    """TERM the whole group, then KILL what is left. The tool's children (workers, servers) die with it."""
    if proc.poll() is not None:
        # The leader is gone; members it left (AIPerf workers) may not be.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        forget_reaped(proc.pid)
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
    forget_reaped(proc.pid)


_TERMINATING = threading.Event()
_EXIT_HANDLERS: set[object] = set()  # the handlers this module installed: installing again is a no-op


_CANCEL_REASON: list[str] = []  # why the run was cancelled (request_cancel), first reason only


def terminating() -> bool:
    """SIGTERM arrived in this process (whether or not its handler's exception survived), or its run was
    cancelled (request_cancel)."""
    return _TERMINATING.is_set()


def request_cancel(reason: str) -> None:
    """The run of this process was cancelled (its flow run or a parent's: flows/cancel_watch.py): from now on every
    checkpoint before a publish, a registration or an alias move stops it (`exit_if_terminating`)."""
    if not _CANCEL_REASON:
        _CANCEL_REASON.append(reason)
    _TERMINATING.set()


def cancel_reason() -> str | None:
    """Why the run was cancelled, or None."""
    return _CANCEL_REASON[0] if _CANCEL_REASON else None


def exit_if_terminating() -> None:
    """Raise SystemExit(143) when SIGTERM arrived. The handler raises too, but Python swallows an exception
    raised where the signal happened to land in an at-fork hook or a finalizer ("Exception ignored in
    <function _releaseLock>": logging's after-fork hook, as a subprocess starts); the flag it set first still
    stops the run here, at a checkpoint before anything is published."""
    if _TERMINATING.is_set():
        raise SystemExit(128 + signal.SIGTERM)


_INTERRUPTED = threading.Event()  # SIGINT arrived (install_signal_policy's handler)


def interrupted() -> bool:
    """SIGINT or SIGTERM arrived, or the run was cancelled: what was open ends KILLED, not FAILED."""
    return _INTERRUPTED.is_set() or _TERMINATING.is_set()


def install_signal_policy() -> None:
    """The process's one signal policy, installed before any flow starts (cli/common.install_exit_handlers) and by
    whatever opens something that must end on a signal (records/tracking: MLflow runs): SIGTERM as exit
    (`install_sigterm_as_exit`, with its `on_sigterm` callbacks) and SIGINT remembered (`interrupted`) before the
    handler found (Python's KeyboardInterrupt). Main thread only; installing again is a no-op."""
    install_sigterm_as_exit()
    _chain(signal.SIGINT, _remember_sigint)


def _remember_sigint(previous: _Found) -> _Installed:
    def handler(signum: int, frame: FrameType | None) -> None:
        _INTERRUPTED.set()
        if callable(previous):
            previous(signum, frame)  # signal.default_int_handler raises KeyboardInterrupt
        else:
            raise KeyboardInterrupt

    return handler


_Found = Callable[[int, FrameType | None], object] | int | None  # what signal.getsignal returns
_Installed = Callable[[int, FrameType | None], None]


def _chain(sig: signal.Signals, make: Callable[[_Found], _Installed]) -> None:
    """Install `make(the handler found)` for `sig`, once: a handler this module made is left in place. Main thread
    only (Python runs handlers there, and only it may install them)."""
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(sig)
    if previous in _EXIT_HANDLERS:
        return
    handler = make(previous)
    _EXIT_HANDLERS.add(handler)
    signal.signal(sig, handler)


_ON_SIGTERM: list[Callable[[], None]] = []  # on_sigterm's callbacks, in the order registered


def on_sigterm(callback: Callable[[], None]) -> None:
    """Run `callback` when SIGTERM arrives, before the run ends (model_server: stop every server this process
    started). The one SIGTERM policy of the process is here: `install_sigterm_as_exit` installs its one handler,
    which runs these callbacks; registering the same callback again is a no-op."""
    if callback not in _ON_SIGTERM:
        _ON_SIGTERM.append(callback)


def install_sigterm_as_exit() -> None:
    """SIGTERM (a cancelled run, `kill`) marks the process terminating, runs the `on_sigterm` callbacks, then the
    handler installed before (if any), and raises SystemExit(143) in the main thread, so `finally` blocks stop
    servers and tools and runs end. Installing again (every tool or server start) leaves the handler in place.
    Main thread only."""
    _chain(signal.SIGTERM, _exit_on_sigterm)


def _exit_on_sigterm(previous: _Found) -> _Installed:
    def handler(signum: int, frame: FrameType | None) -> None:
        _TERMINATING.set()
        for callback in list(_ON_SIGTERM):
            callback()
        if callable(previous):
            previous(signum, frame)
        raise SystemExit(128 + signum)

    return handler


# Secrets of this process that no tool or server needs (evidence/signing.py: the private key's PEM text, its
# password, and the path to the key file, which is as good as the key to whoever can read it): never in a child's
# environment, so a tool that prints its environment (a crash report, a launcher's `env` dump) cannot put them in a
# log that is kept or uploaded. Signing happens in this process only: no tool, server (model servers, the embedded
# Prefect API server) nor the reaper gets them.
NOT_FOR_TOOLS = ("ENGINEFOUNDRY_SIGNING_KEY", "ENGINEFOUNDRY_SIGNING_KEY_PASSWORD", "ENGINEFOUNDRY_SIGNING_KEY_FILE")


def tool_env(extra: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """The environment of a tool or server: this process's, with `extra` (a None value unsets that variable), without
    NOT_FOR_TOOLS."""
    merged: dict[str, str | None] = {**os.environ, **(extra or {})}
    return {k: v for k, v in merged.items() if v is not None and k not in NOT_FOR_TOOLS}


def every(seconds: float, progress: Callable[[str], None]) -> Callable[[str], None]:
    """`progress`, passing on at most one note per `seconds` (counted from now): for a long tool whose
    `run_tool` notes (every 10 s) would be too many."""
    last = time.monotonic()

    def note(text: str) -> None:
        nonlocal last
        if time.monotonic() - last >= seconds:
            last = time.monotonic()
            progress(text)

    return note


def _children_peak_rss_mb() -> float:
    # ru_maxrss of reaped children is in KiB on Linux; it is the max over all children so far.
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


PROGRESS_EVERY_S = 10.0  # run_tool's notes on a long tool: "<what>: running for 40s"


def run_tool(
    argv: Sequence[str],
    log_path: Path,
    *,
    timeout_s: float,
    env: Mapping[str, str | None] | None = None,
    cwd: Path | None = None,
    what: str | None = None,
    progress: Callable[[str], None] | None = None,
    check: bool = True,
) -> ToolRun:
    """Run a command to completion. Raises ToolError (with the log tail) on a missing tool, timeout or failure
    (with `check` False a failure is returned: the caller reads the tool's own account of it). `env` is added to this
    process's environment (tool_env: a None value unsets); `progress` gets a note every PROGRESS_EVERY_S (`every`
    thins them)."""
    what = what or Path(argv[0]).name
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = tool_env(env)
    start = time.monotonic()
    with log_path.open("wb") as log:
        proc: subprocess.Popen[bytes] | None = None
        try:
            with signals_held():
                proc = subprocess.Popen(
                    list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env=full_env, cwd=cwd, start_new_session=True, preexec_fn=die_with_parent(),
                )
                reap_with_this_process(proc.pid)  # registered before a held signal can end this process
        except FileNotFoundError:
            raise ToolError(f"{what}: command '{argv[0]}' not found; install it or put it on PATH") from None
        except BaseException:  # a signal held during the fork, delivered as the block ends
            if proc is not None:
                kill_process_group(proc)
            raise
        install_sigterm_as_exit()
        try:
            _wait_for(proc, what, log_path, start=start, timeout_s=timeout_s, progress=progress)
        except BaseException:
            # Ctrl-C or any error in this process: never leave the tool's process group behind.
            kill_process_group(proc)
            raise
    # Members of the group may outlive a leader that exited (daemonised workers): none is left behind.
    kill_process_group(proc)
    wall = time.monotonic() - start
    run = ToolRun(argv=list(argv), returncode=proc.returncode, wall_s=wall,
                  peak_rss_mb=_children_peak_rss_mb(), log_path=str(log_path))
    if proc.returncode != 0 and check:
        raise ToolError(f"{what} failed with exit code {proc.returncode}; log {log_path}:\n{tail(log_path)}")
    return run


def _wait_for(proc: subprocess.Popen[bytes], what: str, log_path: Path, *, start: float, timeout_s: float,
              progress: Callable[[str], None] | None) -> None:
    """Until the tool exits; ToolError (its process group killed) once it has run `timeout_s`."""
    next_note = start + PROGRESS_EVERY_S
    while True:
        try:
            proc.wait(timeout=0.5)
            return
        except subprocess.TimeoutExpired:
            now = time.monotonic()
            if now - start > timeout_s:
                kill_process_group(proc)
                raise ToolError(f"{what} timed out after {timeout_s:.0f}s; log {log_path}:\n{tail(log_path)}") from None
            if progress and now >= next_note:
                progress(f"{what}: running for {now - start:.0f}s")
                next_note = now + PROGRESS_EVERY_S


def pid_alive(pid: int) -> bool:
    """Is a process with this id alive on this host? (A process we may not signal is alive.)"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
