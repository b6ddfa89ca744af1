"""No MLflow run stays RUNNING and no LoggedModel stays PENDING: a failure ends runs FAILED, Ctrl-C and SIGTERM
end them KILLED, a kill -9-ed process's runs are ended KILLED by the next run; LoggedModels end READY/FAILED."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from enginefoundry.records.tracking import Tracker, UnitVersion, register_unit

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import os, signal, sys, time
from enginefoundry.records.tracking import Tracker
mode, uri = sys.argv[1], sys.argv[2]
tracker = Tracker(uri, "ends")
parent = tracker.start_run("parent", {})
tracker.start_run("child", {}, parent)
print("started", flush=True)
if mode == "error":
    raise RuntimeError("the pipeline failed")
if mode == "sigterm":
    os.kill(os.getpid(), signal.SIGTERM)
if mode == "sigint":
    os.kill(os.getpid(), signal.SIGINT)
if mode == "kill9":
    time.sleep(600)
time.sleep(5)
"""


def _statuses(uri: str) -> dict[str, str]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("ends")
    return {r.info.run_name: r.info.status for r in client.search_runs([exp.experiment_id])}


@pytest.mark.parametrize(("mode", "status"), [("error", "FAILED"), ("sigterm", "KILLED"), ("sigint", "KILLED")])
def test_open_runs_end_with_the_way_the_process_ends(tmp_path: Path, mode: str, status: str) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode, uri], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode != 0 and "started" in done.stdout, done.stderr[-2000:]
    assert _statuses(uri) == {"parent": status, "child": status}


def test_runs_of_a_kill_9_process_are_ended_killed_by_the_next_run(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, "kill9", uri], cwd=REPO, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
    tracker = Tracker(uri, "ends")
    assert tracker.end_dead_runs() == []  # alive: left alone
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert _statuses(uri) == {"parent": "RUNNING", "child": "RUNNING"}
    assert len(tracker.end_dead_runs()) == 2
    assert _statuses(uri) == {"parent": "KILLED", "child": "KILLED"}
    mine = tracker.start_run("mine", {})
    assert tracker.end_dead_runs() == []  # a live run of this process is not touched
    tracker.end_run(mine, ok=True)


def test_logged_models_end_ready_or_failed(tmp_path: Path) -> None:
    from mlflow.entities import LoggedModelStatus

    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "ends")
    run_id = tracker.start_run("unit", {})
    version = register_unit(tracker, UnitVersion(unit_name="fp32-tp1.chat.cpu", run_id=run_id,
                                                 artifact_uri="file:///store/x", tags={"t": "1"}, params={"p": 1}),
                            registered_model="tiny", alias="cpu-candidate")
    assert version == "1"
    # "latest" is a reserved alias: the real registry refuses it, so registration fails after the LoggedModel.
    from mlflow.exceptions import MlflowException

    with pytest.raises(MlflowException):
        register_unit(tracker, UnitVersion(unit_name="fp32-tp1.chat.cpu", run_id=run_id, artifact_uri="file:///store/y",
                                           tags={}, params={}), registered_model="tiny", alias="latest")
    tracker.end_run(run_id, ok=True)
    models = tracker.client.search_logged_models(experiment_ids=[tracker.experiment_id])
    assert sorted(m.status for m in models) == sorted([LoggedModelStatus.READY, LoggedModelStatus.FAILED])


EXIT_WITH_SERVER_GONE = """
from mlflow.tracking import MlflowClient
from enginefoundry.records.tracking import OPEN_RUNS
OPEN_RUNS.add("0" * 32, MlflowClient(tracking_uri="http://127.0.0.1:" + __import__("sys").argv[1]))
"""


def test_exit_with_the_server_gone_asks_once_instead_of_retrying_for_minutes() -> None:
    """A run still open at exit whose MLflow server is down (killed, or a test's server already stopped): the exit
    tries once and goes. With MLflow's default retries (7, backoff factor 2) it took minutes and printed a
    "Retrying" warning per attempt."""
    from enginefoundry.model_server import free_port

    port = free_port()  # nothing listens on it: connection refused, as with a killed server
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_HTTP_REQUEST")}
    done = subprocess.run([sys.executable, "-c", EXIT_WITH_SERVER_GONE, str(port)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Retrying" not in done.stderr, done.stderr[-2000:]

