"""What a unit's run comes to: the verdict of its gates, the manifest that records it, the MLflow
parameters, tags and metrics of its run, and the outcome row the summary shows. Built here, in the domain,
so the flows only compose stages; no Prefect here.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from enginefoundry import tracking_tags as mltags
from enginefoundry.bench import SweepReport
from enginefoundry.errors import StoreError
from enginefoundry.inputs.sources import SourceSnapshot
from enginefoundry.inputs.units import Unit
from enginefoundry.records.lineage import adapter_tags
from enginefoundry.records.run_summary import UnitOutcome
from enginefoundry.schemas.loose import MlflowPayload
from enginefoundry.schemas.manifest import BenchPart, BuildInput, KeyComponents, Manifest
from enginefoundry.smoke import SmokeReport
from enginefoundry.smoke.gate import GateRule, GateVerdict
from enginefoundry.smoke.prompts import prompt_set_digest
from enginefoundry.spec import BuildSpec
from enginefoundry.store.backends import Store
from enginefoundry.store.layout import run_outcome_key
from enginefoundry.store.publish import PublishedBuild
from enginefoundry.store.unit_status import UnitStatus


class UnitVerdict(GateVerdict):
    """A unit's verdict: the one verdict shape (smoke.gate.GateVerdict: `passed`, one rule per gate: the smoke gate,
    the benchmark), read as the status of a unit that ran to its end."""

    @property
    def status(self) -> Literal[UnitStatus.CANDIDATE, UnitStatus.REJECTED]:
        return UnitStatus.CANDIDATE if self.passed else UnitStatus.REJECTED

    @property
    def ok(self) -> bool:
        return self.passed

    @property
    def reason(self) -> str:
        """The failed gate's words (the manifest's `status_reason`); for a candidate, empty unless a gate's checks
        could not run ('smoke gate passed; 2 checks not run: the server returns no log-probs'): never a silent
        skip."""
        if not self.passed:
            return super().reason
        return "; ".join(f"{r.name} passed; {r.not_run}" for r in self.rules if r.not_run)


class UnitCommands(BaseModel):
    """The exact commands a unit ran, per stage (command lines with their environment): an auditor reads them on
    the unit's MLflow run (artifact `reports/commands.json`, tag `enginefoundry.commands`). A lane that works in
    process (the reference lane's cast and bundle) contributes its `(in-process) …` description instead."""

    convert: list[str] = Field(default_factory=list)
    build: list[str] = Field(default_factory=list)
    smoke_serve: list[str] = Field(default_factory=list)  # a server only the smoke stage ran (ServeCommand.shipped)
    serve: list[str] = Field(default_factory=list)  # the server the unit ships with
    bench: list[str] = Field(default_factory=list)

    def add_server(self, command: str, shipped: bool) -> None:
        """A started server's command line, under `serve` when it is the one the unit ships with."""
        (self.serve if shipped else self.smoke_serve).append(command)

    def tag(self, limit: int = 4800) -> str:
        """One `stage: command` line each, cut to fit an MLflow tag value (5000 characters on a server)."""
        text = "\n".join(f"{stage}: {line}" for stage in ("convert", "build", "smoke_serve", "serve", "bench")
                         for line in getattr(self, stage))
        return text if len(text) <= limit else text[: limit - 40] + "\n… (every command in commands.json)"


def stage_commands(ran: list[Any], described: list[Any], stage: str) -> list[str]:
    """What a stage ran (`Command`s of its result), else the lane's own description of that stage."""
    return [c.shell() for c in (ran or [c for c in described if c.description == stage])]


def verdict(smoke: SmokeReport | None, sweep: SweepReport | None) -> UnitVerdict:
    """A unit is a candidate when its smoke gate passed and its benchmark is valid."""
    rules: list[GateRule] = []
    if smoke is not None:
        rules.append(GateRule(name="smoke gate", ok=smoke.passed, detail=smoke.verdict.reason, kind="hard",
                              not_run=smoke.verdict.not_run_summary() or None))
        if not smoke.passed:  # the first failed gate decides: a rejected unit's benchmark is not judged
            return UnitVerdict(passed=False, rules=rules)
    if sweep is not None:
        bad = [f"{p.scenario} c={p.concurrency}: {'; '.join(p.problems)}" for p in sweep.points if not p.valid]
        rules.append(GateRule(name="benchmark" if sweep.valid else "benchmark invalid", ok=sweep.valid,
                              detail="valid" if sweep.valid else "; ".join(bad + sweep.failures), kind="hard"))
    return UnitVerdict(passed=all(r.ok for r in rules), rules=rules)


def bench_summary(sweep: SweepReport | None) -> dict[str, Any]:  # JSON edge: manifest benchmark
    if sweep is None:
        return {}
    return {**sweep.summary(),
            "points": [{"scenario": p.scenario, "concurrency": p.concurrency, "valid": p.valid,
                        **p.metrics()} for p in sweep.points],
            "slo": [s.model_dump() for s in sweep.slo],
            **({"search": sweep.search} if sweep.search is not None else {})}


def unit_params(spec: BuildSpec, unit: Unit) -> MlflowPayload:
    """The MLflow parameters of a unit's run."""
    return {"unit": unit.name, "lane": spec.lane, "variant": unit.variant.model_dump(mode="json"),
            "profile": unit.profile.model_dump(mode="json"), "target": unit.target.model_dump(mode="json"),
            "lane_options": spec.lane_options.given(), "toolchain": spec.toolchain.model_dump(mode="json")}


def build_run_tags(spec: BuildSpec, unit: Unit, key: str) -> dict[str, str]:
    """The tags a unit's MLflow run starts with when the unit is built."""
    return {mltags.KEY: key, mltags.TARGET: unit.target.name, mltags.ARCH: unit.target.arch.value,
            mltags.LANE: spec.lane, mltags.WORK_POOL: unit.target.pool, mltags.CACHE_HIT: "false"}


def unit_manifest_of(hit: PublishedBuild) -> Manifest:
    """A hit's unit manifest; StoreError when the build is a converted checkpoint (never a unit's hit)."""
    if hit.manifest is None:
        raise StoreError(f"{hit.uri} is a converted checkpoint, not a unit's build")
    return hit.manifest


def hit_run_tags(key: str, hit: PublishedBuild) -> dict[str, str]:
    """The tags of a cache hit's MLflow run: which run built the unit, and where it lies."""
    manifest = unit_manifest_of(hit)
    return {mltags.KEY: key, mltags.CACHE_HIT: "true", mltags.BUILT_BY_RUN: manifest.mlflow_run_id or "",
            mltags.MANIFEST_URI: hit.uri, mltags.MANIFEST_SHA256: hit.manifest_sha256,
            mltags.STATUS: manifest.status, **adapter_tags(manifest.source)}


@dataclass(frozen=True)
class BuiltUnit:
    """What a unit's stages produced, for its manifest: the converted checkpoint it was built from (key and URI),
    the build's device and parameters, the smoke report and the sweep, and what the build consumed besides its
    named sources, each bound by digest (`inputs`, evidence/inputs.py)."""

    checkpoint_key: str | None
    checkpoint_uri: str | None
    device: dict[str, Any]  # JSON edge: manifest device, as published
    build_params: dict[str, Any]  # JSON edge: manifest build_params, as published
    smoke: SmokeReport | None
    sweep: SweepReport | None
    inputs: list[BuildInput] = field(default_factory=list)


def unit_manifest(spec: BuildSpec, unit: Unit, components: KeyComponents, snapshot: SourceSnapshot, built: BuiltUnit,
                  *, mlflow_run_id: str | None, prefect_flow_run_id: str | None) -> Manifest:
    """The manifest of a built unit (key `components.key`), without its files: publishing adds them from the
    upload pass."""
    smoke, sweep = built.smoke, built.sweep
    judged = verdict(smoke, sweep)
    return Manifest.model_validate(dict(
        key=components.key, key_components=components, checkpoint_key=built.checkpoint_key,
        checkpoint_uri=built.checkpoint_uri, model=spec.model.name, unit=unit.name, lane=spec.lane,
        target=unit.target.model_dump(mode="json"), variant=unit.variant.model_dump(mode="json"),
        profile=unit.profile.model_dump(mode="json"),
        source={k: v for k, v in snapshot.model_dump(mode="json").items() if k not in ("local_dir", "files")},
        versions=(components.toolchain.versions if components.toolchain else None) or {}, device=built.device,
        build_params=built.build_params,
        files=[], smoke=smoke.summary() if smoke else {}, benchmark=bench_summary(sweep),
        prompts_digest=prompt_set_digest(spec.resolve_path(spec.smoke.prompts)),
        gate=spec.smoke.model_dump(mode="json"),
        status=judged.status, status_reason=judged.reason, mlflow_run_id=mlflow_run_id,
        prefect_flow_run_id=prefect_flow_run_id, inputs=list(built.inputs),
    ))


def unit_metrics(stages: dict[str, float], build_metrics: dict[str, float], artifact_bytes: int,
                 smoke: SmokeReport | None, sweep: SweepReport | None) -> dict[str, float]:
    metrics: dict[str, float] = {f"{k}_s": v for k, v in stages.items()}
    metrics.update(build_metrics)
    metrics["artifact_bytes"] = artifact_bytes
    if smoke:
        metrics.update({k: float(v) for k, v in smoke.summary().items()})
    if sweep:
        metrics.update(sweep.summary())
    return metrics


def built_outcome(unit: Unit, manifest: Manifest, uri: str, run_id: str, stages: dict[str, float]) -> UnitOutcome:
    return UnitOutcome(unit=unit.name, target=unit.target.name, status=manifest.status, reason=manifest.status_reason,
                       key=manifest.key, manifest_uri=uri, mlflow_run_id=run_id,
                       stage_seconds={k: round(v, 2) for k, v in stages.items()},
                       smoke=manifest.smoke, bench=manifest.benchmark)


def failed_outcome(unit: Unit, key: str, err: BaseException, run_id: str, stages: dict[str, float]) -> UnitOutcome:
    return UnitOutcome(unit=unit.name, target=unit.target.name, status=UnitStatus.FAILED,
                       reason=(str(err).splitlines() or [type(err).__name__])[0][:300], key=key, mlflow_run_id=run_id,
                       stage_seconds=stages)


def hit_outcome(unit: Unit, key: str, hit: PublishedBuild, run_id: str | None) -> UnitOutcome:
    manifest = unit_manifest_of(hit)
    return UnitOutcome(unit=unit.name, target=unit.target.name, status=manifest.status, cache_hit=True,
                       reason=manifest.status_reason, key=key, manifest_uri=hit.uri,
                       built_by_run=manifest.mlflow_run_id, mlflow_run_id=run_id,
                       smoke=manifest.smoke,
                       bench=BenchPart.model_validate(manifest.benchmark.model_dump(exclude={"points"})))


def duplicate_outcome(first: UnitOutcome, unit: Unit) -> UnitOutcome:
    """A unit of the same key as one this run built and could not publish: it shares its fate."""
    return first.model_copy(update={"unit": unit.name, "target": unit.target.name})


def save_outcome(store: Store, model: str, parent_run_id: str, outcome: UnitOutcome) -> None:
    """A cluster unit's outcome, left in the store for its parent run (`layout.run_outcome_key`)."""
    with tempfile.TemporaryDirectory(prefix="ef-outcome-") as tmp:
        path = Path(tmp) / "outcome.json"
        path.write_text(outcome.model_dump_json(indent=2))
        store.put_file(path, run_outcome_key(model, parent_run_id, outcome.unit))


def read_outcome(store: Store, model: str, parent_run_id: str, unit_name: str) -> UnitOutcome | None:
    """The outcome a unit's worker left for the parent run; None when absent or unreadable."""
    key = run_outcome_key(model, parent_run_id, unit_name)
    if not store.exists(key):
        return None
    try:
        return UnitOutcome.parse(store.read_bytes(key), what=store.url(key))
    except (ValueError, StoreError):
        return None
