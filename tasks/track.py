"""Stage: record the run and each unit in MLflow."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from enginefoundry import tracking_tags as mltags
from enginefoundry.bench import SweepReport
from enginefoundry.manifest import Manifest
from enginefoundry.plan import Unit
from enginefoundry.promotion import candidate_alias, unit_alias_stem
from enginefoundry.spec import BuildSpec
from enginefoundry.tasks._retry import NETWORK_RETRIES
from enginefoundry.tracking import Tracker, project_git_commit, redact, register_unit


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
        return {mltags.PREFECT_FLOW_RUN_ID: str(flow_run.id),
                mltags.PREFECT_FLOW_RUN_URL: f"{ui}/runs/flow-run/{flow_run.id}" if ui else ""}
    except Exception:
        return {}


def mlflow_run_link(spec: BuildSpec, run_id: str) -> str:
    """A link a person can open: the run's page on an MLflow server, else `runs:/<id>` in the local store."""
    uri = spec.tracking.mlflow_uri
    if not uri.startswith(("http://", "https://")):
        return f"runs:/{run_id}"
    try:
        experiment = tracker_for(spec).client.get_run(run_id).info.experiment_id
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


def log_prompt_set(tracker: Tracker, run_id: str, spec: BuildSpec) -> str:
    """The smoke prompt set as an MLflow dataset input (source and digest, context "smoke"). Returns its digest."""
    import warnings

    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag

    from enginefoundry.smoke.prompts import prompt_set_digest

    path = spec.resolve_path(spec.smoke.prompts)
    digest = prompt_set_digest(path)
    with warnings.catch_warnings():  # "can be interpreted in multiple ways": both are the local source
        warnings.simplefilter("ignore")
        source = resolve_dataset_source(str(path))
    dataset = MetaDataset(source, name=path.stem, digest=digest[:36])
    tracker.client.log_inputs(run_id, datasets=[DatasetInput(dataset=dataset._to_mlflow_entity(),
                                                             tags=[InputTag("mlflow.data.context", "smoke")])])
    tracker.set_tags(run_id, {mltags.PROMPTS_DIGEST: digest})
    return digest


@task(name="start MLflow run", cache_policy=NO_CACHE, **NETWORK_RETRIES)
def start_parent_run(spec: BuildSpec, source: dict[str, Any]) -> str:
    tracker = tracker_for(spec)
    # Runs a kill -9-ed run of this host left RUNNING end KILLED now: no run stays RUNNING for ever.
    tracker.end_dead_runs()
    tags = {mltags.SPEC: spec.name, mltags.LANE: spec.lane,
            mltags.GIT_COMMIT: project_git_commit(), mltags.SOURCE_URI: source["uri"],
            mltags.SOURCE_REVISION: source.get("revision") or "",
            mltags.WEIGHTS_DIGEST: source["weights_digest"], mltags.TOKENIZER_DIGEST: source["tokenizer_digest"],
            **context_tags(), **prefect_context()}
    run_id = tracker.start_run(f"{spec.name}", tags)
    tracker.log_params(run_id, {"spec": spec.model_dump(mode="json", exclude={"base_dir"}),
                                "source.weights_digest": source["weights_digest"],
                                "source.tokenizer_digest": source["tokenizer_digest"]})
    return run_id


@task(name="start unit MLflow run", cache_policy=NO_CACHE, **NETWORK_RETRIES)
def start_unit_run(spec: BuildSpec, parent_id: str, unit_name: str, params: dict[str, Any],
                   tags: dict[str, Any]) -> str:
    tracker = tracker_for(spec)
    run_id = tracker.start_run(unit_name, {**tags, **context_tags(), **prefect_context(),
                                           mltags.GIT_COMMIT: project_git_commit()}, parent_id)
    tracker.log_params(run_id, params)
    log_prompt_set(tracker, run_id, spec)
    return run_id


@task(name="record unit", cache_policy=NO_CACHE, **NETWORK_RETRIES)
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


