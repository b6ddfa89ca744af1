"""Runs started together on one new SQLite tracking file: each opens it, one creates the schema, all
proceed (without the lock in tracking.Tracker, alembic fails in the others: "expected to match one row …
in 'alembic_version'" or "table _alembic_tmp_experiments already exists")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO

OPEN_AND_RUN = """
import sys
from enginefoundry.records.tracking import Tracker
tracker = Tracker(sys.argv[1], "together")
run = tracker.start_run("r", {})
tracker.end_run(run, ok=True)
print(tracker.experiment_id)
"""


def test_three_processes_open_one_new_sqlite_file(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    procs = [subprocess.Popen([sys.executable, "-c", OPEN_AND_RUN, uri], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outputs = [p.communicate(timeout=300) for p in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-3000:]
    assert len({out.strip() for out, _ in outputs}) == 1  # one experiment, whoever created it
