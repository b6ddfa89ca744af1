"""The build flow: fetch → plan the cache → convert → (per missing unit) reference → build → serve → smoke →
bench → publish → track; hits are recorded, not rebuilt. With `smoke.reference: sibling` the units run in
waves: a sibling before the units its served answers judge.

Two modes (the `mode` parameter). Embedded: every unit runs in this process as a subflow. Cluster: each
unit that is not published yet goes to the `build-unit/<pool>` deployment of its target's work pool
(flows/dispatch.py) and the parent waits for all of them. Cache planning (hits, build leases, units of one
key) is the domain's (enginefoundry/planning/cache_plan.py); the MLflow parent run and the reports stay here in both
modes. Parameters are typed so the Prefect UI renders a form: a spec path or an inline spec, targets to
include, force, mode.
"""

from __future__ import annotations

import functools
import re
import time
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

import yaml
from prefect import flow
from prefect.client.schemas.objects import State
from prefect.states import Failed

from enginefoundry import tracking_tags as mltags
from enginefoundry.errors import InputError, PipelineError, SpecError
from enginefoundry.flows.dispatch import deployment_name, dispatch_units
from enginefoundry.flows.dispatch import spec_payload as spec_payload  # re-exported: the CLI and rollout import it here
from enginefoundry.flows.reports import report_build, report_cache_hit, report_matrix
from enginefoundry.flows.unit import unit_pipeline
from enginefoundry.inputs.adapters import pinned_adapters, served_source
from enginefoundry.inputs.sources import SourceSnapshot
from enginefoundry.inputs.units import SourceDigests, Unit, expand_units
from enginefoundry.lanes import get_lane
from enginefoundry.lanes.speculation import pinned_draft
from enginefoundry.planning.cache_plan import (
    CachePlan,
    find_hit,
    hit_signature_policy,
    plan_cache,
    unit_keys,
)
from enginefoundry.planning.parent_run import ParentRun
from enginefoundry.planning.validate import validate_deep
from enginefoundry.records.outcomes import duplicate_outcome
from enginefoundry.records.run_records import mlflow_run_link
from enginefoundry.records.run_summary import (
    RunSummary,
    UnitNotPassed,
    UnitOutcome,
    UnitsNotPassed,
    refused_by_sibling,
)
from enginefoundry.records.unit_run import ConvertedCheckpoint, UnitWork
from enginefoundry.smoke.sibling import reference_waves, sibling_refs
from enginefoundry.spec import BuildSpec, load_spec, parse_spec
from enginefoundry.store.backends import Store, open_store
from enginefoundry.tasks._log import progress_logger, quiet_expected_failures
from enginefoundry.tasks.cancel_watch import watching
from enginefoundry.tasks.convert import convert_variant
from enginefoundry.tasks.fetch import fetch_adapters, fetch_draft, fetch_source, merge_adapter
from enginefoundry.tasks.pool_limits import pool_slot
from enginefoundry.tasks.track import (
    finish_parent_run,
    prefect_context,
    record_cache_hit,
    start_parent_run,
)

Mode = Literal["embedded", "cluster"]
T = TypeVar("T")
quiet_expected_failures()  # a Failed end with our own error logs no engine traceback (tasks/_log.py)


def resolve_spec(spec_path: str | None, spec: dict[str, Any] | None,  # JSON edge: an inline spec (flow parameter)
                 spec_yaml: str | None = None) -> BuildSpec:
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
        return parse_spec(data, source="spec_yaml", base_dir=pasted_spec_dir())
    if spec_path:
        return load_spec(spec_path)
    raise InputError("spec_path, spec and spec_yaml are all empty: give spec_path (a YAML file on the worker), "
                     "spec_yaml (the spec's text) or spec (a mapping)")


def pasted_spec_dir() -> Path:
    """Pasted YAML is read as if it were a file in the worker's `configs/` folder (docs/spec.md):
    the shipped specs' relative paths (`prompts/…`, `../tests/…`, `file://../.enginefoundry/store`) are written
    from there, so a spec pasted unchanged runs as `spec_path=configs/<name>.yaml` does."""
    return Path.cwd() / "configs"