@task(name="finish MLflow run", cache_policy=NO_CACHE, **NETWORK_RETRIES)
def finish_parent_run(spec: BuildSpec, run_id: str, ok: bool, summary: dict[str, Any],
                      metrics: dict[str, float], report_dir: str) -> None:
    tracker = tracker_for(spec)
    tracker.log_metrics(run_id, metrics)
    out = Path(report_dir) / "summary.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2))
    tracker.log_artifact(run_id, out)
    tracker.end_run(run_id, ok)


def version_tags(spec: BuildSpec, unit: Unit, manifest: Manifest, manifest_uri: str, run_url: str
                 ) -> dict[str, str]:
    """What an auditor asks first, on the model version itself, so `@<stem>-candidate` answers in one hop:
    source and revision, digests, toolchain, gate verdict, the headline throughput, links to the run, the
    manifest and the Prefect flow run."""
    from enginefoundry.bench.report import best_throughput

    best = best_throughput(manifest.benchmark)
    agreement = manifest.smoke.get("smoke_agreement")
    toolchain = manifest.key_components.get("toolchain", {}) if isinstance(manifest.key_components, dict) else {}
    context = prefect_context()
    tags = {
        mltags.KEY: manifest.key, mltags.TARGET: unit.target.name, mltags.ARCH: unit.target.arch.value,
        mltags.LANE: manifest.lane, mltags.STATUS: manifest.status, mltags.MANIFEST_URI: manifest_uri,
        mltags.ALIAS_STEM: unit_alias_stem(spec, unit),
        mltags.SOURCE_URI: manifest.source.get("uri", ""),
        mltags.SOURCE_REVISION: manifest.source.get("revision") or "",
        mltags.WEIGHTS_DIGEST: manifest.source.get("weights_digest", ""),
        mltags.TOKENIZER_DIGEST: manifest.source.get("tokenizer_digest", ""),
        mltags.TOOLCHAIN_IMAGE: "@".join(x for x in (toolchain.get("image"), toolchain.get("image_digest")) if x),
        mltags.GATE_VERDICT: manifest.status + (f": {manifest.status_reason}" if manifest.status_reason else
                                                 ": smoke and benchmark gates passed"),
        mltags.SMOKE_AGREEMENT: "" if agreement is None else f"{float(agreement):.4f}",
        mltags.PROMPTS_DIGEST: manifest.prompts_digest or "",
        mltags.BEST_OUTPUT_TPS: f"{best.output_tokens_per_s:.1f}" if best else "",
        mltags.BEST_AT: best.label() if best else "no benchmark point qualifies",
        mltags.RUN_URL: run_url,
        mltags.PREFECT_FLOW_RUN_ID: context.get(mltags.PREFECT_FLOW_RUN_ID) or manifest.prefect_flow_run_id or "",
        mltags.PREFECT_FLOW_RUN_URL: context.get(mltags.PREFECT_FLOW_RUN_URL, ""),
        **{mltags.version_tag(k): v for k, v in manifest.versions.items()},
    }
    return {k: v for k, v in tags.items() if v}


@task(name="register unit in MLflow", cache_policy=NO_CACHE, **NETWORK_RETRIES)
def register_published_unit(spec: BuildSpec, unit: Unit, manifest: Manifest, manifest_uri: str, run_id: str) -> str:
    """A registered-model version per published unit; `<stem>-candidate` (promotion.alias_stems) moves to it
    when its gates pass."""
    tracker = tracker_for(spec)
    tags = version_tags(spec, unit, manifest, manifest_uri, mlflow_run_link(spec, run_id))
    alias = candidate_alias(unit_alias_stem(spec, unit)) if manifest.status == "candidate" else None
    return register_unit(tracker, registered_model=spec.registered_model_name, unit_name=unit.name,
                         run_id=run_id, artifact_uri=manifest_uri.rsplit("/", 1)[0], tags=tags,
                         params=manifest.build_params, alias=alias)
