"""Stages of a rollout: is the source new, and promote or hold each alias stem's candidate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from enginefoundry.build.units import toolchain_identity
from enginefoundry.errors import ToolError
from enginefoundry.lanes import get_lane
from enginefoundry.records.promotion import Decision, PromotionPolicy, Registry, decide_promotions
from enginefoundry.records.run_summary import UnitOutcome, work_root
from enginefoundry.records.tracking import Tracker
from enginefoundry.rollout.compare import ComparisonRow, comparison_rows, markdown
from enginefoundry.rollout.source_change import ChangeReport, detect_change
from enginefoundry.rollout.toolchain_channel import with_channel
from enginefoundry.spec import BuildSpec
from enginefoundry.tasks._log import progress_logger
from enginefoundry.tasks._retry import NETWORK_RETRIES
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
    report = detect_change(spec, Registry(spec.tracking.mlflow_uri), targets, current_toolchain(spec))
    log = progress_logger()
    log(f"rollout: source {report.source.describe()}")
    for row in report.targets:
        log(f"rollout: {row.target}: {'NEW' if row.changed else 'nothing new'}: {row.reason}")
    return report


@task(name="promote or hold", cache_policy=NO_CACHE, **NETWORK_RETRIES)
def promote_units(spec: BuildSpec, targets: list[str] | None, policy: PromotionPolicy,
                  outcomes: list[UnitOutcome]) -> list[Decision]:
    """The promotion rule (promotion.decide_promotions) for every alias stem of these targets, built by this
    rollout or not; one event per registry move."""
    log = progress_logger()
    notes = {o.unit: [f"this build: unit {o.status}: {o.reason or 'no manifest'}"] for o in outcomes if not o.ok}
    decisions = decide_promotions(spec, Registry(spec.tracking.mlflow_uri), policy, targets, notes)
    for decision in decisions:
        log(f"rollout: {decision.stem}: {decision.action.upper()} {decision.unit}: {'; '.join(decision.reasons)}")
        if decision.move is not None:
            move = decision.move
            emit_registry_move(move.registered_model, move.stem, move.action, move.champion, move.previous,
                               move.detail)
    return decisions


@task(name="compare old and new", cache_policy=NO_CACHE, **NETWORK_RETRIES)
def compare_rebuilt(spec: BuildSpec, decisions: list[Decision], policy: PromotionPolicy, stems: set[str],
                    parent_run_id: str | None) -> list[ComparisonRow]:
    """Old vs new per rebuilt target: written to the build's run folder and logged to its MLflow parent run
    (artifacts rollout/comparison.json and .md)."""
    rows = comparison_rows(Registry(spec.tracking.mlflow_uri), spec.registered_model_name, decisions, policy, stems)
    if parent_run_id and rows:
        folder = work_root() / "runs" / parent_run_id / "rollout"
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