def flow_spec(spec_path: str | None,
              spec: dict[str, Any] | None,  # JSON edge: an inline spec (flow parameter)
              spec_yaml: str | None, *, store: str | None,
              mlflow_uri: str | None, s3_endpoint_url: str | None, validated: bool = False) -> BuildSpec:
    """The spec a parent flow runs: resolved, validated (unless the caller did: `validated`), with its effective
    destinations (parameter > the worker's environment > spec > default; enginefoundry.settings) logged with
    where each came from."""
    from enginefoundry.settings import effective_spec

    build_spec, dest = effective_spec(resolve_spec(spec_path, spec, spec_yaml), store=store, mlflow_uri=mlflow_uri,
                                      s3_endpoint_url=s3_endpoint_url,
                                      flag_names=("parameter store", "parameter mlflow_uri",
                                                  "parameter s3_endpoint_url"))
    if not validated:
        validate_deep(build_spec)
    log = progress_logger()
    # A spec with a `search` section and no decision yet (a path or pasted YAML): decide here, once; a spec from the
    # CLI carries the decision in `searched` already.
    from enginefoundry.search.plan import materialise

    build_spec, _ = materialise(build_spec, progress=log)
    # One lineage per alias: a UI or API run (and a searched spec, whose units are known only now) is refused as
    # `validate` refuses it.
    from enginefoundry.records.alias_lineage import refuse_alias_collisions

    refuse_alias_collisions(build_spec)
    for row in dest.rows():
        log(f"{row['setting']}: {row['value']} (from {row['from']})")
    return build_spec


def check_installed(spec: BuildSpec, units: list[Unit]) -> None:
    """The installed toolchain can run every unit (the release the spec pins, the flags and keys it uses):
    PreflightError before any download or GPU time."""
    lane = get_lane(spec.lane)
    for unit in units:
        lane.check_installed(spec, unit)


def input_failure(err: InputError) -> State:
    """A bad input ends the run Failed with one message that names the field and the fix: no traceback in the
    UI. The exception rides along as the state's data, so a caller in Python (the CLI) gets it raised. The message
    is logged at ERROR too: the UI's Logs tab filtered to errors shows why."""
    progress_logger("error")(str(err))
    return Failed(message=str(err), data=err)


def flow_value(result: T | State) -> T:
    """What a flow called as a function returned. A flow that ends in a State raises its error at the call
    (Prefect's engine returns `state.result()` unless `return_state=True`), so a State does not come back here;
    this narrows the flow's declared `X | State` to X for the caller."""
    if isinstance(result, State):
        raise PipelineError(f"the flow ended {result.name}: {result.message or 'no message'}")
    return result


def spec_label(params: dict[str, Any]) -> str:  # JSON edge: the flow run's parameters
    """The spec's name from whichever parameter carries it, for run names."""
    given = params.get("spec")
    inline: dict[str, Any] = given if isinstance(given, dict) else {}  # JSON edge: an inline spec
    if not inline.get("name") and params.get("spec_yaml"):
        try:
            pasted = yaml.safe_load(str(params["spec_yaml"]))
            inline = pasted if isinstance(pasted, dict) else {}
        except yaml.YAMLError:
            inline = {"name": "pasted spec"}
    return str(inline.get("name") or Path(str(params.get("spec_path") or "spec")).stem)


# The names Prefect makes up for a run nobody named. The server's and the Python client's: `generate_slug(2)`
# (prefect/utilities/names.py@3.9.1) = coolname's two-word generator, its "an" rule: one word of its `adj_any`
# lists, a dash, one word of its `subj` lists (coolname/data config, coolname 5.0.0), so a name is Prefect's when
# both words come from those lists (read from coolname itself, not guessed from the name's shape: `nightly-check`
# and `hotfix-rebuild` are a person's). The UI form's: a Greek letter with an optional number, a constellation and
# an optional third word (`delta42-andromedae-nebula`: the bundled UI's FlowRunNameInput, `runName` of its mocker).
UI_GENERATED_NAME = re.compile(r"^(alpha|beta|gamma|delta|epsilon|zeta|eta|theta|iota|kappa|lambda|mu|nu|xi|omicron|"
                               r"pi|rho|sigma|tau|upsilon|phi|chi|psi|omega)\d*-[a-z]+(-[a-z]+)*$")


