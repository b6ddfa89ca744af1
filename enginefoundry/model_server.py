"""Run a model server for the smoke and benchmark stages, and never leave one behind.

The server runs in its own process group; stop() kills the whole group. Every live server is also
registered so that an interpreter exit or SIGTERM (a cancelled Prefect run, Ctrl-C) stops it, and with the
runner's reaper so that a `kill -9` of this process kills the group too (enginefoundry.runner).
"""

from __future__ import annotations

import atexit
import contextlib
import shlex
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, Field, JsonValue

from enginefoundry.confine import check_name
from enginefoundry.errors import ToolError
from enginefoundry.lanes.base import SERVE_CWD_VAR, ServeCommand
from enginefoundry.runner import (
    die_with_parent,
    install_sigterm_as_exit,
    kill_process_group,
    on_sigterm,
    reap_with_this_process,
    signals_held,
    tail,
    tool_env,
)

_LIVE: dict[int, subprocess.Popen[bytes]] = {}
_LOCK = threading.Lock()


class Endpoint(BaseModel):
    """What a client needs to talk to a served unit."""

    base_url: str  # http://127.0.0.1:PORT
    model_name: str
    tokenizer_dir: str
    pid: int
    log_path: str
    startup_s: float
    command: str = ""  # the server's exact command line (env and argv), as the unit's MLflow run records it
    server: str = ""  # which server it is (its command's description: "transformers serve", …)
    shipped: bool = True  # False: a server only the smoke stage runs (ServeCommand.shipped)
    # fields every request to it carries besides `model` (a served adapter's lora_request: Lane.adapter_request)
    request_body: dict[str, JsonValue] = Field(default_factory=dict)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])  # (host, port) for AF_INET


def _stop_all() -> None:
    with _LOCK:
        procs = list(_LIVE.values())
        _LIVE.clear()
    for proc in procs:
        kill_process_group(proc, grace_s=3)


atexit.register(_stop_all)
on_sigterm(_stop_all)  # SIGTERM stops the servers first (runner.install_sigterm_as_exit, the one SIGTERM policy)


def stop_all_servers() -> None:
    """Stop every server this process started (a cancelled run: flows/cancel_watch.py)."""
    _stop_all()


def start_server(cmd: ServeCommand, log_path: Path, *, timeout_s: float = 180.0) -> Endpoint:
    """Start the server and wait until its health endpoint answers. On failure, the log tail is in the error."""
    host, port = _host_port(cmd)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    install_sigterm_as_exit()
    t0 = time.monotonic()
    cwd = _link_folder(cmd, log_path.parent / "serve-cwd")
    if cwd is not None:  # env values name the working folder as ${EF_SERVE_CWD} (ServeCommand.copies)
        env = {k: v.replace(f"${{{SERVE_CWD_VAR}}}", str(cwd)) for k, v in cmd.command.env.items()}
        cmd = cmd.model_copy(update={"command": cmd.command.model_copy(update={"env": env})})
    # The parent-death signal fires when the starting *thread* ends, so it is only set from the main thread;
    # the reaper covers servers started from other threads.
    main = threading.current_thread() is threading.main_thread()
    proc: subprocess.Popen[bytes] | None = None
    with log_path.open("wb") as log:
        try:
            with signals_held():
                proc = subprocess.Popen(
                    cmd.command.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env=tool_env(cmd.command.env), start_new_session=True, cwd=cwd,
                    preexec_fn=die_with_parent() if main else None,
                )
                reap_with_this_process(proc.pid)  # registered before a held signal can end this process
                with _LOCK:  # and known to _stop_all, which the SIGTERM handler runs as the block ends
                    _LIVE[proc.pid] = proc
        except FileNotFoundError:
            raise ToolError(
                f"serve: '{cmd.command.argv[0]}' not found; install the lane's server (for the reference lane: "
                "pip install -e '.[reference]')"
            ) from None
        except BaseException:  # a signal held during the fork, delivered as the block ends
            if proc is not None:
                stop_server(proc.pid)
            raise
    base = f"http://{host}:{port}"
    try:
        _wait_healthy(proc, base + cmd.health_path, timeout_s, log_path)
    except BaseException:
        stop_server(proc.pid)
        raise
    return Endpoint(base_url=base, model_name=cmd.model_name, tokenizer_dir=cmd.tokenizer_dir,
                    pid=proc.pid, log_path=str(log_path), startup_s=round(time.monotonic() - t0, 2),
                    command=(f"cd {shlex.quote(str(cwd))} && " if cwd else "") + cmd.command.shell(),
                    server=cmd.command.description, shipped=cmd.shipped)


def _link_folder(cmd: ServeCommand, folder: Path) -> Path | None:
    """The server's working folder holding `cmd.links` and private copies of `cmd.copies` (made afresh beside the
    log, so it goes with the run's work folder), or None without either."""
    if not cmd.links and not cmd.copies:
        return None
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for name, target in cmd.links.items():
        (folder / check_name(name, "served model name")).symlink_to(target)
    for name, source in cmd.copies.items():
        shutil.copyfile(source, folder / check_name(name, "server file name"))
    return folder


def stop_server(pid: int) -> None:
    with _LOCK:
        proc = _LIVE.pop(pid, None)
    if proc is not None:
        kill_process_group(proc)


def is_alive(pid: int) -> bool:
    with _LOCK:
        proc = _LIVE.get(pid)
    return proc is not None and proc.poll() is None


@contextlib.contextmanager
def serving(cmd: ServeCommand, log_path: Path, *, timeout_s: float = 180.0) -> Iterator[Endpoint]:
    endpoint = start_server(cmd, log_path, timeout_s=timeout_s)
    try:
        yield endpoint
    finally:
        stop_server(endpoint.pid)


def _host_port(cmd: ServeCommand) -> tuple[str, int]:
    argv = cmd.command.argv
    host = argv[argv.index("--host") + 1] if "--host" in argv else "127.0.0.1"
    port = int(argv[argv.index("--port") + 1]) if "--port" in argv else 8000
    return host, port


def _wait_healthy(proc: subprocess.Popen[bytes], url: str, timeout_s: float, log_path: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ToolError(
                f"serve: the server exited with code {proc.returncode} before it was healthy; "
                f"log {log_path}:\n{tail(log_path)}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise ToolError(f"serve: no healthy answer from {url} within {timeout_s:.0f}s; log {log_path}:\n{tail(log_path)}")
