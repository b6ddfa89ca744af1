"""One unit that is not published yet: build → serve → smoke → bench → serving files → publish → track.

`run_unit_stages` is the composition both modes share: embedded mode calls it inside the `unit-in-process`
subflow (`unit_pipeline`) of the parent's process; cluster mode inside the `build-unit` deployment flow on a
worker of the target's pool (flows/build_unit.py).
"""

from __future__ import annotations

import shutil
import time
from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from enginefoundry import tracking_tags as mltags
from enginefoundry.bench import SweepReport
from enginefoundry.flows.reports import report_unit_links
from enginefoundry.pipeline import UnitOutcome, work_root
from enginefoundry.plan import Unit, key_of
from enginefoundry.smoke import SmokeReport
from enginefoundry.smoke.prompts import prompt_set_digest
from enginefoundry.sources import SourceSnapshot
from enginefoundry.spec import BuildSpec
from enginefoundry.tasks.bench import benchmark
from enginefoundry.tasks.build import build_unit
from enginefoundry.tasks.convert import ConvertedCheckpoint
from enginefoundry.tasks.events import emit_unit_outcome
from enginefoundry.tasks.publish import publish_unit
from enginefoundry.tasks.serve import start_unit_server, stop_unit_server
from enginefoundry.tasks.serving_outputs import write_serving
from enginefoundry.tasks.smoke import smoke_test
from enginefoundry.tasks.track import (
    mlflow_run_link,
    prefect_context,
    record_unit,
    register_published_unit,
    start_unit_run,
)


@flow(name="unit-in-process")
def unit_pipeline(
    spec: BuildSpec, unit: Unit, key_components: dict[str, Any], snapshot: SourceSnapshot,
    ckpt: ConvertedCheckpoint, parent_run_id: str, replace: bool = False,
) -> UnitOutcome:
    """Embedded mode: the unit as a subflow of the parent's process. `replace`: a --force rebuild."""
    return run_unit_stages(spec, unit, key_components, snapshot, ckpt, parent_run_id, replace)


