"""Stages of a rollout: is the source new, and promote or hold each alias stem's candidate."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect import task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from enginefoundry import tracking_tags as mltags
from enginefoundry.bench.noise import SideBySide
from enginefoundry.errors import ToolError
from enginefoundry.inputs.units import expand_units, toolchain_identity
from enginefoundry.lanes import get_lane
from enginefoundry.records.promotion import Decision, PromotionPolicy, Registry, alias_stems, decide_promotions
from enginefoundry.records.run_records import report_dir
from enginefoundry.records.run_summary import UnitOutcome
from enginefoundry.records.tracking import Tracker
from enginefoundry.records.tracking import end_orphaned_runs as end_runs
from enginefoundry.rollout.compare import ComparisonRow, comparison_rows, markdown
from enginefoundry.rollout.source_change import ChangeReport, detect_change
from enginefoundry.rollout.toolchain_channel import with_channel
from enginefoundry.schemas.manifest import ToolchainIdentity
from enginefoundry.spec import BuildSpec
from enginefoundry.tasks._log import progress_logger
from enginefoundry.tasks._retry import NETWORK_RETRIES
from enginefoundry.tasks.cancel_watch import stop_if_cancelled
from enginefoundry.tasks.events import emit_registry_move


def current_toolchain(spec: BuildSpec) -> dict[str, Any]:  # JSON edge: as manifests record key_components.toolchain
    """This run's toolchain identity (as a unit key records it); without the lane's toolchain on this host, the
    spec's pinned release and image digest only."""
    try:
        versions: dict[str, str] | None = get_lane(spec.lane).versions()
    except ToolError:
        versions = None
    identity = toolchain_identity(spec, versions or {})
    return {**identity, "versions": None} if versions is None else identity


@task(name="read the toolchain channel", cache_policy=NO_CACHE, **NETWORK_RETRIES)
def follow_channel(spec: BuildSpec) -> BuildSpec:
    """The spec with its toolchain channel's current value (toolchain_channel.with_channel); unchanged without one.
    A wrong document is an InputError; an unreadable one fails the rollout (transient reads are retried)."""
    resolved, doc = with_channel(spec)
    if doc is not None:
        progress_logger()(f"rollout: toolchain channel {spec.toolchain.channel}: {doc.describe()}")
    return resolved


@task(name="detect new source or toolchain", cache_policy=NO_CACHE, **NETWORK_RETRIES)
def detect_source_change(spec: BuildSpec, targets: list[str] | None) -> ChangeReport:
    report = detect_change(spec, Registry(spec.tracking.mlflow_uri), targets,
                           ToolchainIdentity.model_validate(current_toolchain(spec)))
    log = progress_logger()
    log(f"rollout: source {report.describe()}")
    for row in report.targets:
        log(f"rollout: {row.target}: {'NEW' if row.changed else 'nothing new'}: {row.reason}")
    return report


@task(name="record the rollout's trigger", cache_policy=NO_CACHE)  # MLflow only: retried at its client wrapper
def record_trigger(spec: BuildSpec, change: ChangeReport, parent_run_id: str) -> None:
    """Why this rollout built, on the build's MLflow parent run: tags (mltags.ROLLOUT_TRIGGER, and
    ROLLOUT_ADAPTERS when an adapter's new revision is part of it) and artifact rollout/change.json."""
    folder = report_dir(parent_run_id) / "rollout"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "change.json").write_text(change.model_dump_json(indent=2))
    tracker = Tracker(spec.tracking.mlflow_uri, spec.tracking.experiment)
    adapters = ",".join(change.changed_adapters)[:5000]
    tracker.set_tags(parent_run_id, {mltags.ROLLOUT_TRIGGER: change.trigger() or "forced build",
                                     **({mltags.ROLLOUT_ADAPTERS: adapters} if adapters else {})})
    tracker.log_artifact(parent_run_id, folder / "change.json", "rollout")


