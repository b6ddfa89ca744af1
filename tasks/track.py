"""Stage: record the run and each unit in MLflow."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from enginefoundry.bench import SweepReport
from enginefoundry.manifest import Manifest
from enginefoundry.plan import Unit
from enginefoundry.spec import BuildSpec
from enginefoundry.tracking import Tracker, project_git_commit, register_unit


def tracker_for(spec: BuildSpec) -> Tracker:
    return Tracker(spec.tracking.mlflow_uri, spec.tracking.experiment)


def prefect_context() -> dict[str, str]:
    try:
        from prefect.context import get_run_context
        from prefect.settings import PREFECT_UI_URL

        ctx = get_run_context()
        flow_run = getattr(ctx, "flow_run", None)
        if flow_run is None:
            return {}
        ui = PREFECT_UI_URL.value()
        return {"prefect.flow_run_id": str(flow_run.id),
                "prefect.flow_run_url": f"{ui}/runs/flow-run/{flow_run.id}" if ui else ""}
    except Exception:
        return {}


@task(name="start MLflow run", cache_policy=NO_CACHE)
def start_parent_run(spec: BuildSpec, source: dict[str, Any]) -> str:
    tracker = tracker_for(spec)
    # Runs a kill -9-ed run of this host left RUNNING end KILLED now: no run stays RUNNING for ever.
    tracker.end_dead_runs()
    tags = {"enginefoundry.spec": spec.name, "enginefoundry.lane": spec.lane,
            "enginefoundry.git_commit": project_git_commit(), "source.uri": source["uri"],
            "source.revision": source.get("revision") or "", **prefect_context()}
    run_id = tracker.start_run(f"{spec.name}", tags)
    tracker.log_params(run_id, {"spec": spec.model_dump(mode="json", exclude={"base_dir"}),
                                "source.weights_digest": source["weights_digest"],
                                "source.tokenizer_digest": source["tokenizer_digest"]})
    return run_id


@task(name="start unit MLflow run", cache_policy=NO_CACHE)
def start_unit_run(spec: BuildSpec, parent_id: str, unit_name: str, params: dict[str, Any],
                   tags: dict[str, Any]) -> str:
    tracker = tracker_for(spec)
    run_id = tracker.start_run(unit_name, {**tags, **prefect_context(),
                                           "enginefoundry.git_commit": project_git_commit()}, parent_id)
    tracker.log_params(run_id, params)
    return run_id


@task(name="record unit", cache_policy=NO_CACHE)
def record_unit(
    spec: BuildSpec, run_id: str, *, ok: bool, tags: dict[str, Any], metrics: dict[str, float],
    sweep: SweepReport | None, artifacts: list[str],
) -> None:
    tracker = tracker_for(spec)
    tracker.set_tags(run_id, tags)
    tracker.log_metrics(run_id, metrics)
    if sweep is not None:
        for point in sweep.points:
            tracker.log_metrics(run_id, {f"bench.{point.scenario}.{k}": v for k, v in point.metrics().items()},
                                step=point.concurrency)
    for path in artifacts:
        p = Path(path)
        if p.is_file():
            tracker.log_artifact(run_id, p, "reports")
    tracker.end_run(run_id, ok)


@task(name="finish MLflow run", cache_policy=NO_CACHE)
def finish_parent_run(spec: BuildSpec, run_id: str, ok: bool, summary: dict[str, Any],
                      metrics: dict[str, float], report_dir: str) -> None:
    tracker = tracker_for(spec)
    tracker.log_metrics(run_id, metrics)
    out = Path(report_dir) / "summary.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2))
    tracker.log_artifact(run_id, out)
    tracker.end_run(run_id, ok)


@task(name="register unit in MLflow", cache_policy=NO_CACHE)
def register_published_unit(spec: BuildSpec, unit: Unit, manifest: Manifest, manifest_uri: str, run_id: str) -> str:
    """A registered-model version per published unit; `<target>-candidate` moves to it when its gates pass."""
    tags = {
        "enginefoundry.key": manifest.key, "enginefoundry.target": unit.target.name,
        "enginefoundry.arch": unit.target.arch.value, "enginefoundry.lane": manifest.lane,
        "enginefoundry.status": manifest.status, "enginefoundry.manifest_uri": manifest_uri,
        "enginefoundry.source_revision": manifest.source.get("revision") or "",
        "enginefoundry.source_uri": manifest.source.get("uri", ""),
        **{f"enginefoundry.version.{k}": v for k, v in manifest.versions.items()},
    }
    alias = f"{unit.target.name}-candidate" if manifest.status == "candidate" else None
    return register_unit(tracker_for(spec), registered_model=spec.registered_model_name, unit_name=unit.name,
                         run_id=run_id, artifact_uri=manifest_uri.rsplit("/", 1)[0], tags=tags,
                         params=manifest.build_params, alias=alias)
