"""The build flow: fetch → convert → (per unit) build → serve → smoke → bench → publish → track.

Two modes (the `mode` parameter). Embedded: every unit runs in this process as a subflow. Cluster: each
unit that is not published yet goes to the `build-unit/<pool>` deployment of its target's work pool
(flows/dispatch.py) and the parent waits for all of them. Caching, leases, the MLflow parent run and the
reports stay here in both modes. Parameters are typed so the Prefect UI renders a form: a spec path or an
inline spec, targets to include, force, mode.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

import yaml
from prefect import flow
from prefect.client.schemas.objects import State
from prefect.states import Failed

from enginefoundry import tracking_tags as mltags
from enginefoundry.errors import InputError, SpecError
from enginefoundry.flows.dispatch import deployment_name, dispatch_units
from enginefoundry.flows.reports import report_build, report_cache_hit, report_matrix
from enginefoundry.flows.unit import unit_params, unit_pipeline
from enginefoundry.lanes import get_lane
from enginefoundry.lease import DEFAULT_TTL_S, Lease, lease_key, new_owner, release, try_acquire, wait_for
from enginefoundry.manifest import Manifest
from enginefoundry.pipeline import RunSummary, UnitOutcome, work_root
from enginefoundry.plan import Unit, expand_units, key_of, toolchain_identity, unit_key_components
from enginefoundry.publish import find_current, pointer_key
from enginefoundry.spec import BuildSpec, load_spec, parse_spec
from enginefoundry.store import Store, open_store
from enginefoundry.tasks._log import progress_logger
from enginefoundry.tasks.convert import ConvertedCheckpoint, convert_variant
from enginefoundry.tasks.fetch import fetch_source
from enginefoundry.tasks.publish import find_published
from enginefoundry.tasks.track import (
    finish_parent_run,
    mlflow_run_link,
    prefect_context,
    record_unit,
    start_parent_run,
    start_unit_run,
)
from enginefoundry.validate import validate_deep

Mode = Literal["embedded", "cluster"]


def resolve_spec(spec_path: str | None, spec: dict[str, Any] | None, spec_yaml: str | None = None) -> BuildSpec:
    """The spec from one of: an inline mapping, pasted YAML, or a path on this machine. Destinations as written
    (a unit run uses the parent's effective ones, never its own environment's)."""
    if spec is not None:
        base = spec.pop("base_dir", None) if isinstance(spec, dict) else None
        return parse_spec(dict(spec), source="inline spec", base_dir=Path(base) if base else None)
    if spec_yaml and spec_yaml.strip():
        try:
            data = yaml.safe_load(spec_yaml)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            raise SpecError([("spec_yaml", f"not valid YAML{where} ({getattr(err, 'problem', None) or 'parse error'})"
                                           "; paste the spec file's text unchanged")], "spec_yaml") from None
        # Relative input paths in pasted YAML resolve against the worker's project folder.
        return parse_spec(data, source="spec_yaml", base_dir=Path.cwd())
    if spec_path:
        return load_spec(spec_path)
    raise InputError("spec_path, spec and spec_yaml are all empty: give spec_path (a YAML file on the worker), "
                     "spec_yaml (the spec's text) or spec (a mapping)")


def flow_spec(spec_path: str | None, spec: dict[str, Any] | None, spec_yaml: str | None, *, store: str | None,
              mlflow_uri: str | None, s3_endpoint_url: str | None) -> BuildSpec:
    """The spec a parent flow runs: resolved, validated, with its effective destinations (parameter >
    the worker's environment > spec > default; enginefoundry.settings) logged with where each came from."""
    from enginefoundry.settings import effective_spec

    build_spec, dest = effective_spec(resolve_spec(spec_path, spec, spec_yaml), store=store, mlflow_uri=mlflow_uri,
                                      s3_endpoint_url=s3_endpoint_url,
                                      flag_names=tuple(f"parameter {n}" for n in ("store", "mlflow_uri",
                                                                                  "s3_endpoint_url")))
    validate_deep(build_spec)
    log = progress_logger()
    for row in dest.rows():
        log(f"{row['setting']}: {row['value']} (from {row['from']})")
    return build_spec


def input_failure(err: InputError) -> State:
    """A bad input ends the run Failed with one message that names the field and the fix: no traceback in the
    UI. The exception rides along as the state's data, so a caller in Python (the CLI) gets it raised."""
    return Failed(message=str(err), data=err)


def spec_payload(spec: BuildSpec) -> dict[str, Any]:
    """The spec as a flow parameter: JSON, with the folder its relative paths resolve against."""
    return {**spec.model_dump(mode="json"), "base_dir": spec.base_dir}


def spec_label(params: dict[str, Any]) -> str:
    """The spec's name from whichever parameter carries it, for run names."""
    inline = params.get("spec") if isinstance(params.get("spec"), dict) else {}
    if not inline.get("name") and params.get("spec_yaml"):
        try:
            pasted = yaml.safe_load(str(params["spec_yaml"]))
            inline = pasted if isinstance(pasted, dict) else {}
        except yaml.YAMLError:
            inline = {"name": "pasted spec"}
    return str(inline.get("name") or Path(str(params.get("spec_path") or "spec")).stem)


def _run_name() -> str:
    """`build tiny-cpu (cluster)`: readable in the UI's run list whether the spec came by path or inline."""
    from prefect.runtime import flow_run

    params = flow_run.parameters
    return f"build {spec_label(params)}" + (" (cluster)" if params.get("mode") == "cluster" else "")


@flow(name="build-engines", flow_run_name=_run_name, log_prints=True)
def build_engines(
    spec_path: str | None = "configs/tiny-cpu.yaml",
    spec: dict[str, Any] | None = None,
    targets: list[str] | None = None,
    force: bool = False,
    mode: Mode = "embedded",
    verify_hits: bool = False,
    spec_yaml: str | None = None,
    store: str | None = None,
    mlflow_uri: str | None = None,
    s3_endpoint_url: str | None = None,
) -> RunSummary | State:
    """Build, verify, benchmark and publish every unit of a spec.

    Args:
        spec_path: build spec YAML on the worker, relative to the project folder (ignored when `spec` or
            `spec_yaml` is given)
        spec: an inline build spec as a mapping (the same fields as the YAML)
        targets: only these target names (empty: all)
        force: rebuild units whose manifest already exists
        mode: embedded (units in this process) or cluster (each unit on a worker of its target's pool)
        verify_hits: re-hash every file of a cache hit (otherwise: manifest consistency and file sizes)
        spec_yaml: the build spec's YAML text, pasted (ignored when `spec` is given)
        store: artifact store (s3://bucket/prefix or file://path); empty: $EF_STORE of the worker, else the spec's
        mlflow_uri: MLflow tracking URI; empty: $MLFLOW_TRACKING_URI of the worker, else the spec's
        s3_endpoint_url: S3 endpoint; empty: $AWS_ENDPOINT_URL_S3 of the worker, else the spec's
    """
    t0 = time.monotonic()
    try:
        build_spec = flow_spec(spec_path, spec, spec_yaml, store=store, mlflow_uri=mlflow_uri,
                               s3_endpoint_url=s3_endpoint_url)
    except InputError as err:
        return input_failure(err)
    units = expand_units(build_spec, targets or None)
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
    # Two targets with the same identity (arch, SKUs, GPU count) give units with one key: build it once and
    # record the others as hits of it. Taking the lease twice would make this run wait for itself.
    same_as: dict[str, str] = {}
    first_with_key: dict[str, str] = {}
    for unit in units:
        key = keys[unit.name]
        if key in first_with_key:
            same_as[unit.name] = first_with_key[key]
            published[unit.name] = published[first_with_key[key]]
            continue
        first_with_key[key] = unit.name
        published[unit.name] = None if force else find_published(build_spec, key, verify_hits)
        if published[unit.name] is None:
            published[unit.name] = _lease_or_wait(build_spec, store, key, owner, leases, force)
    misses = [u for u in units if published[u.name] is None and u.name not in same_as]
    report_matrix(build_spec, units, keys, {u.name: published[u.name] is not None for u in units},
                  {u.name: deployment_name(u) if mode == "cluster" else "in-process" for u in units})
    convert_s = 0.0
    try:
        built: dict[str, UnitOutcome] = {}
        if mode == "cluster":
            # Conversion happens on the workers: quantizing needs the target's GPU, and the converted
            # checkpoint is published once per key and fetched by the others.
            built = dispatch_units(build_spec, spec_payload(build_spec), misses, components, snapshot, parent, store,
                                   prefect_context().get(mltags.PREFECT_FLOW_RUN_ID), replace=force)
        else:
            converted: dict[str, ConvertedCheckpoint] = {}
            t_convert = time.monotonic()
            for unit in misses:
                if unit.variant.name not in converted:
                    converted[unit.variant.name] = convert_variant(build_spec, unit.variant, snapshot)
            convert_s = time.monotonic() - t_convert
            for unit in misses:
                run_unit = unit_pipeline.with_options(flow_run_name=f"unit {unit.name}")
                built[unit.name] = run_unit(build_spec, unit, components[unit.name], snapshot,
                                            converted[unit.variant.name], parent, replace=force)
        outcomes = []
        for unit in units:
            hit = published[unit.name]
            if unit.name in same_as and hit is None:
                hit = _published_by(store, build_spec, built[same_as[unit.name]])
                if hit is None:
                    first = built[same_as[unit.name]]
                    outcomes.append(first.model_copy(update={"unit": unit.name, "target": unit.target.name}))
                    continue
            outcomes.append(built[unit.name] if hit is None
                            else _record_cache_hit(build_spec, unit, keys[unit.name], hit, parent))
    finally:
        for lease in leases.values():
            release(store, lease)
    summary = RunSummary(spec=build_spec.name, source_uri=snapshot.uri, source_revision=snapshot.revision,
                         parent_run_id=parent, outcomes=outcomes,
                         stage_seconds={"fetch": round(fetch_s, 2), "convert": round(convert_s, 2),
                                        "total": round(time.monotonic() - t0, 2)})
    finish_parent_run(build_spec, parent, summary.ok, summary.model_dump(mode="json"),
                      {"units": len(outcomes), "units_ok": sum(o.ok for o in outcomes),
                       "duration_s": time.monotonic() - t0, "fetch_s": fetch_s, "convert_s": convert_s},
                      str(work_root() / "runs" / parent))
    report_build(build_spec, summary)
    return summary


def _published_by(store: Store, spec: BuildSpec, outcome: UnitOutcome) -> Manifest | None:
    if outcome.key is None:
        return None
    build = find_current(store, spec.model.name, outcome.key)
    return build.manifest if build else None


def _lease_or_wait(spec: BuildSpec, store: Store, key: str, owner: str, leases: dict[str, Lease],
                   force: bool) -> Manifest | None:
    """Take the build lease for a key, or wait for the run that holds it and return its manifest."""
    lkey = lease_key(spec.model.name, key)
    lease = try_acquire(store, lkey, owner)
    if lease is not None:
        leases[key] = lease
        return None
    if wait_for(store, pointer_key(spec.model.name, key), lkey, timeout_s=DEFAULT_TTL_S, progress=progress_logger()):
        build = find_current(store, spec.model.name, key)
        return build.manifest if build else None
    # The holder gave up without publishing: build it ourselves.
    return _lease_or_wait(spec, store, key, owner, leases, force)


def _record_cache_hit(spec: BuildSpec, unit: Unit, key: str, manifest: Manifest, parent_run_id: str
                      ) -> UnitOutcome:
    build = find_current(open_store(spec.publish.store, spec.publish.s3_endpoint_url), spec.model.name, key)
    uri = build.uri if build else ""
    run_id = start_unit_run(spec, parent_run_id, unit.name, unit_params(spec, unit),
                            {mltags.KEY: key, mltags.CACHE_HIT: "true",
                             mltags.BUILT_BY_RUN: manifest.mlflow_run_id or "",
                             mltags.MANIFEST_URI: uri, mltags.STATUS: manifest.status})
    record_unit(spec, run_id, ok=manifest.status == "candidate", tags={}, metrics={"cache_hit": 1.0},
                sweep=None, artifacts=[])
    built_by = mlflow_run_link(spec, manifest.mlflow_run_id) if manifest.mlflow_run_id else uri
    progress_logger()(f"cache hit: {unit.name} ({manifest.status}) is published at {uri}; built by MLflow run "
                      f"{built_by}" + (f", Prefect flow run {manifest.prefect_flow_run_id}"
                                       if manifest.prefect_flow_run_id else ""))
    report_cache_hit(unit.name, key, built_by, uri)
    return UnitOutcome(unit=unit.name, target=unit.target.name, status=manifest.status, cache_hit=True,
                       reason=manifest.status_reason, key=key, manifest_uri=uri,
                       built_by_run=manifest.mlflow_run_id, mlflow_run_id=run_id,
                       smoke=manifest.smoke, bench={k: v for k, v in manifest.benchmark.items() if k != "points"})
