"""`make stack` as a user runs it: a default run of `build-engines/manual` (`prefect deployment run`, no
parameters) lands in the stack's MLflow server and SeaweedFS, because the worker's environment (EF_STORE,
MLFLOW_TRACKING_URI) outranks the spec's local paths; both servers keep their state in the stack's PostgreSQL. Its
own stack (scripts/stack.py, temp state dir, free ports), deployment.yaml deployed as is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from enginefoundry.catalog.gpu_targets import pools
from enginefoundry.model_server import free_port
from tests.support.cluster import prefect_http
from tests.support.paths import REPO
from tests.support.private_stack import private_stack, stack_database

PREFECT = str(Path(sys.executable).parent / "prefect")
POOLS = tuple(pools())  # the GPU target table's pools, cpu first, as deployment.yaml declares them

pytestmark = pytest.mark.services


@pytest.fixture
def user_stack(tmp_path: Path) -> Iterator[dict[str, str]]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PREFECT_", "MLFLOW_", "AWS_", "EF_", "HF_ENDPOINT"))}
    env |= {f"EF_{name}_PORT": str(free_port()) for name in ("S3", "MLFLOW", "PREFECT", "HUB")}
    env |= {"EF_WORK_DIR": str(tmp_path / "work"), "OMP_NUM_THREADS": "1", "EF_STACK_READY_TIMEOUT_S": "300"}
    # `make stack` in two steps, so that a busy machine starts the Prefect server within its deadline.
    with private_stack(tmp_path / "stack", env, [("s3,mlflow,hub", ""), ("prefect", "cpu")]) as stack_env:
        yield {**stack_env, "PROJECT_DIR": str(REPO)}


def _prefect(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PREFECT, "--no-prompt", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)


def test_a_default_ui_run_publishes_to_the_stacks_store_and_mlflow(user_stack: dict[str, str], tmp_path: Path) -> None:
    env = user_stack
    for pool in POOLS[1:]:  # `make deploy`: the pools first (cpu exists: its worker runs)
        _prefect(env, "work-pool", "create", pool, "--type", "process")
    deployed = _prefect(env, "deploy", "--prefect-file", "deployment.yaml", "--all")
    assert deployed.returncode == 0, deployed.stdout[-2000:] + deployed.stderr[-2000:]
    started = _prefect(env, "deployment", "run", "build-engines/manual")
    assert started.returncode == 0, started.stdout + started.stderr
    flow_run_id = next(line.split()[-1] for line in started.stdout.splitlines() if "UUID" in line)

    api = env["PREFECT_API_URL"]
    deadline = time.monotonic() + 1200
    with prefect_http(api) as http:
        while True:
            run = http.get(f"/flow_runs/{flow_run_id}").json()
            if run["state_type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") or time.monotonic() > deadline:
                break
            time.sleep(3)
        logs = http.post("/logs/filter", json={"logs": {"flow_run_id": {"any_": [flow_run_id]}}}).json()
    assert run["state_type"] == "COMPLETED", run["state"]
    messages = "\n".join(entry["message"] for entry in logs)
    assert "store: s3://enginefoundry/store (from environment EF_STORE)" in messages
    assert f"mlflow_uri: {env['MLFLOW_TRACKING_URI']} (from environment MLFLOW_TRACKING_URI)" in messages

    import boto3
    from mlflow.tracking import MlflowClient

    s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL_S3"], region_name="us-east-1",
                      aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket="enginefoundry", Prefix="store/manifests/")
    keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
    pointers = [k for k in keys if k.endswith("/current.json")]  # publish.pointer_key: one per published unit
    assert pointers, keys[:20]
    for pointer in pointers:  # each pointer names a build manifest that exists in the same store
        target = json.loads(s3.get_object(Bucket="enginefoundry", Key=pointer)["Body"].read())
        assert f"{pointer.rsplit('/', 1)[0]}/{target['build_id']}.json" in keys, target
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("enginefoundry-demo")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    assert any(r.data.tags.get("enginefoundry.manifest_uri", "").startswith("s3://enginefoundry/store/") for r in runs)
    # Both servers keep their state in the stack's PostgreSQL (issue 40), each in its own database.
    with stack_database(tmp_path / "stack", "mlflow") as mlflow_db:
        found = mlflow_db.execute("SELECT run_uuid FROM runs WHERE experiment_id = %s",
                                  (int(experiment.experiment_id),)).fetchall()
    assert {r.info.run_id for r in runs} == {row[0] for row in found}
    with stack_database(tmp_path / "stack", "prefect") as prefect_db:
        state = prefect_db.execute("SELECT state_type::text FROM flow_run WHERE id = %s::uuid", (flow_run_id,))
        assert state.fetchone() == ("COMPLETED",)
