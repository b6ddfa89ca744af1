"""A run with a signing key, as a user runs it (the CLI against SeaweedFS, the MLflow server and the Prefect server
of the test stack): the published build verifies with the public key, MLflow carries the signer, and the private
key appears in no output, store object, MLflow record or Prefect log."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from enginefoundry.evidence.attest import TAG_SIGNATURE, TAG_SIGNER
from enginefoundry.evidence.signing import keygen
from tests.support.cluster import write_spec
from tests.support.paths import REPO, TINY_MODEL


def _cli(args: list[str], env: dict[str, str], timeout: int = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "enginefoundry.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _prefect_logs(api_url: str, unit_flow_run_id: str) -> str:
    """The logs of the unit's flow run (where it was published) and of its parent run."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        ids = [unit_flow_run_id]
        parent_task = client.read_flow_run(unit_flow_run_id).parent_task_run_id
        if parent_task is not None:
            ids.append(str(client.read_task_run(parent_task).flow_run_id))
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=ids)))
    return "\n".join(log.message for log in logs)


def test_signed_run_verifies_and_the_key_leaks_nowhere(stack, s3, tmp_path: Path, unique: str):
    key, pub = keygen(tmp_path / "ci")
    pem = key.read_text()
    store = f"s3://enginefoundry/signed-{unique}"
    spec = write_spec(tmp_path, source=str(TINY_MODEL), store=store, mlflow_uri=stack["MLFLOW_TRACKING_URI"],
                      experiment=f"signed-{unique}", registered_model=f"signed-{unique}", benchmark=False)
    env = {**stack, "HF_HOME": str(tmp_path / "hf"), "EF_CACHE_DIR": str(tmp_path / "cache"),
           "EF_WORK_DIR": str(tmp_path / "work"), "HF_HUB_DISABLE_XET": "1",
           "ENGINEFOUNDRY_SIGNING_KEY": pem, "ENGINEFOUNDRY_SIGNER_NAME": "e2e-ci"}
    run = _cli(["run", str(spec)], env)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert "signing: new builds signed by e2e-ci" in run.stdout

    objects = [o["Key"] for o in s3.list_objects_v2(Bucket="enginefoundry", Prefix=f"signed-{unique}/")["Contents"]]
    index = next(k for k in objects if "/attestations/" in k)
    model, key_, build = index.split("/")[-3:]
    uri = f"{store}/manifests/{model}/{key_}/{build}"
    check = _cli(["verify", uri, "--json", "--trusted-key", str(pub)], {**env, "ENGINEFOUNDRY_SIGNING_KEY": ""})
    doc = json.loads(check.stdout)
    assert check.returncode == 0 and doc["signature"]["state"] == "verified", check.stdout + check.stderr

    # MLflow: the unit run and the model version carry the signer.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(stack["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name(f"signed-{unique}")
    runs = client.search_runs([exp.experiment_id])
    versions = client.search_model_versions(f"name = 'signed-{unique}'")
    assert versions and versions[0].tags[TAG_SIGNATURE] == "signed" and "e2e-ci" in versions[0].tags[TAG_SIGNER]
    assert any(r.data.tags.get(TAG_SIGNATURE) == "signed" for r in runs)

    # Prefect: the runs' logs say the build was signed …
    manifest = json.loads(s3.get_object(Bucket="enginefoundry", Key=uri.removeprefix("s3://enginefoundry/"))["Body"]
                          .read())
    logs = _prefect_logs(stack["PREFECT_API_URL"], manifest["prefect_flow_run_id"])
    assert "signed by e2e-ci" in logs

    # … and the private key is nowhere: output, store objects, MLflow records, Prefect logs.
    body_lines = [line for line in pem.splitlines() if "PRIVATE KEY" not in line]
    records = [output, logs, str(client.get_registered_model(f"signed-{unique}").tags)]
    records += [str(v.tags) + v.source for v in versions]
    records += [str(r.data.tags) + str(r.data.params) for r in runs]
    records += [s3.get_object(Bucket="enginefoundry", Key=k)["Body"].read().decode("latin-1") for k in objects
                if "/blobs/" not in k or s3.head_object(Bucket="enginefoundry", Key=k)["ContentLength"] < 1 << 20]
    for line in body_lines:
        assert not any(line in rec for rec in records), "a line of the private key leaked"
