"""The all-hits run's pending records: a file is recorded by one recorder only, and what a killed recorder
held is given back for the next run."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from enginefoundry import noop_run


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EF_WORK_DIR", str(tmp_path / "work"))
    noop_run.pending_dir().mkdir(parents=True)
    return noop_run.pending_dir()


def test_a_claimed_file_is_not_recorded_twice(work: Path):
    assert noop_run.record_pending(work / "gone.json") is None  # another recorder renamed it first


def test_a_killed_recorders_file_is_given_back_and_young_files_are_left_alone(work: Path):
    stuck = work / "20260101T000000-abc.4242.recording"
    stuck.write_text("{}")
    old = time.time() - 3600
    os.utime(stuck, (old, old))
    young = work / "20260101T000001-def.json"
    young.write_text("{}")
    assert noop_run.flush_pending(min_age_s=7200) == 0
    assert sorted(p.name for p in work.iterdir()) == ["20260101T000000-abc.json", young.name]
