"""The start-up and exit tricks on private internals (enginefoundry/_startup.py, orchestration/_prefect_private.py): at
the installed versions every private name they use is still there (this fails the day an upgrade removes one),
and a version they were not measured on takes the public path."""

from __future__ import annotations

import importlib
import platform
import sys

import pytest

from enginefoundry import _startup
from enginefoundry.flows.prefect_server import _prefect_private as pp


def test_installed_python_is_a_measured_one_and_its_private_names_exist() -> None:
    assert platform.python_version() in _startup.MEASURED_PYTHON, (
        f"Python {platform.python_version()} is not one the exit was measured on: measure it "
        "(docs/scale.md, 'Start-up and exit tricks') and add it to _startup.MEASURED_PYTHON, or accept the slower exit")
    for module, attr in _startup.PYTHON_PRIVATE_NAMES:
        assert callable(getattr(importlib.import_module(module), attr)), f"{module}.{attr} is gone"
    assert _startup.fast_exit_applies()


@pytest.mark.parametrize("version", ["3.9.0", "3.9.2", "4.0.0", "3.11.7"])
def test_an_unmeasured_prefect_takes_the_public_path(version: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from enginefoundry.flows.prefect_server import ephemeral

    assert not pp.prefect_tricks_apply(version)
    monkeypatch.setattr(pp, "prefect_version", lambda: version)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    assert ephemeral.start_early_server() is None  # Prefect starts its own server, as it does by default
    assert pp.guard_server_subprocess(ephemeral._GuardedSubprocess) is False


@pytest.mark.parametrize("version", ["3.11.6", "3.11.8", "3.12.7", "3.13.0"])
def test_an_unmeasured_python_exits_through_sys_exit(version: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert not _startup.fast_exit_applies(version)
    monkeypatch.setattr(platform, "python_version", lambda: version)
    monkeypatch.setattr(_startup.os, "_exit", lambda code: pytest.fail("os._exit on an unmeasured Python"))
    with pytest.raises(SystemExit) as exited:
        _startup.exit_now(3)
    assert exited.value.code == 3


def test_a_missing_private_name_takes_the_public_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(sys.modules["threading"], "_shutdown")
    assert not _startup.fast_exit_applies(platform.python_version())