@task(name="compare champion and candidate side by side", cache_policy=NO_CACHE)
def measure_side_by_side(spec: BuildSpec, targets: list[str] | None, policy: PromotionPolicy) -> list[SideBySide]:
    """Per alias stem whose gated candidate the rule will compare with its champion: both builds served on this
    worker and benchmarked in alternating rounds (rollout.side_by_side), where this worker can serve them."""
    from enginefoundry.records.alias_lineage import unit_lineage
    from enginefoundry.rollout.side_by_side import measure, not_servable_here, pending_comparison
    from enginefoundry.settings import work_root

    log = progress_logger()
    registry, stems, out = Registry(spec.tracking.mlflow_uri), alias_stems(spec), []
    for unit in expand_units(spec, targets):
        pending = pending_comparison(registry, spec.registered_model_name, stems[unit.name], unit.name,
                                     unit_lineage(spec, unit))
        if pending is None:
            continue
        why_not = not_servable_here(unit)
        if why_not:
            log(f"compare: {pending.stem}: not measured side by side here: {why_not}")
            continue
        log(f"compare: {pending.stem}: champion v{pending.champion_version} and candidate "
            f"v{pending.candidate_version} side by side, {policy.comparison_rounds} rounds")
        result = measure(spec, unit, pending, registry, policy, work_root() / "compare" / pending.stem, log)
        if result.note:
            log(f"compare: {pending.stem}: {result.note}")
        out.append(result)
    if out:
        rows = [{"target": m.stem, "round": str(t.round), "unit": t.role,
                 "version": m.champion_version if t.role == "champion" else m.candidate_version,
                 "output tok/s": f"{t.output_tokens_per_s or 0:.1f}", "TTFT p95 ms": f"{t.ttft_ms_p95 or 0:.0f}",
                 "valid": "yes" if t.valid else "no"} for m in out for t in m.trials]
        key = f"side-by-side-{re.sub(r'[^a-z0-9]+', '-', spec.name.lower()).strip('-')}"[:100]
        create_table_artifact(key=key, table=rows, description=f"{spec.name}: champion and candidate measured side "
                                                               "by side (alternating rounds)")
    return out


@task(name="promote or hold", cache_policy=NO_CACHE)  # MLflow only: retried at its client wrapper
def promote_units(spec: BuildSpec, targets: list[str] | None, policy: PromotionPolicy,
                  outcomes: list[UnitOutcome], measured: list[SideBySide] | None = None) -> list[Decision]:
    """The promotion rule (promotion.decide_promotions) for every alias stem of these targets, built by this
    rollout or not; one event per registry move."""
    stop_if_cancelled("promotion")
    log = progress_logger()
    notes = {o.unit: [f"this build: unit {o.status}: {o.reason or 'no manifest'}"] for o in outcomes if not o.ok}
    decisions = decide_promotions(spec, Registry(spec.tracking.mlflow_uri), policy, targets, notes,
                                  {m.stem: m for m in measured or []})
    for decision in decisions:
        log(f"rollout: {decision.stem}: {decision.action.upper()} {decision.unit}: {'; '.join(decision.reasons)}")
        if decision.move is not None:
            move = decision.move
            emit_registry_move(move.registered_model, move.stem, move.action, move.champion, move.previous,
                               move.detail)
    return decisions


@task(name="compare old and new", cache_policy=NO_CACHE)  # MLflow only: retried at its client wrapper
def compare_rebuilt(spec: BuildSpec, decisions: list[Decision], policy: PromotionPolicy, stems: set[str],
                    parent_run_id: str | None, measured: list[SideBySide] | None = None) -> list[ComparisonRow]:
    """Old vs new per rebuilt target: written to the build's run folder and logged to its MLflow parent run
    (artifacts rollout/comparison.json and .md)."""
    rows = comparison_rows(Registry(spec.tracking.mlflow_uri), spec.registered_model_name, decisions, policy, stems,
                           {m.stem: m for m in measured or []})
    if parent_run_id and rows:
        folder = report_dir(parent_run_id) / "rollout"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "comparison.json").write_text(json.dumps([r.model_dump(mode="json") for r in rows], indent=2))
        (folder / "comparison.md").write_text(markdown(f"{spec.name}: old vs new per target", rows))
        tracker = Tracker(spec.tracking.mlflow_uri, spec.tracking.experiment)
        for name in ("comparison.json", "comparison.md"):
            tracker.log_artifact(parent_run_id, Path(folder / name), "rollout")
    log = progress_logger()
    for row in rows:
        cells = {k: v for k, v in row.row().items() if k not in ("target", "decision")}
        log(f"rollout: {row.target}: {row.decision}: " + "; ".join(f"{k} {v}" for k, v in cells.items()))
    return rows


@task(name="end runs of units that never came back", cache_policy=NO_CACHE)
def end_orphaned_runs(spec: BuildSpec) -> list[str]:
    """MLflow runs still RUNNING whose Prefect flow run is over (a unit cancelled or crashed on a worker that
    never came back) end KILLED, on whichever host this rollout runs (records.tracking.end_orphaned_runs)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    tracker = Tracker(spec.tracking.mlflow_uri, spec.tracking.experiment)
    with get_client(sync_client=True) as client:

        def finished(flow_run_id: str) -> str | None:
            try:
                run = client.read_flow_run(UUID(flow_run_id))
            except (ObjectNotFound, ValueError):
                return None  # another Prefect server's run, or none: not this rollout's to judge
            return run.state.name if run.state is not None and run.state.is_final() else None

        ended = end_runs(tracker.client, [tracker.experiment_id], finished)
    if ended:
        progress_logger("warning")(f"rollout: {len(ended)} MLflow run(s) of units that never ended were ended "
                                   f"KILLED: {', '.join(ended)}")
    return ended
