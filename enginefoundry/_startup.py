"""Every start-up or exit trick that leans on a private internal of Python, in one place, each guarded by the
exact version it was measured on; the Prefect ones are in `orchestration/_prefect_private.py` (the domain never imports
Prefect). On any other version a trick is skipped and the plain public behaviour runs instead, so an upgrade
can lose seconds but never correctness. What each saves today, and how it was measured: docs/scale.md
("Start-up and exit tricks"); tests/unit/test_private_internals.py fails when a guarded name disappears.

The guard compares versions as strings (`platform.python_version()`, Prefect's distribution version): a new
release, a patch release included, takes the public path until someone measures it and adds it here.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import platform
import sys
import threading
from typing import NoReturn

MEASURED_PYTHON = ("3.11.7",)  # the CPython releases `exit_now`'s order was measured and read on

# What `exit_now` calls that CPython does not document: (module, attribute).
PYTHON_PRIVATE_NAMES = (("threading", "_shutdown"), ("atexit", "_run_exitfuncs"))


def measured(version: str, measured_on: tuple[str, ...], names: tuple[tuple[str, str], ...]) -> bool:
    """True when `version` is one the trick was measured on and every private name it uses is still there."""
    if version not in measured_on:
        return False
    return all(hasattr(importlib.import_module(module), attr) for module, attr in names)


def fast_exit_applies(version: str | None = None) -> bool:
    return measured(version or platform.python_version(), MEASURED_PYTHON, PYTHON_PRIVATE_NAMES)


def exit_now(code: int) -> NoReturn:
    """Exit with `code` without the interpreter's teardown (freeing ~775,000 objects: 2.6 s of a tiny run),
    after doing what CPython's exit does before it, in its order (Py_FinalizeEx, 3.11): `threading._shutdown`
    (the hooks of threading._register_atexit run: concurrent.futures' executors shut down, Prefect's event loop
    threads told to stop; then the other non-daemon threads are joined), the atexit handlers (servers stopped,
    MLflow runs ended, Prefect's log and event queues drained, logging flushed), stdout and stderr flushed; then
    `os._exit`. Joining the threads without those hooks left the temporary Prefect server ignoring its SIGTERM
    until Prefect's 5 s wait ran out (benchmarks/cold_run.py: exit 5.4 s after the last output, 0.3–0.4 s with
    them). On a Python it was not measured on: `sys.exit(code)`, the interpreter's own full exit."""
    if not fast_exit_applies():
        sys.exit(code)
    threading._shutdown()  # type: ignore[attr-defined]  # CPython-private (Lib/threading.py), not in typeshed
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing left to tell anyone
            stream.flush()
    os._exit(code)
