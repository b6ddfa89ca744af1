"""The benchmark client is found in its own environment first: $EF_AIPERF, then .venv-bench, then PATH."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from enginefoundry.bench import ToolMissingError
from enginefoundry.bench import aiperf as tool


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_ef_aiperf_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    own = executable(tmp_path / "bench-env" / "bin" / "aiperf")
    monkeypatch.setenv("EF_AIPERF", str(own))
    assert tool._tool_path("aiperf") == str(own)
    monkeypatch.setenv("EF_AIPERF", str(tmp_path / "missing"))
    with pytest.raises(ToolMissingError, match=r"EF_AIPERF=.*is not an executable file"):
        tool._tool_path("aiperf")


def test_bench_venv_then_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EF_AIPERF", raising=False)
    monkeypatch.setattr(tool, "PROJECT_DIR", tmp_path / "project")  # no .venv-bench there
    monkeypatch.setattr(tool.sys, "executable", str(tmp_path / "core" / "bin" / "python"))
    monkeypatch.chdir(tmp_path)
    on_path = executable(tmp_path / "path-bin" / "aiperf")
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert tool._tool_path("aiperf") == str(on_path)
    in_venv = executable(tmp_path / ".venv-bench" / "bin" / "aiperf")
    assert tool._tool_path("aiperf") == str(in_venv)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    in_venv.unlink()
    with pytest.raises(ToolMissingError, match=r"make bench-venv.*or set EF_AIPERF"):
        tool._tool_path("aiperf")
