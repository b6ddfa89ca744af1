"""Every use of a private internal of Prefect, in one place, guarded by the exact Prefect release it was read
and measured on (`enginefoundry/_startup.py` holds Python's; this module sits in the flows layer because the
domain never imports Prefect). On any other release `prefect_tricks_apply` is False and the callers
(orchestration/ephemeral.py) leave Prefect to start and stop its temporary API server itself, as it does by default.
What each trick saves today: docs/scale.md ("Start-up and exit tricks"); tests/unit/test_private_internals.py
fails when a name used here disappears from the installed Prefect.

The internals, all of `prefect/server/api/server.py@3.9.1`:
- the module's `subprocess` global, through which `SubprocessASGIServer._run_uvicorn_command` starts the server
  (`guard_server_subprocess`);
- the state of a `SubprocessASGIServer` (`port`, `server_process`, `running`) that `start` sets and then trusts
  (`adopt_as_prefects_server`);
- the command and environment of `_run_uvicorn_command` (`uvicorn_environment`), repeated to start the server
  early.
"""

from __future__ import annotations

import atexit
from importlib import metadata
from typing import Any

from enginefoundry._startup import measured

MEASURED_PREFECT = ("3.9.1",)

# (module, attribute) this module relies on, checked by `prefect_tricks_apply` and by the unit test.
PREFECT_PRIVATE_NAMES = (
    ("prefect.server.api.server", "subprocess"),
    ("prefect.server.api.server", "SubprocessASGIServer"),
)
# Attributes of a SubprocessASGIServer instance (set in __init__/start) and the methods whose behaviour we copy.
SERVER_STATE = ("port", "server_process", "running")
SERVER_METHODS = ("start", "stop", "_run_uvicorn_command", "address")
# The environment `_run_uvicorn_command` gives the server (prefect/server/api/server.py@3.9.1, lines 1179–1190).
UVICORN_ENVIRONMENT = {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}


def prefect_version() -> str | None:
    """The installed Prefect's release, read from its distribution's metadata: importing Prefect costs seconds,
    and the early server is started before anything imports it."""
    try:
        return metadata.version("prefect")
    except metadata.PackageNotFoundError:
        return None


def prefect_tricks_apply(version: str | None = None) -> bool:
    """True on a Prefect release the tricks were measured on. The private names are checked too once Prefect's
    server module is imported (never imported here just for that)."""
    version = version or prefect_version()
    return version is not None and measured(version, MEASURED_PREFECT, ())


def private_names_present() -> bool:
    """Every private name of PREFECT_PRIVATE_NAMES there (imports Prefect's server module)."""
    return measured(MEASURED_PREFECT[0], MEASURED_PREFECT, PREFECT_PRIVATE_NAMES)


def guard_server_subprocess(guarded: Any) -> bool:
    """Replace the `subprocess` module that Prefect's server module starts its server through with `guarded(real)`
    (once); False, nothing replaced, on a release it was not measured on."""
    if not prefect_tricks_apply() or not private_names_present():
        return False
    from prefect.server.api import server as prefect_server

    # The ignores below: `subprocess` is the server module's own import, which Prefect does not re-export; it is the
    # private name this trick replaces (checked by private_names_present).
    if not isinstance(prefect_server.subprocess, guarded):  # type: ignore[attr-defined]
        prefect_server.subprocess = guarded(prefect_server.subprocess)  # type: ignore[attr-defined]
    return True


def adopt_as_prefects_server(server: Any, port: int, proc: Any) -> None:
    """Make `server` (the port-less `SubprocessASGIServer` that `get_client` starts without PREFECT_API_URL) the
    running server `proc` on `port`: its `start` then does nothing, and its `stop`, registered with atexit as
    `start` registers it, stops `proc`."""
    server.port, server.server_process, server.running = port, proc, True
    atexit.register(server.stop)
