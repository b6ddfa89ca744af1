"""What a build run records in MLflow beside its units: the parent run (spec, source identity), the cache
hits (a unit run naming the run that built the unit, and a repaired registration), and the end of the run
(metrics and summary.json). Shared by the Prefect tasks (tasks/track.py) and the all-hits fast path
(enginefoundry/planning/noop_run.py), so both record the same. No Prefect here.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from enginefoundry import tracking_tags as mltags
from enginefoundry.inputs.units import Unit
from enginefoundry.records.outcomes import hit_outcome, hit_run_tags, unit_manifest_of, unit_params
from enginefoundry.records.registration import ensure_registered, version_tags
from enginefoundry.records.run_summary import RunSummary, UnitOutcome
from enginefoundry.records.tracking import Tracker, mlflow_client, project_git_commit, redact
from enginefoundry.settings import work_root
from enginefoundry.spec import BuildSpec
from enginefoundry.store.publish import PublishedBuild
from enginefoundry.store.unit_status import UnitStatus


def tracker_for(spec: BuildSpec) -> Tracker:
    return Tracker(spec.tracking.mlflow_uri, spec.tracking.experiment)


def prepare_tracking(spec: BuildSpec) -> None:
    """Pay MLflow's start-up before the run needs it, where it can overlap other work (the CLI calls it while
    the temporary Prefect server starts): import the client and, for a SQLite URI, create and migrate the file
    and the experiment (~2.5–8 s for a new file on this 2-core host; later Trackers of this process reuse
    MLflow's cached store). A failure is left to the run's own tracking task, which retries and reports it."""
    if not spec.tracking.mlflow_uri.startswith("sqlite:"):
        import mlflow.tracking  # noqa: F401  (the import alone; a server is reached by the run itself)

        return
    with contextlib.suppress(Exception):
        tracker_for(spec)


def mlflow_run_link(spec: BuildSpec, run_id: str) -> str:
    """A link a person can open: the run's page on an MLflow server, else `runs:/<id>` in the local store."""
    uri = spec.tracking.mlflow_uri
    if not uri.startswith(("http://", "https://")):
        return f"runs:/{run_id}"
    try:
        experiment = mlflow_client(uri).get_run(run_id).info.experiment_id
    except Exception:
        return f"runs:/{run_id}"
    return f"{redact(uri).rstrip('/')}/#/experiments/{experiment}/runs/{run_id}"


def context_tags() -> dict[str, str]:
    """MLflow's standard context tags, from MLflow's own context registry (user, source type), with this
    project as the source and its git commit, so the UI shows who ran what from which commit."""
    from mlflow.tracking.context.registry import resolve_tags

    tags = {k: v for k, v in resolve_tags().items()
            if k in (mltags.MLFLOW_USER, mltags.MLFLOW_SOURCE_TYPE, mltags.MLFLOW_GIT_COMMIT)}
    tags[mltags.MLFLOW_SOURCE_NAME] = "enginefoundry"
    commit = project_git_commit()
    if commit != "unknown":
        tags[mltags.MLFLOW_GIT_COMMIT] = commit
    return tags


# JSON edge: the manifest's source field, as published
def start_parent(tracker: Tracker, spec: BuildSpec, source: dict[str, Any], extra_tags: dict[str, str]) -> str:
    # Runs a kill -9-ed run of this host left RUNNING end KILLED now: no run stays RUNNING for ever.
    tracker.end_dead_runs()
    tags = {mltags.SPEC: spec.name, mltags.LANE: spec.lane,
            mltags.GIT_COMMIT: project_git_commit(), mltags.SOURCE_URI: source["uri"],
            mltags.SOURCE_REVISION: source.get("revision") or "",
            mltags.WEIGHTS_DIGEST: source["weights_digest"], mltags.TOKENIZER_DIGEST: source["tokenizer_digest"],
            **context_tags(), **extra_tags}
    run_id = tracker.start_run(f"{spec.name}", tags)
    tracker.log_params(run_id, {"spec": spec.model_dump(mode="json", exclude={"base_dir"}),
                                "source.weights_digest": source["weights_digest"],
                                "source.tokenizer_digest": source["tokenizer_digest"]})
    return run_id


def record_hit(
    tracker: Tracker, spec: BuildSpec, unit: Unit, key: str, hit: PublishedBuild, parent_run_id: str | None,
    extra_tags: dict[str, str] | None = None,
) -> UnitOutcome:
    """A unit run for a cache hit (which run built it, where it lies), and a repaired registration."""
    manifest = unit_manifest_of(hit)
    from enginefoundry.evidence.attest import tags_for
    from enginefoundry.evidence.signing import run_policy, signer_from_env

    # Signer and attestation digests of the build: "signed" only for a signer the run's policy trusts.
    signature = tags_for(hit.uri, spec.publish.s3_endpoint_url, run_policy(spec, signer_from_env()))
    run_id = tracker.start_run(unit.name, {**hit_run_tags(key, hit), **context_tags(), **(extra_tags or {}),
                                           mltags.GIT_COMMIT: project_git_commit(), **signature}, parent_run_id)
    tracker.log_params(run_id, unit_params(spec, unit))
    tracker.log_metrics(run_id, {"cache_hit": 1.0})
    built_by = manifest.mlflow_run_id or run_id
    reg = ensure_registered(tracker, spec, unit=unit, manifest=manifest,
                            manifest_uri=hit.uri, run_id=run_id,
                            tags={**version_tags(spec, unit, manifest, hit.uri, mlflow_run_link(spec, built_by),
                                                 extra_tags or {}, hit.manifest_sha256), **signature},
                            move_alias=False)
    if reg.created or reg.alias_set:
        tracker.set_tags(run_id, {mltags.REGISTRY_REPAIRED: f"version {reg.version}"
                                  + (f", alias {reg.alias}" if reg.alias_set else "")})
    tracker.end_run(run_id, manifest.status == UnitStatus.CANDIDATE)
    return hit_outcome(unit, key, hit, run_id)


def report_dir(parent_run_id: str) -> Path:
    """A run's local report folder (its summary.json before it is logged): `<work folder>/runs/<parent run id>`."""
    return work_root() / "runs" / parent_run_id


def finish_parent(tracker: Tracker, run_id: str, summary: RunSummary, *, duration_s: float, fetch_s: float,
                  convert_s: float) -> None:
    """The end of a parent run, the flow's and the fast path's alike: its metrics (`run_metrics`), summary.json
    as an artifact, and FINISHED when every unit passed (else FAILED)."""
    tracker.log_metrics(run_id, run_metrics(summary, duration_s, fetch_s, convert_s))
    out = report_dir(run_id) / "summary.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary.model_dump(mode="json"), indent=2))
    tracker.log_artifact(run_id, out)
    tracker.end_run(run_id, summary.ok)


def run_metrics(summary: RunSummary, duration_s: float, fetch_s: float, convert_s: float) -> dict[str, float]:
    return {"units": len(summary.outcomes), "units_ok": sum(o.ok for o in summary.outcomes),
            "duration_s": duration_s, "fetch_s": fetch_s, "convert_s": convert_s}
