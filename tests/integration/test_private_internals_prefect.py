"""Prefect's private names the start-up tricks use exist in the installed release (importing Prefect's server starts a
process: moved out of tests/unit/test_private_internals.py)."""

from __future__ import annotations

import inspect
import subprocess

from enginefoundry.flows.prefect_server import _prefect_private as pp
from enginefoundry.flows.prefect_server.ephemeral import _GuardedSubprocess


def test_installed_prefect_is_a_measured_one_and_its_private_names_exist() -> None:
    assert pp.prefect_version() in pp.MEASURED_PREFECT, (
        f"Prefect {pp.prefect_version()} is not one the start-up tricks were measured on: read "
        "orchestration/_prefect_private.py against its source, measure, and add it to MEASURED_PREFECT")
    assert pp.prefect_tricks_apply()
    assert pp.private_names_present()
    from prefect.server.api import server

    assert server.subprocess is subprocess or isinstance(server.subprocess, _GuardedSubprocess)
    for name in pp.SERVER_METHODS:
        assert hasattr(server.SubprocessASGIServer, name), f"SubprocessASGIServer.{name} is gone"
    init_and_start = inspect.getsource(server.SubprocessASGIServer.__init__) + inspect.getsource(
        server.SubprocessASGIServer.start)
    for state in pp.SERVER_STATE:
        assert f"self.{state} =" in init_and_start, f"SubprocessASGIServer no longer sets self.{state}"
    assert "if not self.running:" in inspect.getsource(server.SubprocessASGIServer.start)  # start trusts `running`
    command = inspect.getsource(server.SubprocessASGIServer._run_uvicorn_command)
    for key, value in pp.UVICORN_ENVIRONMENT.items():
        assert f'"{key}": "{value}"' in command, f"_run_uvicorn_command no longer sets {key}={value}"
    assert "subprocess.Popen(" in command and "create_app" in command
