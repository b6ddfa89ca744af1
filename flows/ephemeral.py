"""The embedded mode's temporary Prefect API server, made to die with the process that started it."""

from __future__ import annotations

import contextlib
import os
from typing import Any


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

        from enginefoundry.runner import die_with_parent, reap_with_this_process, signals_held

        kwargs.setdefault("start_new_session", True)
        held = contextlib.nullcontext()
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
    by one whose Popen makes the child die with this process."""
    if os.environ.get("PREFECT_API_URL"):
        return
    from prefect.server.api import server as prefect_server

    if not isinstance(prefect_server.subprocess, _GuardedSubprocess):
        prefect_server.subprocess = _GuardedSubprocess(prefect_server.subprocess)  # type: ignore[assignment]
