"""The embedded mode's temporary Prefect API server, made to die with the process that started it, and started
early (`start_early_server`) so that its start-up overlaps the CLI's own."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from enginefoundry.console import say
from enginefoundry.flows.prefect_server._prefect_private import (
    UVICORN_ENVIRONMENT,
    adopt_as_prefects_server,
    guard_server_subprocess,
    prefect_tricks_apply,
)
from enginefoundry.model_server import free_port
from enginefoundry.runner import (
    NOT_FOR_TOOLS,
    die_with_parent,
    kill_process_group,
    reap_with_this_process,
    signals_held,
    tool_env,
)


class _GuardedSubprocess:
    """The `subprocess` module as Prefect's server module sees it, with Popen starting a child that cannot
    outlive us: own session (a terminal's Ctrl-C reaches it only through Prefect's own shutdown), a
    parent-death signal from the main thread, and registered with the runner's reaper for `kill -9`."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def Popen(self, *args: Any, **kwargs: Any) -> Any:  # the name Prefect calls

        kwargs.setdefault("start_new_session", True)
        # Prefect's API server signs nothing: the signing key stays out of its environment.
        given = kwargs.get("env")
        kwargs["env"] = tool_env() if given is None else {k: v for k, v in given.items() if k not in NOT_FOR_TOOLS}
        held: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if threading.current_thread() is threading.main_thread() and "preexec_fn" not in kwargs:
            kwargs["preexec_fn"] = die_with_parent()  # it unblocks what signals_held blocks, in the child
            held = signals_held()
        with held:
            proc = self._real.Popen(*args, **kwargs)
            reap_with_this_process(proc.pid)
        return proc


def guard_ephemeral_prefect_server() -> None:
    """Without PREFECT_API_URL, Prefect 3.9.1 starts its API as `python -m uvicorn … create_app` through
    `SubprocessASGIServer._run_uvicorn_command` (prefect/server/api/server.py@3.9.1), a plain child that a
    `kill -9` of the CLI leaves running (its atexit `stop` never runs). Its module's `subprocess` is replaced
    by one whose Popen makes the child die with this process (`_prefect_private.guard_server_subprocess`: on
    another Prefect release, nothing is replaced)."""
    if os.environ.get("PREFECT_API_URL"):
        return

    guard_server_subprocess(_GuardedSubprocess)


class EarlyServer:
    """The temporary Prefect API server, started by us before Prefect is imported, so that its start-up
    (Prefect's server imports, a fresh database's migrations: ~10 s on this 2-core host) runs beside the CLI's
    own preparation (importing the flows, creating the MLflow database) instead of after it. `adopt` hands it to
    Prefect as the server Prefect would have started itself; from then on it is Prefect's, stopped by Prefect's
    atexit like its own."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int) -> None:
        self.proc = proc
        self.port = port
        self.started = time.monotonic()

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def adopt(self, timeout_s: float) -> bool:
        """Wait until the server answers /health, then make it the port-less `SubprocessASGIServer` that
        `prefect.client.orchestration.get_client` starts when no PREFECT_API_URL is set (its `start` does nothing
        once `running`: prefect/server/api/server.py@3.9.1). False (and the process stopped) when it exited
        before it answered, e.g. its port was taken: Prefect then starts its own as before."""
        import httpx
        from prefect.server.api.server import SubprocessASGIServer


        deadline = time.monotonic() + timeout_s
        with httpx.Client() as client:
            while True:
                if self.proc.poll() is not None:
                    return False
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.api_url}/health", timeout=5).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("Timed out while attempting to connect to ephemeral Prefect API server "
                                       f"(started early on port {self.port}; PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_"
                                       "SECONDS)")
                time.sleep(0.1)
        from prefect.settings import PREFECT_SERVER_EPHEMERAL_ENABLED

        server = SubprocessASGIServer()
        if server.running or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
            # Prefect started one already (nothing should have), or may not use one: Prefect decides as before.
            self.stop()
            return False
        adopt_as_prefects_server(server, self.port, self.proc)  # its state, and its stop registered with atexit
        say(f"Prefect: temporary API server on {server.address} (no PREFECT_API_URL), ready "
            f"{time.monotonic() - self.started:.1f} s after it started")
        return True

    def stop(self) -> None:

        kill_process_group(self.proc, grace_s=5.0)


def start_early_server() -> EarlyServer | None:
    """Start the temporary Prefect API server now, with the command and environment Prefect 3.9.1 uses
    (`SubprocessASGIServer._run_uvicorn_command`, prefect/server/api/server.py@3.9.1), made to die with this
    process like the one Prefect starts (`_GuardedSubprocess`). None when a Prefect API is configured
    (PREFECT_API_URL), or when the installed Prefect is not a release this was measured on
    (`_prefect_private.prefect_tricks_apply`): Prefect then starts its own. Whether Prefect may use one at all
    (PREFECT_SERVER_EPHEMERAL_ENABLED) is checked by `adopt`, which then stops it and leaves the decision to
    Prefect as before.

    Differences from Prefect's own, all for the temporary server only: the port is one the kernel hands out
    (Prefect picks at random in 8000–8999); block types are not registered on start
    (PREFECT_API_BLOCKS_REGISTER_ON_START=false: ~2 s of a fresh database's start; the embedded mode uses no
    blocks, the cluster mode's Secret blocks live on a real server); and uvicorn is run through
    `orchestration/ephemeral_server.py`, which first gives a new SQLite database a migrated start (≈ 3.5 s)."""


    if os.environ.get("PREFECT_API_URL") or not prefect_tricks_apply():
        return None

    spec = importlib.util.find_spec("prefect")
    if spec is None or spec.origin is None:
        return None
    app_dir = Path(spec.origin).parent.parent  # what Prefect passes: prefect.__module_path__.parent
    port = free_port()
    env = {**tool_env(), **UVICORN_ENVIRONMENT,  # the server signs nothing: no signing key in its environment
           "PREFECT_API_BLOCKS_REGISTER_ON_START": os.environ.get("PREFECT_API_BLOCKS_REGISTER_ON_START", "false")}
    # Prefect's `python -m uvicorn …`, through ephemeral_server: a fresh SQLite database starts as a migrated copy.
    argv = [sys.executable, "-m", "enginefoundry.flows.prefect_server.ephemeral_server", "--app-dir", str(app_dir),
            "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port),
            "--log-level", "error", "--lifespan", "on"]
    with signals_held():
        proc = subprocess.Popen(argv, env=env, start_new_session=True, preexec_fn=die_with_parent())
        reap_with_this_process(proc.pid)
    return EarlyServer(proc, port)
