"""The whole flow on the tiny spec against real parts: the loopback hub, SeaweedFS and an MLflow server.

It runs the CLI as a user would, then checks what landed: objects and their sha256 in S3, the runs,
params and metrics in MLflow, and the commit sha the revision resolved to.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.services.hub_server import seed_repo
from tests.support.cluster import write_spec
from tests.support.paths import REPO, TINY_MODEL


def _spec(tmp: Path, source: str, store: str, mlflow_uri: str, experiment: str) -> Path:
    return write_spec(tmp, source=source, store=store, mlflow_uri=mlflow_uri, experiment=experiment)


def _run_cli(args: list[str], env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "enginefoundry.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def run_env(stack: dict[str, str], tmp_path: Path) -> dict[str, str]:
    return {**stack, "HF_HOME": str(tmp_path / "hf"), "EF_CACHE_DIR": str(tmp_path / "cache"),
            "EF_WORK_DIR": str(tmp_path / "work"), "PREFECT_HOME": str(tmp_path / "prefect"),
            "HF_HUB_DISABLE_XET": "1"}


def test_tiny_spec_end_to_end_hub_s3_mlflow(stack, run_env, s3, tmp_path, unique):
    repo_id = f"tiny-org/tiny-chat-{unique}"
    sha = seed_repo(Path(stack["EF_HUB_ROOT"]), repo_id, TINY_MODEL)
    store = f"s3://enginefoundry/e2e-{unique}"
    experiment = f"e2e-{unique}"
    spec = _spec(tmp_path, f"hf://{repo_id}@main", store, stack["MLFLOW_TRACKING_URI"], experiment)

    first = _run_cli(["run", str(spec)], run_env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "candidate" in first.stdout

    # S3: one unit build and one converted checkpoint build, each with its pointer; every blob is referenced
    # by one of them and has the size and sha256 its manifest records.
    everything = [o["Key"] for o in s3.list_objects_v2(Bucket="enginefoundry", Prefix=f"e2e-{unique}/")["Contents"]]
    docs = {k: json.loads(s3.get_object(Bucket="enginefoundry", Key=k)["Body"].read()) for k in everything
            if "/manifests/" in k and not k.endswith("/current.json")}
    units = [d for d in docs.values() if "unit" in d]
    checkpoints = [d for d in docs.values() if "unit" not in d]
    assert len(units) == 1 and len(checkpoints) == 1
    assert len([k for k in everything if k.endswith("/current.json")]) == 2
    assert not [k for k in everything if "/leases/" in k]
    manifest = units[0]
    assert manifest["status"] == "candidate"
    assert manifest["source"]["revision"] == sha
    assert manifest["source"]["identity"]["commit_sha"] == sha

    def blob(digest: str) -> str:
        return f"e2e-{unique}/blobs/sha256/{digest[:2]}/{digest}"

    blobs = {k for k in everything if "/blobs/" in k}
    assert blobs == {blob(f["sha256"]) for d in (manifest, checkpoints[0]) for f in d["files"]}
    for entry in manifest["files"]:
        body = s3.get_object(Bucket="enginefoundry", Key=blob(entry["sha256"]))["Body"].read()
        assert len(body) == entry["size"]
        assert hashlib.sha256(body).hexdigest() == entry["sha256"], entry["path"]
    # The bundle's weights are the checkpoint's: stored once.
    assert {f["sha256"] for f in checkpoints[0]["files"] if f["path"].endswith(".safetensors")} <= {
        f["sha256"] for f in manifest["files"]}
    assert any(f["path"] == "bundle/model/model.safetensors" for f in manifest["files"])
    assert manifest["smoke"]["smoke_passed"] is True
    assert manifest["checkpoint_uri"] == f"{store}/manifests/tiny-chat/{manifest['checkpoint_key']}"

    # MLflow: a parent run and one child run with params, tags and metrics.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(stack["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 1
    parent, child = parents[0], children[0]
    assert parent.data.tags["enginefoundry.source_revision"] == sha
    assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert child.data.tags["enginefoundry.key"] == manifest["key"]
    assert child.data.params["variant.precision"] == "fp32"
    assert child.data.params["profile.max_seq_len"] == "256"
    assert child.data.metrics["smoke_agreement"] == 1.0
    ref_key = child.data.tags["enginefoundry.smoke_reference_key"]  # the reference answers the unit was judged by
    assert len(ref_key) == 64 and ref_key[:12] in child.data.tags["enginefoundry.smoke_reference"]
    assert child.data.metrics["build_s"] > 0
    # The smoke stage judged the reference lane's scoring server, so both log-prob checks ran; the benchmark
    # measured `transformers serve`, the server serve.sh starts (issue 24).
    assert child.data.tags["enginefoundry.smoke_server"] == "enginefoundry scoring server"
    assert {"smoke_tf_logprob_mean_abs_diff", "smoke_logprob_mean_abs_diff"} <= set(manifest["smoke"])
    ran = dict(line.split(": ", 1) for line in child.data.tags["enginefoundry.commands"].splitlines())
    assert "-m enginefoundry.smoke.serve" in ran["smoke_serve"] and "--name=tiny-chat" in ran["smoke_serve"]
    assert "transformers serve tiny-chat" in ran["serve"] and "aiperf" in ran["bench"]
    history = client.get_metric_history(child.info.run_id, "bench.short.output_tokens_per_s")
    assert [m.step for m in history] == [2] and history[0].value > 0
    assert manifest["mlflow_run_id"] == child.info.run_id
    artifacts = {a.path for a in client.list_artifacts(child.info.run_id, "reports")}
    assert "reports/manifest.json" in artifacts and "reports/smoke.json" in artifacts

    # A second run of the same spec is all cache hits and points at the run that built the unit.
    second = _run_cli(["run", str(spec), "--wait-for-tracking"], run_env)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "cache hit" in second.stdout
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`enginefoundry.cache_hit` = 'true'")
    assert len(runs) == 1
    assert runs[0].data.tags["enginefoundry.built_by_run"] == child.info.run_id

    # Credentials never reach logs, MLflow params/tags or the manifest.
    secret, key_id = stack["AWS_SECRET_ACCESS_KEY"], stack["AWS_ACCESS_KEY_ID"]
    for run in client.search_runs([exp.experiment_id]):
        blob = json.dumps(run.data.params) + json.dumps(run.data.tags)
        assert secret not in blob and key_id not in blob
    assert secret not in json.dumps(manifest) and key_id not in json.dumps(manifest)
    for text in (first.stdout, first.stderr, second.stdout, second.stderr):
        assert secret not in text and key_id not in text
    for log in Path(run_env["EF_WORK_DIR"]).rglob("*"):
        if log.is_file() and log.suffix in (".log", ".json", ".md", ".txt"):
            content = log.read_text(errors="replace")
            assert secret not in content and key_id not in content, log

    # lineage answers from MLflow and the manifest alone, by registry alias and by key.
    chain = _run_cli(["lineage", "models:/tiny-chat@cpu-candidate", "--json", "--mlflow-uri",
                      stack["MLFLOW_TRACKING_URI"]], run_env)
    assert chain.returncode == 0, chain.stderr
    info = json.loads(chain.stdout)
    assert info["source"]["commit_sha"] == sha and info["artifact"]["key"] == manifest["key"]
    assert info["mlflow"]["unit_run_id"] == child.info.run_id
    by_key = _run_cli(["lineage", manifest["key"][:16], "--json", "--mlflow-uri", stack["MLFLOW_TRACKING_URI"]],
                      run_env)
    if "published in" in by_key.stderr:  # the shared MLflow also holds this key from another test's store
        assert by_key.returncode == 2 and store in by_key.stderr, by_key.stderr
    else:
        assert json.loads(by_key.stdout)["artifact"]["manifest_uri"] == info["artifact"]["manifest_uri"]


def test_two_runs_of_one_spec_at_once_build_and_publish_once(stack, run_env, s3, tmp_path, unique):
    repo_id = f"tiny-org/tiny-chat-{unique}"
    seed_repo(Path(stack["EF_HUB_ROOT"]), repo_id, TINY_MODEL)
    experiment = f"race-{unique}"
    spec = _spec(tmp_path, f"hf://{repo_id}@main", f"s3://enginefoundry/race-{unique}",
                 stack["MLFLOW_TRACKING_URI"], experiment)
    spec_doc = yaml.safe_load(spec.read_text())
    spec_doc["benchmark"]["enabled"] = False  # the race is about build and publish
    spec.write_text(yaml.safe_dump(spec_doc))
    envs = [{**run_env, "EF_WORK_DIR": str(tmp_path / f"work{i}"), "PREFECT_HOME": str(tmp_path / f"p{i}")}
            for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-m", "enginefoundry.cli", "run", str(spec)], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for env in envs]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-2000:] + err[-2000:]
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="enginefoundry", Prefix=f"race-{unique}/")["Contents"]]
    docs = [json.loads(s3.get_object(Bucket="enginefoundry", Key=k)["Body"].read()) for k in keys
            if "/manifests/" in k and not k.endswith("/current.json")]
    assert len([d for d in docs if "unit" in d]) == 1
    assert not [k for k in keys if "/leases/" in k]  # released
    from mlflow.tracking import MlflowClient

    client = MlflowClient(stack["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name(experiment)
    children = [r for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" in r.data.tags]
    assert sorted(r.data.tags["enginefoundry.cache_hit"] for r in children) == ["false", "true"]
    built = [r for r in children if r.data.tags["enginefoundry.cache_hit"] == "false"]
    assert len(built) == 1


def test_unknown_revision_is_an_input_error_before_any_work(stack, run_env, tmp_path, unique):
    repo_id = f"tiny-org/tiny-chat-{unique}"
    seed_repo(Path(stack["EF_HUB_ROOT"]), repo_id, TINY_MODEL)
    spec = _spec(tmp_path, f"hf://{repo_id}@no-such-branch", "file://" + str(tmp_path / "store"),
                 "sqlite:///" + str(tmp_path / "mlflow.db"), "bad-rev")
    result = _run_cli(["run", str(spec)], run_env)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "revision 'no-such-branch' does not exist" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "store").exists()
    assert not any(os.scandir(tmp_path)) or not (tmp_path / "work" / "units").exists()
