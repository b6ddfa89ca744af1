"""The build flow: fetch → convert → (per unit) build → serve → smoke → bench → publish → track.

Embedded mode runs every unit in-process as a subflow. The flow's parameters are typed so the
Prefect UI renders a form: a spec path or an inline spec, targets to include, force.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from enginefoundry.bench import SweepReport
from enginefoundry.console import say
from enginefoundry.lanes import get_lane
from enginefoundry.lease import DEFAULT_TTL_S, Lease, lease_key, new_owner, release, try_acquire, wait_for
from enginefoundry.manifest import Manifest
from enginefoundry.pipeline import RunSummary, UnitOutcome, work_root
from enginefoundry.plan import Unit, expand_units, key_of, toolchain_identity, unit_key_components
from enginefoundry.publish import manifest_key, read_manifest
from enginefoundry.smoke import SmokeReport
from enginefoundry.sources import SourceSnapshot
from enginefoundry.spec import BuildSpec, load_spec, parse_spec
from enginefoundry.store import Store, open_store
from enginefoundry.validate import validate_deep
from tasks.bench import benchmark
from tasks.build import build_unit
from tasks.convert import ConvertedCheckpoint, convert_variant
from tasks.fetch import fetch_source
from tasks.publish import find_published, publish_unit
from tasks.serve import start_unit_server, stop_unit_server
from tasks.smoke import smoke_test
from tasks.track import (
    finish_parent_run,
    prefect_context,
    record_unit,
    register_published_unit,
    start_parent_run,
    start_unit_run,
)


def resolve_spec(spec_path: str | None, spec: dict[str, Any] | None) -> BuildSpec:
    if spec is not None:
        base = spec.pop("base_dir", None) if isinstance(spec, dict) else None
        return parse_spec(dict(spec), source="inline spec", base_dir=Path(base) if base else None)
    if spec_path:
        return load_spec(spec_path)
    from enginefoundry.errors import InputError

    raise InputError("give spec_path (a YAML file on the worker) or spec (an inline spec)")


@flow(name="build-engines", log_prints=True)
def build_engines(
    spec_path: str | None = "configs/tiny-cpu.yaml",
    spec: dict[str, Any] | None = None,
    targets: list[str] | None = None,
    force: bool = False,
) -> RunSummary:
    t0 = time.monotonic()
    build_spec = resolve_spec(spec_path, spec)
    validate_deep(build_spec)
    units = expand_units(build_spec, targets)
    lane = get_lane(build_spec.lane)
    toolchain = toolchain_identity(build_spec, lane.versions())

    snapshot = fetch_source(build_spec)
    fetch_s = time.monotonic() - t0
    parent = start_parent_run(build_spec, snapshot.model_dump(mode="json"))
    components = {unit.name: unit_key_components(build_spec, unit, snapshot.weights_digest,
                                                 snapshot.tokenizer_digest, toolchain, build_spec.lane_options)
                  for unit in units}
    keys = {name: key_of(c) for name, c in components.items()}
    # Cache check first, so a converted checkpoint is made only for variants that some miss needs. A miss
    # is built under a lease: a concurrent run of the same key waits for our manifest instead of rebuilding.
    store = open_store(build_spec.publish.store, build_spec.publish.s3_endpoint_url)
    owner = new_owner()
    leases: dict[str, Lease] = {}
    published: dict[str, Manifest | None] = {}
    for unit in units:
        published[unit.name] = None if force else find_published(build_spec, keys[unit.name])
        if published[unit.name] is None:
            published[unit.name] = _lease_or_wait(build_spec, store, keys[unit.name], owner, leases, force)
    try:
        converted: dict[str, ConvertedCheckpoint] = {}
        for unit in units:
            if published[unit.name] is None and unit.variant.name not in converted:
                converted[unit.variant.name] = convert_variant(build_spec, unit.variant, snapshot)
        outcomes = []
        for unit in units:
            hit = published[unit.name]
            if hit is not None:
                outcomes.append(_record_cache_hit(build_spec, unit, keys[unit.name], hit, parent))
                continue
            run_unit = unit_pipeline.with_options(flow_run_name=f"unit {unit.name}")
            outcomes.append(run_unit(build_spec, unit, components[unit.name], snapshot,
                                     converted[unit.variant.name], parent))
    finally:
        for lease in leases.values():
            release(store, lease)
    summary = RunSummary(spec=build_spec.name, source_uri=snapshot.uri, source_revision=snapshot.revision,
                         parent_run_id=parent, outcomes=outcomes,
                         stage_seconds={"fetch": round(fetch_s, 2), "total": round(time.monotonic() - t0, 2)})
    finish_parent_run(build_spec, parent, summary.ok, summary.model_dump(mode="json"),
                      {"units": len(outcomes), "units_ok": sum(o.ok for o in outcomes),
                       "duration_s": time.monotonic() - t0, "fetch_s": fetch_s},
                      str(work_root() / "runs" / parent))
    create_table_artifact(key="build-summary", table=summary.rows(),
                          description=f"{build_spec.name}: units, gates, cache hits")
    return summary


@flow(name="build-unit")
def unit_pipeline(
    spec: BuildSpec, unit: Unit, key_components: dict[str, Any], snapshot: SourceSnapshot,
    ckpt: ConvertedCheckpoint, parent_run_id: str,
) -> UnitOutcome:
    """One unit that is not published yet: build → serve → smoke → bench → publish → track."""
    key = key_of(key_components)
    stages: dict[str, float] = {}

    run_id = start_unit_run(spec, parent_run_id, unit.name, _unit_params(spec, unit),
                            {"enginefoundry.key": key, "enginefoundry.target": unit.target.name,
                             "enginefoundry.arch": unit.target.arch.value, "enginefoundry.lane": spec.lane,
                             "enginefoundry.cache_hit": "false"})
    report_dir = work_root() / "units" / key[:16] / "reports"
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
            smoke = smoke_test(spec, endpoint, snapshot.local_dir, str(report_dir))
            stages["smoke"] = time.monotonic() - t
            if spec.benchmark.enabled:
                t = time.monotonic()
                sweep = benchmark(spec, endpoint, str(report_dir / "bench"), f"{spec.model.name} {unit.name}")
                stages["bench"] = time.monotonic() - t
        finally:
            stop_unit_server(endpoint)
    except Exception as err:
        record_unit(spec, run_id, ok=False, tags={"enginefoundry.status": "failed"},
                    metrics={f"{k}_s": v for k, v in stages.items()}, sweep=None, artifacts=[])
        outcome = UnitOutcome(unit=unit.name, target=unit.target.name, status="failed",
                              reason=str(err).splitlines()[0][:300], key=key, mlflow_run_id=run_id,
                              stage_seconds=stages)
        return outcome

    status, reason = _verdict(smoke, sweep)
    t = time.monotonic()
    manifest_fields = {
        "key": key,
        "key_components": key_components, "checkpoint_key": ckpt.key, "checkpoint_uri": ckpt.uri,
        "model": spec.model.name, "unit": unit.name, "lane": spec.lane,
        "target": unit.target.model_dump(mode="json"), "variant": unit.variant.model_dump(mode="json"),
        "profile": unit.profile.model_dump(mode="json"),
        "source": {k: v for k, v in snapshot.model_dump(mode="json").items() if k not in ("local_dir", "files")},
        "versions": key_components["toolchain"]["versions"], "device": build.device, "build_params": build.params,
        "smoke": smoke.summary() if smoke else {}, "benchmark": _bench_summary(sweep),
        "status": status, "status_reason": reason, "mlflow_run_id": run_id,
        "prefect_flow_run_id": prefect_context().get("prefect.flow_run_id"),
    }
    published_result = publish_unit(spec, manifest_fields, {"bundle": build.bundle_dir, "reports": str(report_dir)})
    stages["publish"] = time.monotonic() - t

    t = time.monotonic()
    metrics: dict[str, float] = {f"{k}_s": v for k, v in stages.items()}
    metrics.update(build.metrics)
    metrics["artifact_bytes"] = published_result.bytes_uploaded
    if smoke:
        metrics.update({k: float(v) for k, v in smoke.summary().items()})
    if sweep:
        metrics.update(sweep.summary())
    manifest_copy = report_dir.parent / "manifest.json"
    manifest_copy.write_bytes(published_result.manifest.to_json())
    artifacts = [str(manifest_copy)] + [
        str(p) for p in report_dir.rglob("*")
        if p.suffix in (".json", ".md", ".png") and "phases" not in p.parts and p.name != "inputs.json"
    ]
    record_unit(spec, run_id, ok=status == "candidate",
                tags={"enginefoundry.status": status, "enginefoundry.manifest_uri": published_result.uri,
                      "enginefoundry.gpu": build.device.get("gpu_name", build.device.get("cpu", ""))},
                metrics=metrics, sweep=sweep, artifacts=artifacts)
    register_published_unit(spec, unit, published_result.manifest, published_result.uri, run_id)
    stages["track"] = time.monotonic() - t
    if smoke:
        create_markdown_artifact(key=f"smoke-{key[:12]}", markdown=smoke.markdown(),
                                 description=f"smoke gate of {unit.name}")
    return UnitOutcome(unit=unit.name, target=unit.target.name, status=status, reason=reason, key=key,
                       manifest_uri=published_result.uri, mlflow_run_id=run_id,
                       stage_seconds={k: round(v, 2) for k, v in stages.items()},
                       smoke=smoke.summary() if smoke else {}, bench=_bench_summary(sweep))


def _lease_or_wait(spec: BuildSpec, store: Store, key: str, owner: str, leases: dict[str, Lease],
                   force: bool) -> Manifest | None:
    """Take the build lease for a key, or wait for the run that holds it and return its manifest."""
    lkey = lease_key(spec.model.name, key)
    lease = try_acquire(store, lkey, owner)
    if lease is not None:
        leases[key] = lease
        return None
    if wait_for(store, manifest_key(spec.model.name, key), lkey, timeout_s=DEFAULT_TTL_S, progress=say):
        return read_manifest(store, manifest_key(spec.model.name, key))
    # The holder gave up without publishing: build it ourselves.
    return _lease_or_wait(spec, store, key, owner, leases, force)


def _verdict(smoke: SmokeReport | None, sweep: SweepReport | None) -> tuple[str, str]:
    if smoke is not None and not smoke.passed:
        return "rejected", f"smoke gate: {smoke.verdict.reason}"
    if sweep is not None and not sweep.valid:
        bad = [f"{p.scenario} c={p.concurrency}: {'; '.join(p.problems)}" for p in sweep.points if not p.valid]
        return "rejected", "benchmark invalid: " + "; ".join(bad + sweep.failures)
    return "candidate", ""


def _bench_summary(sweep: SweepReport | None) -> dict[str, Any]:
    if sweep is None:
        return {}
    return {**sweep.summary(),
            "points": [{"scenario": p.scenario, "concurrency": p.concurrency, "valid": p.valid,
                        **p.metrics()} for p in sweep.points],
            "slo": [s.model_dump() for s in sweep.slo]}


def _unit_params(spec: BuildSpec, unit: Unit) -> dict[str, Any]:
    return {"unit": unit.name, "lane": spec.lane, "variant": unit.variant.model_dump(mode="json"),
            "profile": unit.profile.model_dump(mode="json"), "target": unit.target.model_dump(mode="json"),
            "lane_options": spec.lane_options, "toolchain": spec.toolchain.model_dump(mode="json")}


def _record_cache_hit(spec: BuildSpec, unit: Unit, key: str, manifest: Manifest, parent_run_id: str
                      ) -> UnitOutcome:
    uri = open_store(spec.publish.store, spec.publish.s3_endpoint_url).url(manifest_key(spec.model.name, key))
    run_id = start_unit_run(spec, parent_run_id, unit.name, _unit_params(spec, unit),
                            {"enginefoundry.key": key, "enginefoundry.cache_hit": "true",
                             "enginefoundry.built_by_run": manifest.mlflow_run_id or "",
                             "enginefoundry.manifest_uri": uri, "enginefoundry.status": manifest.status})
    record_unit(spec, run_id, ok=manifest.status == "candidate", tags={}, metrics={"cache_hit": 1.0},
                sweep=None, artifacts=[])
    return UnitOutcome(unit=unit.name, target=unit.target.name, status=manifest.status, cache_hit=True,
                       reason=manifest.status_reason, key=key, manifest_uri=uri,
                       built_by_run=manifest.mlflow_run_id, mlflow_run_id=run_id,
                       smoke=manifest.smoke, bench={k: v for k, v in manifest.benchmark.items()
                                                    if not isinstance(v, list)})