def _coolname_config() -> dict[str, Any]:  # JSON edge: coolname's word-list configuration (coolname/data)
    from coolname.data import config  # Prefect's own dependency

    return cast(dict[str, Any], config)  # JSON edge: coolname data, typed `object` by its stubs


@functools.cache
def _coolname_words(rule: str) -> frozenset[str]:
    """Every word coolname's rule `rule` can yield (its `words` lists, through `nested` ones)."""
    entry = _coolname_config().get(rule) or {}
    if entry.get("type") == "words":
        return frozenset(entry["words"])
    if entry.get("type") == "nested":
        return frozenset(w for sub in entry["lists"] for w in _coolname_words(sub))
    return frozenset()


def prefect_generated(name: str) -> bool:
    """The name is one Prefect's server, client or UI makes up for a run nobody named."""
    if UI_GENERATED_NAME.match(name):
        return True
    first, sep, second = name.partition("-")
    try:
        adjectives, subjects = _coolname_config()["an"]["lists"]  # the two-word rule: ["adj_any", "subj"]
    except (ImportError, KeyError, ValueError):
        return False  # no coolname (then no Prefect name either): the name is the person's
    return bool(sep) and first in _coolname_words(adjectives) and second in _coolname_words(subjects)


def readable_name(made_up: str) -> str:
    """The run's own name when a person chose it (a Custom run named `ui-bad-path` keeps it), else `made_up`."""
    from prefect.runtime import flow_run

    current = flow_run.name or ""
    return current if current and not prefect_generated(current) else made_up


def _run_name() -> str:
    """`build tiny-cpu (cluster)`: readable in the UI's run list whether the spec came by path or inline; a name
    chosen in the form or by the API caller stays."""
    from prefect.runtime import flow_run

    params = flow_run.parameters
    return readable_name(f"build {spec_label(params)}" + (" (cluster)" if params.get("mode") == "cluster" else ""))


