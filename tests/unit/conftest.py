"""The unit tier starts no process and no server (docs/architecture.md#tests-and-the-local-stack): while a unit test
module is collected (its module-level code: a skip condition that probes the host) and while a unit test runs,
starting a child process (subprocess, multiprocessing, os.fork/posix_spawn/exec*/system) or listening on a socket
raises ProcessInUnitTier, so a test that needs one goes to tests/integration (marked `services`)."""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import subprocess
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

# Python's own host probe: platform.processor() runs `uname -p` once per process and caches it (platform.py,
# `_Processor.get`); MLflow's telemetry reads it when first imported (mlflow/telemetry/schemas.py@3.17.2). Asked
# here, before any refusal, so no unit test depends on whether an earlier test in its worker asked first.
platform.uname().processor  # noqa: B018 (the value is cached by platform)

# matplotlib's first import on a host builds its font cache, asking fontconfig with `fc-list` (font_manager.py
# `_get_fontconfig_fonts`); once written, later imports read the cache. Built here, before any refusal, so a unit
# test that draws a plot does not depend on whether the host (or an earlier test) built it first.
with contextlib.suppress(ImportError):  # the plotting extra is not installed: no unit test draws
    import matplotlib.font_manager  # noqa: F401 (imported for its cache)


class ProcessInUnitTier(AssertionError):
    """A unit test started a process or a server: move it to tests/integration."""


def _refuse(what: str) -> Callable[..., Any]:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise ProcessInUnitTier(f"the unit tier starts no process or server ({what}); move this test to "
                                "tests/integration (docs/architecture.md#tests-and-the-local-stack)")
    return refused


# What starts a process: every child of subprocess and multiprocessing (fork and forkserver via os.fork, spawn via
# _posixsubprocess.fork_exec under Popen._execute_child) goes through one of these; a server is a socket that listens.
PROCESS_STARTERS: list[tuple[object, str]] = [
    (subprocess.Popen, "_execute_child"),
    (os, "fork"),
    (os, "forkpty"),
    (os, "posix_spawn"),
    (os, "posix_spawnp"),
    (os, "system"),
    (os, "execv"),
    (os, "execve"),
    (os, "execvp"),
    (os, "execvpe"),
    (socket.socket, "listen"),
]


_Report = pytest.CollectReport


@contextmanager
def processes_refused() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        for owner, name in PROCESS_STARTERS:
            if hasattr(owner, name):
                patch.setattr(owner, name, _refuse(f"{getattr(owner, '__name__', owner)}.{name}"))
        yield


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, _Report, _Report]:
    """Collecting a module of tests/unit (this conftest's folder only: pytest asks the conftests on the path)."""
    with processes_refused():
        return (yield)


@pytest.fixture(autouse=True)
def no_process_started() -> Iterator[None]:
    with processes_refused():
        yield
