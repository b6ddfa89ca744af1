"""The process supervisor shared by every service.

Each service runs detached in its own session (its process group is ours to signal; Ctrl-C in the
terminal that ran `up` does not reach it), logs to <state>/logs/<name>.log, has its PID in
<state>/pids/<name>.pid and carries a marker in its environment, so `down`/`status` only ever signal
processes of this state dir (a recycled PID is left alone). `launch` waits for a readiness probe under a
deadline; `stop_group` sends TERM -> INT -> KILL to the whole group and waits between steps."""

from __future__ import annotations

import contextlib
import functools
import os
import select
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path

from stacklib.net import HOST
from stacklib.state import StackError, State

# A service whose process is alive gets this long to answer its readiness probe (a crashed one fails at once).
# Measured on a 2-core host at load average 10: mlflow 42 s, the Prefect server 58 s; 60 s was too tight.
READY_TIMEOUT_S = float(os.environ.get("EF_STACK_READY_TIMEOUT_S", "180"))


# Marker put into every child's environment; `down`/`status` only touch processes that carry the marker for
# this state dir, so a recycled PID never gets a signal from us.
MARKER_ENV = "EF_STACK_DIR"


# Seconds to wait after each signal. weed needs ~4 s for a clean stop after TERM and ignores a second signal
# meanwhile (measured), so it gets a longer window before KILL; everything else gets ~2 s steps (facts §3.4).
STOP_STEPS: dict[str, tuple[tuple[signal.Signals, float], ...]] = {
    "default": ((signal.SIGTERM, 2.0), (signal.SIGINT, 2.0), (signal.SIGKILL, 2.0)),
    "s3": ((signal.SIGTERM, 2.0), (signal.SIGINT, 8.0), (signal.SIGKILL, 2.0)),
    # PostgreSQL's shutdown modes by signal (https://www.postgresql.org/docs/15/server-shutdown.html): TERM is
    # "smart" (waits for every client to leave), INT "fast" (disconnects them, then a checkpoint), QUIT
    # "immediate" (no checkpoint; crash recovery at the next start). `down` stops the servers first.
    "postgres": ((signal.SIGINT, 15.0), (signal.SIGQUIT, 5.0), (signal.SIGKILL, 2.0)),
}


def executable(name: str) -> str:
    """Console scripts of the venv live next to its interpreter (unresolved: the venv python is a symlink)."""
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if not found:
        raise StackError(f"'{name}' not found next to {sys.executable} nor on PATH; run with the project's venv")
    return found


def add_no_proxy(env: MutableMapping[str, str]) -> None:
    """An http_proxy from the environment would otherwise get the loopback traffic (urllib, botocore)."""
    for key in ("NO_PROXY", "no_proxy"):
        items = [i for i in env.get(key, "").split(",") if i]
        env[key] = ",".join(items + [h for h in ("127.0.0.1", "localhost") if h not in items])