@flow(name="build-engines", flow_run_name=_run_name, log_prints=True)
def build_engines(
    spec_path: str | None = "configs/tiny-cpu.yaml",
    spec: dict[str, Any] | None = None,  # JSON edge: an inline spec, as the UI's form and API callers send it
    targets: list[str] | None = None,
    force: bool = False,
    mode: Mode = "embedded",
    validated: bool = False,
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
        force: build a new build of every unit, even of those published already
        mode: embedded (units in this process) or cluster (each unit on a worker of its target's pool)
        validated: the caller checked the spec's inputs already (the CLI does); skip that check
        verify_hits: re-hash every file of a cache hit (otherwise: manifest consistency and file sizes)
        spec_yaml: the build spec's YAML text, pasted (ignored when `spec` is given); its relative paths resolve
            against the worker's configs/ folder, as for a file there
        store: artifact store (s3://bucket/prefix or file://path); empty: $EF_STORE of the worker, else the spec's
        mlflow_uri: MLflow tracking URI; empty: $MLFLOW_TRACKING_URI of the worker, else the spec's
        s3_endpoint_url: S3 endpoint; empty: $AWS_ENDPOINT_URL_S3 of the worker, else the spec's
    """
    t0 = time.monotonic()
    try:
        build_spec = flow_spec(spec_path, spec, spec_yaml, store=store, mlflow_uri=mlflow_uri,
                               s3_endpoint_url=s3_endpoint_url, validated=validated)
    except InputError as err:
        return input_failure(err)
    units = expand_units(build_spec, targets or None)
    try:
        check_installed(build_spec, units)  # in this process (embedded) or the parent's image (cluster)
    except InputError as err:
        return input_failure(err)
    with watching():  # a cancel of this run or of its parent (a rollout) stops it and its units at once
        return _build(build_spec, units, force, mode, verify_hits, t0)



def _build(build_spec: BuildSpec, units: list[Unit], force: bool, mode: Mode, verify_hits: bool,
           t0: float) -> RunSummary | State:
    run = _prepare(build_spec, units, force, verify_hits, t0)
    convert_s = 0.0
    try:
        report_matrix(run.spec, units, run.keyed.keys, {u.name: run.plan.is_hit(u) for u in units},
                      {u.name: deployment_name(u) if mode == "cluster" else "in-process" for u in units})
        if mode == "cluster":
            built = _build_on_workers(run)
        else:
            built, convert_s = _build_in_process(run)
    finally:
        run.plan.release(progress=progress_logger())
    outcomes = [_outcome(run.spec, unit, run.keyed.keys[unit.name], run.plan, built, run.artifacts, run.parent)
                for unit in units]
    summary = RunSummary(spec=run.spec.name, source_uri=run.snapshot.uri, source_revision=run.snapshot.revision,
                         parent_run_id=run.parent, outcomes=outcomes,
                         stage_seconds={"fetch": round(run.fetch_s, 2), "convert": round(convert_s, 2),
                                        "total": round(time.monotonic() - t0, 2)})
    finish_parent_run(run.spec, run.parent, summary, time.monotonic() - t0, run.fetch_s, convert_s)
    report_build(run.spec, summary)
    return summary if summary.ok else not_passed(summary)


def _prepare(build_spec: BuildSpec, units: list[Unit], force: bool, verify_hits: bool, t0: float) -> ParentRun:
    """fetch → pin → parent run → keys → cache plan → waves."""
    snapshot = fetch_source(build_spec)
    draft = fetch_draft(build_spec, snapshot)  # speculative.draft, pinned so that every worker fetches the same
    build_spec = pinned_draft(build_spec, draft)
    # model.adapters: checked against the fetched base, then fetched (a spec without adapters runs no such task)
    adapters = fetch_adapters(build_spec, snapshot) if build_spec.model.adapters else {}
    build_spec = pinned_adapters(build_spec, adapters)
    fetch_s = time.monotonic() - t0
    parent = start_parent_run(build_spec, snapshot)
    keyed = unit_keys(build_spec, units, SourceDigests.of(snapshot, draft, adapters))
    # Cache check first, so a converted checkpoint is made only for variants that some miss needs. A miss is
    # built under a lease: a concurrent run of the same key waits for our build instead of rebuilding it.
    artifacts = open_store(build_spec.publish.store, build_spec.publish.s3_endpoint_url)
    log = progress_logger()  # Prefect's run logger: waiting for another run's lease shows in the UI
    plan = plan_cache(build_spec.model.name, units, keyed.keys, artifacts, force=force, rehash=verify_hits,
                      progress=log, signatures=hit_signature_policy(build_spec))
    # smoke.reference: sibling: a unit judged by its sibling's served answers runs in a later wave than it.
    siblings = sibling_refs(build_spec, units, keyed.keys)
    return ParentRun(spec=build_spec, units=units, snapshot=snapshot, draft=draft, adapters=adapters, parent=parent,
                     keyed=keyed, artifacts=artifacts, plan=plan, siblings=siblings,
                     waves=reference_waves(plan.misses, siblings), force=force, fetch_s=fetch_s)


def _build_on_workers(run: ParentRun) -> dict[str, UnitOutcome]:
    """Cluster mode: conversion happens on the workers (quantizing needs the target's GPU, and the converted
    checkpoint is published once per key and fetched by the others), wave by wave."""
    built: dict[str, UnitOutcome] = {}
    for wave in run.waves:
        built |= refused_by_sibling(wave, run.siblings, built)  # its sibling failed or was rejected
        todo = [u for u in wave if u.name not in built]
        if todo:
            built |= dispatch_units(run, todo, prefect_context().get(mltags.PREFECT_FLOW_RUN_ID))
    return built


def _build_in_process(run: ParentRun) -> tuple[dict[str, UnitOutcome], float]:
    """Embedded mode: every miss's variant converted here once, then each unit a subflow of this process, wave by
    wave; the outcomes and the conversion's seconds."""
    serves_adapters = run.spec.model.serves_adapters
    # an adapter unit's source: the base ⊕ adapter; a served set's: the base, recording every adapter
    sources: dict[str | None, SourceSnapshot] = {
        None: served_source(run.snapshot, run.adapters) if serves_adapters else run.snapshot}
    converted: dict[str, ConvertedCheckpoint] = {}
    t_convert = time.monotonic()
    for unit in run.plan.misses:
        if unit.adapter is not None and unit.adapter not in sources:
            sources[unit.adapter] = merge_adapter(run.snapshot, unit.adapter, run.adapters[unit.adapter])
        if converted_name(unit) not in converted:
            converted[converted_name(unit)] = convert_variant(run.spec, unit.variant, sources[unit.adapter])
    convert_s = time.monotonic() - t_convert
    built: dict[str, UnitOutcome] = {}
    for unit in (u for wave in run.waves for u in wave):
        built |= refused_by_sibling([unit], run.siblings, built)
        if unit.name not in built:
            built[unit.name] = _unit_subflow(UnitWork(
                spec=run.spec, unit=unit, key_components=run.keyed.components[unit.name],
                snapshot=sources[unit.adapter], ckpt=converted[converted_name(unit)], parent_run_id=run.parent,
                replace=run.force, sibling=run.siblings.get(unit.name), spec_draft=run.draft,
                spec_adapters=run.adapters if serves_adapters else None))
    return built, convert_s


def _unit_subflow(work: UnitWork) -> UnitOutcome:
    """One unit as a subflow of this process, under its pool's limit; a rejected or failed unit's subflow ends
    Failed with its outcome as the state's data."""
    run_unit = unit_pipeline.with_options(flow_run_name=f"unit {work.unit.name}")
    with pool_slot(work.unit.target.pool):  # the pool's limit on concurrent unit builds, where one is set
        state = run_unit(work, return_state=True)
    result = state.result(raise_on_failure=False)
    if isinstance(result, UnitNotPassed):
        return result.outcome
    if isinstance(result, BaseException):  # not an outcome: the subflow itself broke, as before
        raise result
    if not isinstance(result, UnitOutcome):
        raise PipelineError(f"unit {work.unit.name}: its subflow returned {type(result).__name__}, "
                            "not an outcome")
    return result


def converted_name(unit: Unit) -> str:
    """The converted checkpoint a unit builds from: its variant's, of the base or of the base ⊕ its adapter."""
    return unit.variant.name + (f"+{unit.adapter}" if unit.adapter else "")


def not_passed(summary: RunSummary) -> State:
    """A rejected or failed unit ends the run Failed, as its MLflow parent run and the CLI's exit code say: the
    message names the units and reasons, an error in the run's log says the same (the Logs tab filtered to errors
    shows it). The summary rides along in the error (the CLI prints its table), so no traceback is logged for it
    (tasks/_log.py)."""
    err = UnitsNotPassed(summary)
    progress_logger("error")(str(err))
    return Failed(message=str(err), data=err)


def _outcome(spec: BuildSpec, unit: Unit, key: str, plan: CachePlan, built: dict[str, UnitOutcome], store: Store,
             parent: str) -> UnitOutcome:
    """Built here, a hit (published before, or by the unit of the same key this run built), or the fate of
    the unit of the same key that this run failed to publish."""
    if unit.name in built:
        return built[unit.name]
    hit = plan.hit_of(unit)
    if hit is None:  # a duplicate of a unit built in this run: it shares that build, or its failure
        first = built[plan.duplicates[unit.name]]
        hit = find_hit(store, spec.model.name, key) if first.manifest_uri else None
        if hit is None:
            return duplicate_outcome(first, unit)
    outcome = record_cache_hit(spec, unit, key, hit, parent)
    manifest = hit.manifest
    if manifest is None:  # find_hit and the plan's hits are unit builds: a checkpoint is never a unit's hit
        raise PipelineError(f"unit {unit.name}: cache hit {hit.uri} has no unit manifest")
    built_by = mlflow_run_link(spec, manifest.mlflow_run_id) if manifest.mlflow_run_id else hit.uri
    progress_logger()(f"cache hit: {unit.name} ({manifest.status}) is published at {hit.uri}; built by MLflow run "
                      f"{built_by}" + (f", Prefect flow run {manifest.prefect_flow_run_id}"
                                       if manifest.prefect_flow_run_id else ""))
    report_cache_hit(unit.name, key, built_by, hit.uri)
    return outcome
