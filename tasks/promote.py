"""Stage: compare each built unit with its target's champion and promote it or hold it."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from enginefoundry import tracking_tags as mltags
from enginefoundry.lineage import read_manifest_uri
from enginefoundry.pipeline import UnitOutcome
from enginefoundry.promotion import Decision, PromotionPolicy, Registry, alias_stems, champion_alias, compare
from enginefoundry.rollout import ChangeReport, detect_change
from enginefoundry.serving_outputs import SERVE_SH
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
def promote_units(spec: BuildSpec, outcomes: list[UnitOutcome], policy: PromotionPolicy) -> list[Decision]:
    log = progress_logger()
    registry = Registry(spec.tracking.mlflow_uri)
    model = spec.registered_model_name
    stems = alias_stems(spec)
    decisions = []
    for outcome in outcomes:
        decision = _decide(registry, model, stems[outcome.unit], outcome, policy)
        log(f"rollout: {decision.stem}: {decision.action.upper()} {outcome.unit}: {'; '.join(decision.reasons)}")
        decisions.append(decision)
    return decisions


def _decide(registry: Registry, model: str, stem: str, outcome: UnitOutcome, policy: PromotionPolicy) -> Decision:
    base = Decision(stem=stem, unit=outcome.unit, action="held")
    if outcome.status == "failed" or not outcome.manifest_uri or not outcome.key:
        return base.model_copy(update={"reasons": [f"unit {outcome.status}: {outcome.reason or 'no manifest'}"]})
    versions = registry.versions_with(model, mltags.KEY, outcome.key)
    if not versions:
        return base.model_copy(update={"reasons": [f"no registered version of {model} has key {outcome.key[:12]}"]})
    candidate = versions[0]
    number = str(candidate.version)
    champion = registry.version_by_alias(model, champion_alias(stem))
    base = base.model_copy(update={"candidate_version": number,
                                   "champion_before": str(champion.version) if champion else None})
    if champion is not None and str(champion.version) == number:
        return base.model_copy(update={"action": "unchanged", "reasons": ["candidate already is the champion"]})
    cand_manifest = read_manifest_uri(outcome.manifest_uri)
    champ_manifest = None
    if champion is not None:
        champ_manifest = read_manifest_uri(champion.tags.get(mltags.MANIFEST_URI)
                                           or champion.source.rstrip("/") + "/manifest.json")
    verdict = compare(cand_manifest, champ_manifest, policy)
    if not verdict.promote:
        return base.model_copy(update={"reasons": verdict.reasons})
    move = registry.promote(model, stem, number, "; ".join(g.detail for g in verdict.gates))
    emit_registry_move(model, stem, move.action, move.champion, move.previous, move.detail)
    serving = None
    if any(f.path == f"serving/{SERVE_SH}" for f in cand_manifest.files):
        serving = outcome.manifest_uri.rsplit("/", 1)[0] + "/serving/"
        registry.tag_version(model, number, {mltags.SERVING_URI: serving})
    return base.model_copy(update={"action": "promoted", "serving_uri": serving,
                                   "reasons": [move.detail, *(g.detail for g in verdict.gates)]})
