"""Cluster mode against a real Prefect server: deployment.yaml deployed as is, process workers on three pools,
the build deployment triggered through the API. Each unit must run on the worker of its target's pool, the
parent must see every result, a pool's units must be sent no faster than its limit lets them run (none refused
for want of a slot), and a worker without the target's GPU must refuse its unit. The fan-out spec has a LoRA adapter
(issue 36, adapter_mode merge): each worker fetches it and merges it into the base as embedded mode does, and each
unit is gated, published and registered with the adapter's lineage."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from enginefoundry.catalog.gpu_targets import pools
from tests.support.adapters import ADAPTERS
from tests.support.cluster import (
    GPU_POOL,
    SECOND_POOL,
    PrefectServer,
    seed_unique_model,
    write_spec,
)
from tests.support.paths import TINY_MODEL

pytestmark = pytest.mark.services


def two_pool_targets() -> list[dict[str, object]]:
    # The other targets differ in their SKU lists only so that each unit has its own key (target identity is
    # arch + SKUs + GPU count): otherwise one build would serve them all. Two units on pool cpu, whose deployment
    # takes one at a time: the parent sends the second when the first ends (flows/dispatch.py).
    return [{"name": "cpu", "arch": "cpu", "gpu_count": 0},
            {"name": "cpu-b", "arch": "cpu", "gpu_count": 0, "sku": ["second-pool"], "work_pool": SECOND_POOL},
            {"name": "cpu-c", "arch": "cpu", "gpu_count": 0, "sku": ["second-unit"]}]


def test_deployments_from_deployment_yaml(cluster: PrefectServer) -> None:
    with cluster.client() as http:
        deps = {d["name"]: d for d in http.post("/deployments/filter", json={}).json()}
        flows = {f["id"]: f["name"] for f in http.post("/flows/filter", json={}).json()}
    names = {f"{flows[d['flow_id']]}/{n}" for n, d in deps.items()}
    assert {"build-engines/manual", "rollout/scheduled"} | {f"build-unit/{p}" for p in pools()} <= names
    for pool in pools():
        unit = deps[pool]
        assert unit["work_pool_name"] == pool
        assert unit["global_concurrency_limit"]["limit"] == 1  # one build per GPU
        assert unit["concurrency_options"]["collision_strategy"] == "ENQUEUE"
    manual = deps["manual"]
    assert manual["parameters"]["mode"] == "cluster"
    form = manual["parameter_openapi_schema"]["properties"]
    assert {"spec_path", "spec", "targets", "force", "mode"} <= set(form)
    assert form["mode"]["enum"] == ["embedded", "cluster"]
    rollout = deps["scheduled"]
    assert rollout["schedules"][0]["schedule"]["cron"] == "0 3 * * *"
    assert rollout["schedules"][0]["active"] is False  # deployed paused: no Scheduled runs until turned on
    assert rollout["parameters"]["min_throughput_ratio"] == 0.9
    assert form_type(rollout, "max_ttft_p95_factor") == "number"


def stamp(text: str) -> datetime:
    return datetime.fromisoformat(text)


def form_type(deployment: dict[str, object], name: str) -> str:
    schema = deployment["parameter_openapi_schema"]  # type: ignore[index]
    return schema["properties"][name]["type"]  # type: ignore[index]


def test_build_fans_out_to_each_targets_pool(cluster: PrefectServer, stack, s3, tmp_path: Path, unique: str) -> None:
    repo_id = f"tiny-org/cluster-{unique}"
    sha = seed_unique_model(Path(stack["EF_HUB_ROOT"]), repo_id, tmp_path, f"cluster {unique}")
    store = f"s3://enginefoundry/cluster-{unique}"
    spec = write_spec(tmp_path, source=f"hf://{repo_id}@main", store=store, mlflow_uri=stack["MLFLOW_TRACKING_URI"],
                      experiment=f"cluster-{unique}", targets=two_pool_targets(),
                      registered_model=f"tiny-chat-{unique}", benchmark=False,  # about placement, not speed
                      adapters={"plus-one": ADAPTERS / "plus-one"})  # one unit per target: the base ⊕ plus-one

    parent_id = cluster.run_deployment("build-engines/manual", {"spec_path": str(spec)})
    parent = cluster.wait(parent_id, timeout_s=900)
    assert parent["state_type"] == "COMPLETED", parent["state"]

    children = {c["name"]: c for c in cluster.children(parent_id)}
    placed = {"fp32-tp1+plus-one.chat.cpu": "cpu", "fp32-tp1+plus-one.chat.cpu-b": SECOND_POOL,
              "fp32-tp1+plus-one.chat.cpu-c": "cpu"}
    assert set(children) == {f"unit {u}" for u in placed}
    for unit_name, pool in placed.items():
        child = children[f"unit {unit_name}"]
        assert child["state_type"] == "COMPLETED"
        assert child["work_pool_name"] == pool
        assert child["labels"]["prefect.worker.name"] == cluster.workers[pool]
        assert child["parameters"]["source"]["revision"] == sha  # identity travels, weights do not
        assert set(child["parameters"]) == {"spec", "unit", "key_components", "source", "parent_run_id", "replace"}
        assert len(json.dumps(child["parameters"])) < 64_000
    # Pool cpu takes one unit at a time: its second unit run was created only once the first had ended, and no
    # unit run was refused a slot (no AwaitingConcurrencySlot in any run's states).
    on_cpu = [children[f"unit {u}"] for u, p in placed.items() if p == "cpu"]
    first, second = sorted(on_cpu, key=lambda c: stamp(c["created"]))
    assert first["end_time"] and stamp(first["end_time"]) <= stamp(second["created"]), (first, second)
    with cluster.client() as http:
        for child in children.values():
            states = http.get("/flow_run_states/", params={"flow_run_id": child["id"]}).json()
            assert "AwaitingConcurrencySlot" not in {s["name"] for s in states}, (child["name"], states)

    # The parent saw every result: its summary table lists both units as candidates.
    artifacts = cluster.artifacts(parent_id)
    summary = json.loads(artifacts["build-summary-tiny-cpu"]["data"])
    assert {r["unit"]: r["status"] for r in summary} == dict.fromkeys(placed, "candidate")
    matrix = json.loads(artifacts["matrix-tiny-cpu"]["data"])
    assert {r["unit"]: r["runs on"] for r in matrix} == {u: f"build-unit/{p}" for u, p in placed.items()}
    assert "s3://" in artifacts["gates-tiny-cpu"]["data"]  # manifests as URIs, not payloads

    # Each unit was published with its serving files, built on the worker of its pool.
    listing = s3.list_objects_v2(Bucket="enginefoundry", Prefix=f"cluster-{unique}/manifests/")["Contents"]
    docs = [json.loads(s3.get_object(Bucket="enginefoundry", Key=o["Key"])["Body"].read()) for o in listing
            if not o["Key"].endswith("/current.json")]
    manifests = [d for d in docs if "unit" in d]
    assert len(manifests) == 3
    for manifest in manifests:
        assert manifest["status"] == "candidate"
        assert manifest["source"]["uri"] == f"hf://{repo_id}@main" and manifest["source"]["revision"] == sha
        assert {"serving/serve.sh", "serving/serve.yaml"} <= {f["path"] for f in manifest["files"]}
        assert manifest["prefect_flow_run_id"] in {c["id"] for c in children.values()}
    assert_adapter_units(manifests, stack["MLFLOW_TRACKING_URI"], f"tiny-chat-{unique}")


def assert_adapter_units(manifests: list[dict], mlflow_uri: str, registered_model: str) -> None:
    """Each unit built on its worker from the base ⊕ plus-one: the adapter's digest in its key, gated (against the
    merged checkpoint's own reference: its source is the merge, not the base), its lineage in the manifest, MLflow
    run and registered version (alias <target>-plus-one-candidate)."""
    from mlflow import MlflowClient

    from enginefoundry import tracking_tags as mltags

    client = MlflowClient(mlflow_uri)
    for manifest in manifests:
        adapter = manifest["key_components"]["adapter"]
        assert adapter["name"] == "plus-one" and adapter["mode"] == "merge"
        source = manifest["source"]
        assert source["identity"]["adapter"]["uri"].endswith("adapters/plus-one")
        assert source["identity"]["adapter"]["weights_digest"] == adapter["weights_digest"]
        assert source["identity"]["base_weights_digest"] == manifest["key_components"]["weights_digest"]
        assert source["weights_digest"] not in (adapter["weights_digest"], source["identity"]["base_weights_digest"])
        assert manifest["smoke"]["smoke_passed"] is True
        target = manifest["unit"].rsplit(".", 1)[1]
        version = client.get_model_version_by_alias(registered_model, f"{target}-plus-one-candidate")
        assert version.run_id == manifest["mlflow_run_id"]
        assert version.tags[mltags.ADAPTER] == "plus-one"
        assert version.tags[mltags.ADAPTER_DIGEST] == adapter["weights_digest"]
        assert version.tags[mltags.BASE_WEIGHTS_DIGEST] == source["identity"]["base_weights_digest"]
        assert client.get_run(manifest["mlflow_run_id"]).data.tags[mltags.ADAPTER_URI].endswith("adapters/plus-one")


def test_worker_without_the_targets_gpu_refuses(cluster: PrefectServer, stack, tmp_path: Path, unique: str) -> None:
    spec = write_spec(tmp_path, source=str(TINY_MODEL), store=f"s3://enginefoundry/refuse-{unique}",
                      mlflow_uri=stack["MLFLOW_TRACKING_URI"], experiment=f"refuse-{unique}",
                      targets=[{"name": "h100", "arch": "sm90", "sku": ["H100"], "gpu_count": 1}])
    payload = {**yaml.safe_load(spec.read_text()), "base_dir": str(spec.parent)}
    source = {"uri": str(TINY_MODEL), "kind": "local", "weights_digest": "0" * 64, "tokenizer_digest": "0" * 64}
    run_id = cluster.run_deployment(f"build-unit/{GPU_POOL}", {
        "spec": payload, "unit": "fp32-tp1.chat.h100", "key_components": {}, "source": source,
        "parent_run_id": f"refuse-{unique}"})
    run = cluster.wait(run_id, timeout_s=180)
    assert run["state_type"] == "FAILED"
    assert run["labels"]["prefect.worker.name"] == cluster.workers[GPU_POOL]
    assert "target h100 needs 1× sm90" in run["state"]["message"]
    assert "run this unit on a worker of pool gpu-sm90" in run["state"]["message"]
    # Refused before any work: no fetch, convert or build task ran.
    tasks = cluster.task_runs(run_id)
    assert tasks and all(t["name"].startswith("check placement") for t in tasks)
