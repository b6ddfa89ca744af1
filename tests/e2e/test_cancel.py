"""Cancel means stop (issue 33 §3). A build on the cluster (deployment.yaml deployed as is, process workers) is
cancelled as the Prefect UI's Cancel dialog does it with its defaults ("Cancel all sub flow runs" unticked): the
parent flow run's state set to Cancelling through the API, nothing else. Its unit, benchmarking on another worker,
must stop: nothing published, nothing registered, every MLflow run of the build ended (none RUNNING), the
unit's flow run Cancelled and its server gone.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.support.cluster import PrefectServer, seed_unique_model, write_spec
from tests.support.processes import poll

pytestmark = pytest.mark.services
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "CRASHED"}


def _benchmarking(cluster: PrefectServer, parent_id: str) -> dict | None:
    """The unit's flow run once its benchmark task runs, else None."""
    for child in cluster.children(parent_id):
        if child["state_type"] != "RUNNING":
            continue
        with cluster.client() as http:
            found = http.post("/task_runs/filter", json={"flow_runs": {"id": {"any_": [child["id"]]}}}).json()
        if any(t["name"].startswith("benchmark") and t["state_type"] == "RUNNING" for t in found):
            return child
    return None


def test_cancelling_only_the_parent_stops_its_unit_and_publishes_nothing(cluster: PrefectServer, stack, s3,
                                                                        tmp_path: Path, unique: str) -> None:
    repo_id = f"tiny-org/cancel-{unique}"
    seed_unique_model(Path(stack["EF_HUB_ROOT"]), repo_id, tmp_path, f"cancel {unique}")
    store, model, experiment = f"s3://enginefoundry/cancel-{unique}", f"tiny-chat-{unique}", f"cancel-{unique}"
    spec = write_spec(tmp_path, source=f"hf://{repo_id}@main", store=store, mlflow_uri=stack["MLFLOW_TRACKING_URI"],
                      experiment=experiment, registered_model=model)
    data = yaml.safe_load(spec.read_text())
    data["benchmark"].update({"concurrency": [1], "request_count": 400})  # long enough to cancel during it
    spec.write_text(yaml.safe_dump(data))

    parent_id = cluster.run_deployment("build-engines/manual", {"spec_path": str(spec)})
    deadline = time.monotonic() + 600
    unit = None
    while unit is None:
        assert time.monotonic() < deadline, "the unit never reached its benchmark"
        with cluster.client() as http:
            state = http.get(f"/flow_runs/{parent_id}").json()["state_type"]
        assert state not in FINAL, f"the build ended {state} before it could be cancelled"
        unit = _benchmarking(cluster, parent_id)
        time.sleep(1)

    # What the UI's dialog sends with its defaults: the parent's state, Cancelling; the unit is not named.
    with cluster.client() as http:
        sent = http.post(f"/flow_runs/{parent_id}/set_state",
                         json={"state": {"type": "CANCELLING", "name": "Cancelling"}, "force": False})
        assert sent.status_code in (200, 201) and sent.json()["status"] == "ACCEPT", sent.text
    parent = cluster.wait(parent_id, timeout_s=300)
    child = cluster.wait(unit["id"], timeout_s=300)
    client = MlflowClient(stack["MLFLOW_TRACKING_URI"])
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    # Generous budgets, never timings: a loaded CI machine may take its time to end what the cancel ended.
    poll(lambda: all(r.info.status != "RUNNING" for r in client.search_runs([experiment_id])), timeout_s=60)
    runs = client.search_runs([experiment_id])
    diag = {"parent": parent["state"], "child": child["state"],  # what each run ended as, for a failure
            "runs": {r.info.run_name: (r.info.status, r.data.tags.get("enginefoundry.end_reason")) for r in runs}}
    assert parent["state_type"] == "CANCELLED", diag
    assert child["state_type"] == "CANCELLED", diag

    # Nothing published: no unit manifest under the store (the converted checkpoint may be there).
    listing = s3.list_objects_v2(Bucket="enginefoundry", Prefix=f"cancel-{unique}/manifests/").get("Contents", [])
    docs = [json.loads(s3.get_object(Bucket="enginefoundry", Key=o["Key"])["Body"].read()) for o in listing
            if not o["Key"].endswith("/current.json")]
    assert [d for d in docs if "unit" in d] == []
    # Nothing registered, and no MLflow run of the build left RUNNING: the parent's and the unit's end KILLED.
    assert client.search_model_versions(f"name = '{model}'") == []
    assert runs and {r.info.status for r in runs} <= {"KILLED"}, {r.info.run_name: r.info.status for r in runs}
    assert any(r.data.tags.get("enginefoundry.end_reason", "").startswith("cancelled") for r in runs)
    # The unit's server is gone: no process works in the unit's folder on its worker.
    unit_run = next(r for r in runs if r.data.tags.get("enginefoundry.key"))
    folder = str(cluster.state / "work" / "units" / unit_run.data.tags["enginefoundry.key"][:16])
    assert poll(lambda: not _working_in(folder), timeout_s=60), _working_in(folder)


def _working_in(folder: str) -> list[str]:
    """Processes whose working folder is under `folder` (a unit's server runs in its serve-cwd there)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.readlink(proc / "cwd").startswith(folder):
                command = (proc / "cmdline").read_bytes().replace(b"\0", b" ")[:200]
                found.append(f"{proc.name}: {command!r}")
        except OSError:  # ended meanwhile, or another user's
            continue
    return found