def child_env(state: State, extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    # A stray session token or profile from the caller's shell would be signed into requests and break auth.
    for key in ("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE"):
        env.pop(key, None)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env[MARKER_ENV] = str(state.root)
    add_no_proxy(env)
    env.update(extra)
    return env


def spawn(state: State, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start detached: own session (so its process group is ours to signal and Ctrl-C in the terminal that ran
    `up` does not reach it), output appended to the service log, PID recorded."""
    log = state.log_file(name).open("ab")
    log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(argv)}\n".encode())
    log.flush()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=state.root,
        start_new_session=True,
    )
    log.close()  # the child holds its own copy of the descriptor
    state.pid_file(name).write_text(f"{proc.pid}\n")
    return proc


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, process group) from /proc/<pid>/stat; comm may hold spaces and parens: split at the last
    ')'."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    return fields[0], int(fields[2])


def group_members(pgid: int) -> list[int]:
    """Live processes in the group; a zombie whose parent never reaps it must not count as alive."""
    if not Path("/proc/self/stat").exists():  # no procfs (macOS): best effort through signal 0
        try:
            os.killpg(pgid, 0)
            return [pgid]
        except (ProcessLookupError, PermissionError):
            return []
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _proc_stat(int(entry.name))
            if stat and stat[1] == pgid and (stat[0] not in ("Z", "X") or _threads_left(entry)):
                members.append(int(entry.name))
    return members


def _threads_left(proc_dir: Path) -> bool:
    """A multi-threaded process (weed, uvicorn) shows 'Z' as soon as its main thread is gone, while the other
    threads still hold its sockets; only a single-threaded zombie is really finished."""
    try:
        return sum(1 for _ in (proc_dir / "task").iterdir()) > 1
    except OSError:
        return False


def carries_marker(pid: int, state: State) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except FileNotFoundError:
        return not Path("/proc/self/environ").exists()  # no procfs: cannot tell, trust the pid file
    except (ProcessLookupError, PermissionError):
        return False
    return f"{MARKER_ENV}={state.root}".encode() in environ.split(b"\0")


def _ancestors(pid: int) -> set[int]:
    out = set()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


def marked_processes(state: State, keep: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """Every live process that carries this state dir's marker, but this one, its ancestors and `keep`: what a
    service left outside its process group (a worker's flow run starts in a session of its own, and may ignore
    TERM). Empty without procfs (nothing to read the marker from)."""
    if not Path("/proc/self/environ").exists():
        return []
    mine = _ancestors(os.getpid()) | set(keep)
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) not in mine:
            stat = _proc_stat(int(entry.name))
            if stat and stat[0] not in ("Z", "X") and carries_marker(int(entry.name), state):
                out.append(int(entry.name))
    return out


def _gone(state: State, keep: set[int] | frozenset[int], pids: set[int]) -> bool:
    return not pids & set(marked_processes(state, keep))


def stop_stragglers(state: State, keep: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """TERM, then KILL, every process `marked_processes` finds; the pids found."""
    found = marked_processes(state, keep)
    for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 2.0)):
        left = [pid for pid in found if pid in marked_processes(state, keep)]
        if not left:
            break
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        wait_until(functools.partial(_gone, state, keep, set(left)), wait_s)
    return found


def owned_members(state: State, pgid: int | None) -> list[int]:
    """Members of the recorded group that we started; empty means stopped (or the PID was recycled)."""
    if pgid is None:
        return []
    members = group_members(pgid)
    return members if any(carries_marker(pid, state) for pid in members) else []


def stop_group(state: State, name: str) -> tuple[bool, str]:
    """TERM -> INT -> KILL to the whole process group, waiting between steps. The pid file goes once nothing
    of ours is left, and stays (so a later `down` retries) if even KILL did not work."""
    pgid = state.read_pid(name)
    started = time.monotonic()
    if not owned_members(state, pgid):
        state.pid_file(name).unlink(missing_ok=True)
        return True, "not running"
    assert pgid is not None
    for sig, wait_s in STOP_STEPS.get(name, STOP_STEPS["default"]):
        with contextlib.suppress(ProcessLookupError):  # the group may vanish between check and signal
            os.killpg(pgid, sig)
        if wait_until(lambda: not group_members(pgid), wait_s):
            state.pid_file(name).unlink(missing_ok=True)
            return True, f"stopped by {sig.name} in {time.monotonic() - started:.1f} s"
    return False, f"STILL RUNNING after SIGKILL: pids {group_members(pgid)}"


def wait_until(check: Callable[[], bool], timeout_s: float, interval_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


def log_tail(state: State, name: str, lines: int = 30) -> str:
    try:
        text = state.log_file(name).read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no log)"
    return "\n".join("    | " + line for line in text[-lines:])


@dataclass
class Outcome:
    name: str
    url: str
    seconds: float
    pid: int | None
    note: str


@dataclass
class Context:
    state: State
    ports: dict[str, int]
    creds: dict[str, str]
    stack_env: dict[str, str]  # what <state>/env will hold; workers export it to their flow runs
    abort: threading.Event

    def url(self, name: str) -> str:
        return f"http://{HOST}:{self.ports[name]}"


def launch(
    ctx: Context, name: str, command: Callable[[], list[str]], env: dict[str, str], ready: Callable[[], bool]
) -> Outcome:
    """Start one service (unless it already runs from this state dir) and wait for its readiness probe.
    `command` is only evaluated when a process is spawned (weed's port choice must not rerun while it runs).
    """
    started = time.monotonic()
    pid = ctx.state.read_pid(name)
    if owned_members(ctx.state, pid):
        alive: Callable[[], bool] = lambda: bool(owned_members(ctx.state, pid))  # noqa: E731
        note = "already running"
    else:
        proc = spawn(ctx.state, name, command(), env)
        pid = proc.pid
        alive = lambda: proc.poll() is None  # noqa: E731
        note = "started"
    deadline = started + READY_TIMEOUT_S
    while not ready():
        if ctx.abort.is_set():
            raise StackError(f"{name}: aborted")
        if not alive():
            raise StackError(
                f"{name} exited before it was ready; log {ctx.state.log_file(name)}:\n" + log_tail(ctx.state, name)
            )
        if time.monotonic() > deadline:
            raise StackError(
                f"{name} not ready after {READY_TIMEOUT_S:.0f} s; log {ctx.state.log_file(name)}:\n"
                + log_tail(ctx.state, name)
            )
        time.sleep(0.2)
    return Outcome(name, ctx.url(name) if name in ctx.ports else "", time.monotonic() - started, pid, note)


# The watcher of an owner process (`up --owner-pid`): recorded with the services so `status` shows it, but
# never stopped by the `down` it runs itself.
OWNER_WATCH = "owner-watch"
ENTRY = Path(__file__).resolve().parents[1] / "stack.py"


def watch_owner(state: State, owner_pid: int) -> None:
    """Tie the stack to `owner_pid` (a test session): a detached watcher runs `down` once that process exits,
    however it exits, so a `kill -9` of the owner leaves no service behind. One watcher per state dir."""
    if owned_members(state, state.read_pid(OWNER_WATCH)):
        return
    argv = [sys.executable, str(ENTRY), "watch-owner", "--state-dir", str(state.root), "--owner-pid", str(owner_pid)]
    spawn(state, OWNER_WATCH, argv, child_env(state, {}))


def wait_for_exit(pid: int) -> None:
    """Block until process `pid` has exited: a pidfd where the kernel has them (no polling), else a 1 s poll."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):  # no pidfd (not Linux, or a kernel before 5.3)
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            except PermissionError:
                pass
            time.sleep(1.0)
    try:
        select.select([fd], [], [])
    finally:
        os.close(fd)