def run_unit_stages(
    spec: BuildSpec, unit: Unit, key_components: dict[str, Any], snapshot: SourceSnapshot,
    ckpt: ConvertedCheckpoint, parent_run_id: str, replace: bool = False,
) -> UnitOutcome:
    key = key_of(key_components)
    stages: dict[str, float] = {}

    run_id = start_unit_run(spec, parent_run_id, unit.name, unit_params(spec, unit),
                            {mltags.KEY: key, mltags.TARGET: unit.target.name,
                             mltags.ARCH: unit.target.arch.value, mltags.LANE: spec.lane,
                             mltags.WORK_POOL: unit.target.pool, mltags.CACHE_HIT: "false"})
    unit_dir = work_root() / "units" / key[:16]
    shutil.rmtree(unit_dir, ignore_errors=True)  # a clean start: nothing from an earlier run gets published
    report_dir = unit_dir / "reports"
    try:
        t = time.monotonic()
        build = build_unit(spec, unit, ckpt.result.checkpoint_dir, key)
        stages["build"] = time.monotonic() - t

        smoke: SmokeReport | None = None
        sweep: SweepReport | None = None
        t = time.monotonic()
        endpoint = start_unit_server(spec, build.bundle_dir, str(report_dir))
        stages["serve"] = time.monotonic() - t
        try:
            t = time.monotonic()
            smoke = smoke_test(spec, endpoint, snapshot.local_dir, str(report_dir),
                               precision=unit.variant.precision.value, weights_digest=snapshot.weights_digest)
            stages["smoke"] = time.monotonic() - t
            if spec.benchmark.enabled:
                t = time.monotonic()
                sweep = benchmark(spec, endpoint, str(report_dir / "bench"), f"{spec.model.name} {unit.name}")
                stages["bench"] = time.monotonic() - t
        finally:
            stop_unit_server(endpoint)
    except Exception as err:
        record_unit(spec, run_id, ok=False, tags={mltags.STATUS: "failed"},
                    metrics={f"{k}_s": v for k, v in stages.items()}, sweep=None, artifacts=[])
        reason = str(err).splitlines()[0][:300]
        emit_unit_outcome(spec.model.name, unit.name, unit.target.name, key, "failed", reason=reason,
                          mlflow_run_id=run_id)
        return UnitOutcome(unit=unit.name, target=unit.target.name, status="failed",
                           reason=reason, key=key, mlflow_run_id=run_id, stage_seconds=stages)

    status, reason = verdict(smoke, sweep)
    folders = {"bundle": build.bundle_dir, "reports": str(report_dir)}
    serving_dir = unit_dir / "serving"
    shutil.rmtree(serving_dir, ignore_errors=True)
    if status == "candidate":  # a rejected unit gets nothing a serving team could deploy by mistake
        folders["serving"] = write_serving(spec, unit.name, key, build.bundle_dir, ckpt.result.checkpoint_dir,
                                           ckpt.uri, str(serving_dir))
    t = time.monotonic()
    manifest_fields = {
        "key": key,
        "key_components": key_components, "checkpoint_key": ckpt.key, "checkpoint_uri": ckpt.uri,
        "model": spec.model.name, "unit": unit.name, "lane": spec.lane,
        "target": unit.target.model_dump(mode="json"), "variant": unit.variant.model_dump(mode="json"),
        "profile": unit.profile.model_dump(mode="json"),
        "source": {k: v for k, v in snapshot.model_dump(mode="json").items() if k not in ("local_dir", "files")},
        "versions": key_components["toolchain"]["versions"], "device": build.device, "build_params": build.params,
        "smoke": smoke.summary() if smoke else {}, "benchmark": bench_summary(sweep),
        "prompts_digest": prompt_set_digest(spec.resolve_path(spec.smoke.prompts)),
        "gate": spec.smoke.model_dump(mode="json"),
        "status": status, "status_reason": reason, "mlflow_run_id": run_id,
        "prefect_flow_run_id": prefect_context().get(mltags.PREFECT_FLOW_RUN_ID),
    }
    published_result = publish_unit(spec, manifest_fields, folders, replace)
    stages["publish"] = time.monotonic() - t

    t = time.monotonic()
    metrics: dict[str, float] = {f"{k}_s": v for k, v in stages.items()}
    metrics.update(build.metrics)
    metrics["artifact_bytes"] = published_result.bytes_total
    if smoke:
        metrics.update({k: float(v) for k, v in smoke.summary().items()})
    if sweep:
        metrics.update(sweep.summary())
    manifest_copy = unit_dir / "manifest.json"
    manifest_copy.write_bytes(published_result.manifest.to_json())
    artifacts = [str(manifest_copy)] + [
        str(p) for p in report_dir.rglob("*")
        if p.suffix in (".json", ".md", ".png") and "phases" not in p.parts and p.name != "inputs.json"
    ]
    record_unit(spec, run_id, ok=status == "candidate",
                tags={mltags.STATUS: status, mltags.MANIFEST_URI: published_result.uri,
                      mltags.GPU: build.device.get("gpu_name", build.device.get("cpu", "")),
                      **(smoke.tags() if smoke else {})},
                metrics=metrics, sweep=sweep, artifacts=artifacts)
    register_published_unit(spec, unit, published_result.manifest, published_result.uri, run_id)
    stages["track"] = time.monotonic() - t
    report_unit_links(unit.name, key, mlflow_run_link(spec, run_id), published_result.uri)
    emit_unit_outcome(spec.model.name, unit.name, unit.target.name, key, status, reason=reason,
                      manifest_uri=published_result.uri, mlflow_run_id=run_id)
    if smoke:
        create_markdown_artifact(key=f"smoke-{key[:12]}", markdown=smoke.markdown(),
                                 description=f"smoke gate of {unit.name}")
    return UnitOutcome(unit=unit.name, target=unit.target.name, status=status, reason=reason, key=key,
                       manifest_uri=published_result.uri, mlflow_run_id=run_id,
                       stage_seconds={k: round(v, 2) for k, v in stages.items()},
                       smoke=smoke.summary() if smoke else {}, bench=bench_summary(sweep))


def verdict(smoke: SmokeReport | None, sweep: SweepReport | None) -> tuple[str, str]:
    if smoke is not None and not smoke.passed:
        return "rejected", f"smoke gate: {smoke.verdict.reason}"
    if sweep is not None and not sweep.valid:
        bad = [f"{p.scenario} c={p.concurrency}: {'; '.join(p.problems)}" for p in sweep.points if not p.valid]
        return "rejected", "benchmark invalid: " + "; ".join(bad + sweep.failures)
    return "candidate", ""


def bench_summary(sweep: SweepReport | None) -> dict[str, Any]:
    if sweep is None:
        return {}
    return {**sweep.summary(),
            "points": [{"scenario": p.scenario, "concurrency": p.concurrency, "valid": p.valid,
                        **p.metrics()} for p in sweep.points],
            "slo": [s.model_dump() for s in sweep.slo]}


def unit_params(spec: BuildSpec, unit: Unit) -> dict[str, Any]:
    return {"unit": unit.name, "lane": spec.lane, "variant": unit.variant.model_dump(mode="json"),
            "profile": unit.profile.model_dump(mode="json"), "target": unit.target.model_dump(mode="json"),
            "lane_options": spec.lane_options.given(), "toolchain": spec.toolchain.model_dump(mode="json")}
