"""What the commands share: loading a spec with command-line overrides, and quiet Prefect defaults."""

from __future__ import annotations

import os
from typing import Any

from enginefoundry.spec import BuildSpec, load_spec
from enginefoundry.spec.outputs import TrackingSpec

DEFAULT_MLFLOW = TrackingSpec().mlflow_uri


def load(path: str, overrides: dict[str, str | None] | None = None) -> BuildSpec:
    spec = load_spec(path)
    if overrides:
        publish = spec.publish.model_copy(update={"store": overrides["store"]}) if overrides.get("store") else None
        tracking = (spec.tracking.model_copy(update={"mlflow_uri": overrides["mlflow_uri"]})
                    if overrides.get("mlflow_uri") else None)
        spec = spec.model_copy(update={k: v for k, v in (("publish", publish), ("tracking", tracking)) if v})
    return spec


def quiet_prefect_defaults() -> None:
    """Embedded mode on a closed network: no telemetry lookups. The ephemeral API server gets 120 s to start
    instead of Prefect's 20 s: on a busy 2-core host it took longer (measured: a plain flow failed with "Timed
    out while attempting to connect to ephemeral Prefect API server" after 20 s at load average 10)."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    guard_ephemeral_prefect_server()
    install_exit_handlers()


def install_exit_handlers() -> None:
    """SIGTERM exits through `finally` and atexit (servers stopped, MLflow runs ended KILLED), installed before
    any flow starts: Prefect 3.9.1's flow engine swaps in its own SIGTERM handler for the run and, on
    TerminationSignal, restores the handler it found and re-sends the signal to it (`capture_sigterm`,
    prefect/utilities/engine/__init__.py@3.9.1). Found at that moment, SIG_DFL would end the process with no
    cleanup at all."""
    from enginefoundry.runner import install_sigterm_as_exit
    from enginefoundry.tracking import OPEN_RUNS

    install_sigterm_as_exit()
    OPEN_RUNS.install_handlers()


class _GuardedSubprocess:
    """The `subprocess` module as Prefect's server module sees it, with Popen starting a child that cannot
    outlive us: own session (a terminal's Ctrl-C reaches it only through Prefect's own shutdown), a
    parent-death signal from the main thread, and registered with the runner's reaper for `kill -9`."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def Popen(self, *args: Any, **kwargs: Any) -> Any:  # the name Prefect calls
        import threading

        from enginefoundry.runner import die_with_parent, reap_with_this_process

        kwargs.setdefault("start_new_session", True)
        if threading.current_thread() is threading.main_thread() and "preexec_fn" not in kwargs:
            kwargs["preexec_fn"] = die_with_parent()
        proc = self._real.Popen(*args, **kwargs)
        reap_with_this_process(proc.pid)
        return proc


def guard_ephemeral_prefect_server() -> None:
    """Without PREFECT_API_URL, Prefect 3.9.1 starts its API as `python -m uvicorn … create_app` through
    `SubprocessASGIServer._run_uvicorn_command` (prefect/server/api/server.py@3.9.1), a plain child that a
    `kill -9` of the CLI leaves running (its atexit `stop` never runs). Its module's `subprocess` is replaced
    by one whose Popen makes the child die with this process."""
    if os.environ.get("PREFECT_API_URL"):
        return
    from prefect.server.api import server as prefect_server

    if not isinstance(prefect_server.subprocess, _GuardedSubprocess):
        prefect_server.subprocess = _GuardedSubprocess(prefect_server.subprocess)  # type: ignore[assignment]
