"""MLflow tracking: one parent run per pipeline run, one child run per unit (DESIGN.md §6).

Uses MlflowClient with explicit run ids (no fluent "active run"), because units run in threads.
Everything logged passes through `redact`, so no credential reaches a param, tag or artifact.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

from enginefoundry.errors import PipelineError

_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN", "HF_TOKEN",
               "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")
_USERINFO = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)[^/@\s]+@")


def redact(value: Any) -> str:
    text = str(value)
    text = _USERINFO.sub(r"\g<scheme>***@", text)
    for name in _SECRET_ENV:
        secret = os.environ.get(name)
        if secret and len(secret) >= 6:
            text = text.replace(secret, "***")
    return text


def flatten(prefix: str, data: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in data.items():
        name = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict):
            out.update(flatten(name, v))
        else:
            out[name] = redact(v)[:6000]
    return out


def project_git_commit() -> str:
    try:
        root = Path(__file__).resolve().parent.parent
        return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class Tracker:
    def __init__(self, tracking_uri: str, experiment: str) -> None:
        from mlflow.tracking import MlflowClient

        self.uri = tracking_uri
        if tracking_uri.startswith("sqlite:///"):
            db = Path(tracking_uri.removeprefix("sqlite:///"))
            db.parent.mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(tracking_uri=tracking_uri)
        try:
            exp = self.client.get_experiment_by_name(experiment)
            if exp is None:
                artifact_location = None
                if tracking_uri.startswith("sqlite:///"):
                    # Keep local artifacts beside the database, not in ./mlruns of whatever cwd.
                    artifact_location = (db.parent.resolve() / "mlartifacts").as_uri()
                self.experiment_id = self.client.create_experiment(experiment, artifact_location=artifact_location)
            else:
                self.experiment_id = exp.experiment_id
        except Exception as err:
            raise PipelineError(
                f"tracking: cannot use MLflow at {redact(tracking_uri)} ({type(err).__name__}); start the server "
                "or point MLFLOW_TRACKING_URI (or --mlflow-uri, tracking.mlflow_uri) at a reachable one"
            ) from None

    def start_run(self, name: str, tags: dict[str, Any], parent_id: str | None = None) -> str:
        all_tags = {k: redact(v) for k, v in tags.items()}
        if parent_id:
            all_tags["mlflow.parentRunId"] = parent_id
        run = self.client.create_run(self.experiment_id, run_name=name, tags=all_tags)
        return run.info.run_id

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        flat = flatten("", params)
        items = [Param(k, v) for k, v in flat.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[i : i + 100])

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        for k, v in tags.items():
            self.client.set_tag(run_id, k, redact(v))

    def log_metrics(self, run_id: str, metrics: dict[str, float | int | bool], step: int = 0) -> None:
        import time

        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        items = [Metric(k, float(v), ts, step) for k, v in metrics.items() if v is not None]
        for i in range(0, len(items), 500):
            self.client.log_batch(run_id, metrics=items[i : i + 500])

    def log_artifact(self, run_id: str, path: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(run_id, str(path), artifact_path)

    def end_run(self, run_id: str, ok: bool) -> None:
        self.client.set_terminated(run_id, status="FINISHED" if ok else "FAILED")

    def run_url(self, run_id: str) -> str:
        return f"{redact(self.uri)}#/experiments/{self.experiment_id}/runs/{run_id}"


def ensure_registered_model(client: Any, name: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException:
        client.create_registered_model(name, description="enginefoundry serving artifacts, one version per unit")


def register_unit(
    tracker: Tracker, *, registered_model: str, unit_name: str, run_id: str, artifact_uri: str,
    tags: dict[str, str], params: dict[str, Any], alias: str | None,
) -> str:
    """An external MLflow model pointing at the store (weights never travel through MLflow), a version of
    the registered model, and the alias moved to it. Returns the version number."""
    client = tracker.client
    ensure_registered_model(client, registered_model)
    clean_tags = {k: redact(v) for k, v in tags.items()}
    # LoggedModel names may not contain dots; unit names do (variant.profile.target).
    logged = client.create_logged_model(tracker.experiment_id, name=unit_name.replace(".", "-"), source_run_id=run_id,
                                        tags=clean_tags, params=flatten("", params), model_type="enginefoundry-unit")
    version = client.create_model_version(registered_model, source=artifact_uri, run_id=run_id, tags=clean_tags,
                                          model_id=logged.model_id,
                                          description=f"{unit_name}: {tags.get('enginefoundry.manifest_uri', '')}")
    # The model's files are in the store and the version exists: READY, not Pending.
    client.finalize_logged_model(logged.model_id, "READY")
    if alias:
        client.set_registered_model_alias(registered_model, alias, version.version)
    return str(version.version)
