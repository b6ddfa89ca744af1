"""Stage: record the run and each unit in MLflow.

These tasks carry no Prefect retries: every MLflow call is retried once, at the client wrapper
(enginefoundry.records.tracking.RetryingClient, which states the bound); a retried task would multiply it."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from enginefoundry import tracking_tags as mltags
from enginefoundry.bench import SweepReport
from enginefoundry.evidence.attest import tags_for
from enginefoundry.evidence.signing import run_policy, signer_from_env
from enginefoundry.inputs.sources import SourceSnapshot
from enginefoundry.inputs.units import Unit
from enginefoundry.records.registration import ensure_registered, version_tags
from enginefoundry.records.run_records import (
    context_tags,
    finish_parent,
    mlflow_run_link,
    record_hit,
    start_parent,
    tracker_for,
)
from enginefoundry.records.run_summary import RunSummary, UnitOutcome
from enginefoundry.records.tracking import Tracker, project_git_commit
from enginefoundry.spec import BuildSpec
from enginefoundry.store.manifest import Manifest
from enginefoundry.store.publish import PublishedBuild
from enginefoundry.tasks._log import progress_logger
from enginefoundry.tasks.cancel_watch import stop_if_cancelled


def prefect_context() -> dict[str, str]:
    try:
        from prefect.context import get_run_context
        from prefect.settings import PREFECT_UI_URL

        ctx = get_run_context()
        flow_run = getattr(ctx, "flow_run", None)
        if flow_run is None:
            return {}
        ui = PREFECT_UI_URL.value()
        return {mltags.PREFECT_FLOW_RUN_ID: str(flow_run.id),
                mltags.PREFECT_FLOW_RUN_URL: f"{ui}/runs/flow-run/{flow_run.id}" if ui else ""}
    except Exception:
        return {}


# How each MLflow backend store words a unique-index refusal: SQLite "UNIQUE constraint failed", PostgreSQL
# (psycopg.errors.UniqueViolation) "duplicate key value violates unique constraint", MySQL "Duplicate entry".
UNIQUE_VIOLATION_WORDS = ("unique constraint", "duplicate entry")


def unique_violation(err: BaseException) -> bool:
    """The tracking server refused an insert on a unique index (another run inserted the same row first)."""
    text = str(err).lower()
    return any(w in text for w in UNIQUE_VIOLATION_WORDS)


def log_prompt_set(tracker: Tracker, run_id: str, spec: BuildSpec) -> str:
    """The smoke prompt set as an MLflow dataset input (source and digest, context "smoke"). Returns its digest."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag

    from enginefoundry.smoke.prompts import prompt_set_digest

    path = spec.resolve_path(spec.smoke.prompts)
    digest = prompt_set_digest(path)
    with warnings.catch_warnings():  # "can be interpreted in multiple ways": both are the local source
        warnings.simplefilter("ignore")
        source = resolve_dataset_source(str(path))
    # mlflow 3.17 marks Dataset.profile @abstractmethod without ABCMeta: MetaDataset instantiates at runtime
    dataset = MetaDataset(source, name=path.stem, digest=digest[:36])  # type: ignore[abstract]
    inputs = [DatasetInput(dataset=dataset._to_mlflow_entity(), tags=[InputTag("mlflow.data.context", "smoke")])]
    for attempt in range(3):
        try:
            tracker.client.log_inputs(run_id, datasets=inputs)
            break
        except Exception as err:
            # Units of one run on two workers log the same dataset at once: the server inserts it for one and
            # refuses the other on its unique (experiment, name, digest) index. The dataset exists then, and
            # the next call only links it to this run.
            if not unique_violation(err) or attempt == 2:
                raise
    tracker.set_tags(run_id, {mltags.PROMPTS_DIGEST: digest})
    return digest


@task(name="start MLflow run", cache_policy=NO_CACHE)
def start_parent_run(spec: BuildSpec, source: SourceSnapshot) -> str:
    return start_parent(tracker_for(spec), spec, source.model_dump(mode="json"), prefect_context())


@task(name="start unit MLflow run", cache_policy=NO_CACHE)
def start_unit_run(spec: BuildSpec, parent_id: str, unit_name: str,
                   params: dict[str, Any],  # JSON edge: MLflow run params
                   tags: dict[str, Any]) -> str:  # JSON edge: MLflow run tags
    tracker = tracker_for(spec)
    run_id = tracker.start_run(unit_name, {**tags, **context_tags(), **prefect_context(),
                                           mltags.GIT_COMMIT: project_git_commit()}, parent_id)
    tracker.log_params(run_id, params)
    log_prompt_set(tracker, run_id, spec)
    return run_id


@task(name="record unit", cache_policy=NO_CACHE)
def record_unit(
    spec: BuildSpec, run_id: str, *, ok: bool, tags: dict[str, Any],  # JSON edge: MLflow run tags
    metrics: dict[str, float],
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
def finish_parent_run(spec: BuildSpec, run_id: str, summary: RunSummary, duration_s: float, fetch_s: float,
                      convert_s: float) -> None:
    finish_parent(tracker_for(spec), run_id, summary, duration_s=duration_s, fetch_s=fetch_s, convert_s=convert_s)


@task(name="register unit in MLflow", cache_policy=NO_CACHE)
def register_published_unit(spec: BuildSpec, unit: Unit, manifest: Manifest, manifest_uri: str, run_id: str,
                            manifest_sha256: str = "") -> str:
    """A registered-model version per published build (idempotent: keyed by its manifest URI, anchored by its
    manifest's sha256); `<stem>-candidate` (promotion.alias_stems) moves to it when its gates pass."""
    stop_if_cancelled("registration")
    tracker = tracker_for(spec)
    tags = version_tags(spec, unit, manifest, manifest_uri, mlflow_run_link(spec, run_id), prefect_context(),
                        manifest_sha256)
    # Signer and attestation digests; "signed" only for a signer the run's policy trusts (signing.run_policy).
    signature = tags_for(manifest_uri, spec.publish.s3_endpoint_url, run_policy(spec, signer_from_env()))
    tracker.set_tags(run_id, signature)
    tags.update(signature)
    reg = ensure_registered(tracker, spec, unit=unit, manifest=manifest,
                            manifest_uri=manifest_uri, run_id=run_id,
                            tags=tags, move_alias=True)
    if reg.refused:
        progress_logger("warning")(f"register: {unit.name}: {reg.refused}")
    return reg.version


@task(name="record cache hit", task_run_name="cache hit {unit.name}", cache_policy=NO_CACHE)
def record_cache_hit(spec: BuildSpec, unit: Unit, key: str, hit: PublishedBuild, parent_run_id: str) -> UnitOutcome:
    """A unit run for the hit; a missing registration or alias of the published unit is repaired."""
    return record_hit(tracker_for(spec), spec, unit, key, hit, parent_run_id, prefect_context())
