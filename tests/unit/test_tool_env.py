"""runner.tool_env and runner.every: what a tool's environment and progress notes are made of (no process)."""

from __future__ import annotations

import pytest

from enginefoundry import runner
from enginefoundry.runner import NOT_FOR_TOOLS, every, tool_env


def test_a_none_value_unsets_a_variable_and_secrets_never_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("EF_TEST_KEPT", "kept")
    for name in NOT_FOR_TOOLS:
        monkeypatch.setenv(name, "secret")
    env = tool_env({"HF_HUB_OFFLINE": None, "OMP_NUM_THREADS": "1", next(iter(NOT_FOR_TOOLS)): "again"})
    assert "HF_HUB_OFFLINE" not in env  # AIPerf's offline-tokenizer bug: unset for the tool (bench/aiperf.py)
    assert env["OMP_NUM_THREADS"] == "1" and env["EF_TEST_KEPT"] == "kept"
    assert not set(NOT_FOR_TOOLS) & set(env)  # not even when a caller names one


def test_every_passes_one_note_per_period(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(runner.time, "monotonic", lambda: clock[0])
    notes: list[str] = []
    note = every(30, notes.append)
    for t in (110, 120, 130, 140, 150, 160, 170):  # run_tool's notes, every 10 s
        clock[0] = t
        note(f"t={t}")
    assert notes == ["t=130", "t=160"]
