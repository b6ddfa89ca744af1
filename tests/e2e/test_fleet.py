"""A fleet of three specs on the embedded default (one process, Prefect's temporary API, a file:// store, MLflow on
SQLite): two tiny models, each with its own registered model, and one spec whose source does not exist. The two
complete and get their champions, the broken one is a failed row with its reason, the exit code is 1, the per-pool
limit is set and every built unit held one of its slots, and MLflow has one fleet run with both build runs nested
under it."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import yaml
from mlflow.tracking import MlflowClient

REPO = Path(__file__).resolve().parents[2]


def _spec(folder: Path, name: str, tmp: Path, source: Path) -> Path:
    doc = yaml.safe_load((REPO / "configs" / "tiny-cpu.yaml").read_text())
    doc["name"] = name
    doc["model"]["source"] = str(source)
    doc["model"]["name"] = f"tiny-{name}"
    doc["smoke"]["prompts"] = str(REPO / "configs" / "prompts" / "tiny-chat.jsonl")
    doc["benchmark"]["enabled"] = False  # about the fleet, not a benchmark: the gates alone decide
    doc["publish"]["store"] = f"file://{tmp / 'store'}"
    doc["tracking"] = {"mlflow_uri": f"sqlite:///{tmp / 'mlflow.db'}", "experiment": "fleet-e2e",
                       "registered_model": f"tiny-{name}"}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_fleet_of_three_with_one_failing(tmp_path: Path) -> None:
    folder = tmp_path / "fleet"
    folder.mkdir()
    model = REPO / "tests" / "fixtures" / "tiny-chat" / "model"
    for name in ("alpha", "bravo"):
        _spec(folder, name, tmp_path, model)
    _spec(folder, "charlie", tmp_path, tmp_path / "no-such-model")  # fails; alpha and bravo must not care
    env = {**os.environ, "PYTHONPATH": str(REPO), "EF_WORK_DIR": str(tmp_path / "work"),
           "EF_CACHE_DIR": str(tmp_path / "cache"), "PREFECT_HOME": str(tmp_path / "prefect"),
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"}
    for var in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "EF_STORE"):
        env.pop(var, None)
    done = subprocess.run([sys.executable, "-m", "enginefoundry.cli", "--json", "fleet", str(folder), "--name",
                           "e2e", "--pool-limit", "cpu=1"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-5000:]
    summary = json.loads(done.stdout)
    assert summary["ok"] is False and summary["pool_limits"] == {"cpu": 1}
    by_spec = {m["spec"]: m for m in summary["members"]}
    assert [m["spec"] for m in summary["members"]] == ["alpha", "bravo", "charlie"]  # the folder's order
    assert by_spec["charlie"]["status"] == "failed" and "no-such-model" in by_spec["charlie"]["reason"]
    for name in ("alpha", "bravo"):
        assert by_spec[name]["status"] == "promoted", by_spec[name]
        assert by_spec[name]["promoted"] == ["cpu"] and by_spec[name]["build_run_id"]
    # The fleet set the pool's limit on Prefect's server (here the temporary one, its database in PREFECT_HOME), and
    # each built unit's run waited for (and got) one of its slots.
    with contextlib.closing(sqlite3.connect(tmp_path / "prefect" / "prefect.db")) as db:
        limits = db.execute("select name, \"limit\", active_slots from concurrency_limit_v2").fetchall()
        waits = db.execute("select count(*) from log where message like 'pool cpu: waiting for one of its 1 %'")
        assert ("enginefoundry-pool-cpu", 1, 0) in limits
        assert waits.fetchone()[0] == 2

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    for name in ("alpha", "bravo"):  # per-model champions, as a rollout of each spec alone makes them
        assert str(client.get_model_version_by_alias(f"tiny-{name}", "cpu-champion").version) == "1"
    fleet_run = client.get_run(summary["mlflow_run_id"])
    assert fleet_run.info.status == "FAILED" and fleet_run.data.tags["enginefoundry.fleet"] == "e2e"
    assert fleet_run.data.metrics["fleet_promoted"] == 2 and fleet_run.data.metrics["fleet_failed"] == 1
    for name in ("alpha", "bravo"):
        build = client.get_run(by_spec[name]["build_run_id"])
        assert build.data.tags["mlflow.parentRunId"] == fleet_run.info.run_id
        assert build.data.tags["enginefoundry.fleet_run_id"] == fleet_run.info.run_id
    artifacts = {a.path for a in client.list_artifacts(fleet_run.info.run_id, "fleet")}
    assert artifacts == {"fleet/fleet.json", "fleet/fleet.md"}
