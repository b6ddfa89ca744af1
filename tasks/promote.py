"""Stages of a rollout: is the source new, and promote or hold each alias stem's candidate."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from enginefoundry.promotion import Decision, PromotionPolicy, Registry, decide_promotions
from enginefoundry.run_summary import UnitOutcome
from enginefoundry.source_change import ChangeReport, detect_change
from enginefoundry.spec import BuildSpec
from enginefoundry.tasks._log import progress_logger
from enginefoundry.tasks._retry import NETWORK_RETRIES
from enginefoundry.tasks.events import emit_registry_move


@task(name="detect new source", cache_policy=NO_CACHE, **NETWORK_RETRIES)
def detect_source_change(spec: BuildSpec, targets: list[str] | None) -> ChangeReport:
    report = detect_change(spec, Registry(spec.tracking.mlflow_uri), targets)
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
