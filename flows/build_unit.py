"""The unit deployment flow (`build-unit/<pool>`): one unit, on a worker of its target's work pool.

The parent (flows/build_engines.py in cluster mode) sends the spec, the unit's name, its key components and
the source identity. The worker checks that it is the right machine (pool, GPU architecture/SKU, toolchain
versions the key was computed with), fetches exactly the source the parent saw (commit sha, digests checked) and,
with model.adapters, the adapters the unit needs (digests checked against its key; merge mode: merged into the base
here, as embedded mode merges in the parent's process), takes the converted checkpoint from the store (or converts
it), runs the stages and leaves its outcome in the store for the parent.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import State
from prefect.states import Failed
from pydantic import ValidationError

from enginefoundry.errors import EngineFoundryError, InputError, PipelineError, first_problem
from enginefoundry.evidence.signing import require_signer_for
from enginefoundry.flows.build_engines import resolve_spec
from enginefoundry.flows.unit import run_unit_stages, unit_failed_state
from enginefoundry.gpu.placement import check_placement, check_toolchain
from enginefoundry.inputs.adapters import changed_adapters, served_source, unit_adapters
from enginefoundry.inputs.sources import SourceIdentity, SourceSnapshot
from enginefoundry.inputs.units import KeyComponents, Unit, expand_units
from enginefoundry.lanes import get_lane
from enginefoundry.records.outcomes import save_outcome
from enginefoundry.records.run_summary import UnitOutcome
from enginefoundry.records.unit_run import UnitWork
from enginefoundry.smoke.sibling import SiblingRef
from enginefoundry.spec import BuildSpec, SourceKind
from enginefoundry.store.backends import open_store
from enginefoundry.tasks._log import progress_logger, quiet_expected_failures
from enginefoundry.tasks.cancel_watch import watching
from enginefoundry.tasks.convert import convert_variant
from enginefoundry.tasks.fetch import fetch_adapters, fetch_draft, fetch_source, merge_adapter
from enginefoundry.tasks.pool_limits import pool_slot

quiet_expected_failures()  # a refused or failed unit's Failed end logs no engine traceback (tasks/_log.py)


@task(name="check placement", task_run_name="check placement of {unit.name}", cache_policy=NO_CACHE)
def check_worker(unit: Unit, key_components: KeyComponents | None, lane_name: str, spec: BuildSpec) -> str:
    """Refuse before any download: wrong pool, wrong GPU, a toolchain other than the one in the key, an
    installed release that cannot run the unit, or no signing key when the spec requires signatures."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    # The pool the run was dispatched through; None when the flow is called outside a worker (tests, CLI).
    pool = getattr(ctx.flow_run, "work_pool_name", None) if ctx and ctx.flow_run else None
    verdict = check_placement(unit.target, pool, unit.variant.tp * unit.variant.pp)
    lane = get_lane(lane_name)
    lane.check_installed(spec, unit)
    planned = (key_components.toolchain.versions or {}) if key_components and key_components.toolchain else {}
    require_signer_for(spec)  # this worker publishes: with publish.require_signature it needs a key of its own
    check_toolchain(unit.name, planned, lane.versions())
    progress_logger()(f"placement: {verdict}")
    return verdict


def pinned(spec: BuildSpec, source: SourceIdentity) -> BuildSpec:
    """The spec with its source pinned to what the parent fetched: a branch may have moved since."""
    if source.kind is not SourceKind.HF or not source.revision:
        return spec
    repo = spec.model.parsed_source(spec.base_path).location
    model = spec.model.model_copy(update={"source": f"hf://{repo}@{source.revision}"})
    return spec.model_copy(update={"model": model})


def unit_components(raw: dict[str, Any]) -> KeyComponents | None:  # JSON edge: the flow's parameter
    """The parent's key components, typed; None when none were sent (`{}`: the placement check still runs)."""
    if not raw:
        return None
    try:
        typed = KeyComponents.of(raw)
    except ValidationError as err:
        where, msg = first_problem(err)
        raise InputError(f"key_components.{where}: {msg}; the parent flow (build-engines, mode cluster) "
                         "sends each unit's key components: start units through it") from None
    if typed.missing():
        raise InputError(f"key_components.{typed.missing()[0]}: Field required; the parent flow (build-engines, "
                         "mode cluster) sends each unit's key components: start units through it")
    return typed


# Parameters stay JSON (the UI's form, the parent's run_deployment): `spec` and `key_components` are typed at the
# flow's entry (resolve_spec, unit_components); `source` and `sibling` are pydantic models Prefect validates.
@flow(name="build-unit", flow_run_name="unit {unit}", log_prints=True)
def build_unit(
    spec: dict[str, Any],  # JSON edge: the parent's spec_payload
    unit: str,
    key_components: dict[str, Any],  # JSON edge: typed by unit_components
    source: SourceIdentity, parent_run_id: str, replace: bool = False, sibling: SiblingRef | None = None,
) -> UnitOutcome | State:
    """A refusal (wrong pool, GPU or toolchain; a unit not in the spec; a source that moved) or a failed unit
    ends the run Failed with one message and no traceback; the parent reads the outcome from the store.
    `sibling`: the unit whose served answers judge this one (smoke.reference: sibling)."""
    try:
        with watching():  # its own cancel, or its parent build's (the UI's default dialog cancels only that)
            return _build_unit(spec, unit, key_components, source, parent_run_id, replace, sibling)
    except EngineFoundryError as err:
        progress_logger("error")(str(err))
        return Failed(message=str(err), data=err)


def _build_unit(spec: dict[str, Any], unit: str, key_components: dict[str, Any],  # JSON edge: the parameters
                source: SourceIdentity,
                parent_run_id: str, replace: bool, sibling: SiblingRef | None = None) -> UnitOutcome | State:
    build_spec = resolve_spec(None, dict(spec))
    matches = [u for u in expand_units(build_spec) if u.name == unit]
    if not matches:
        raise InputError(f"unit {unit} is not in spec {build_spec.name}")
    the_unit = matches[0]
    components = unit_components(key_components)
    check_worker(the_unit, components, build_spec.lane, build_spec)
    if components is None:
        raise InputError(f"unit {unit}: key_components is empty; the parent flow (build-engines, mode cluster) "
                         "sends each unit's key components: start units through it")
    with pool_slot(the_unit.target.pool):  # the pool's limit on concurrent unit builds, where one is set
        return _build_checked(build_spec, the_unit, components, source, parent_run_id, replace, sibling)


def _build_checked(build_spec: BuildSpec, the_unit: Unit, components: KeyComponents, source: SourceIdentity,
                   parent_run_id: str, replace: bool, sibling: SiblingRef | None) -> UnitOutcome | State:
    local = fetch_source(pinned(build_spec, source))
    if (local.weights_digest, local.tokenizer_digest) != (source.weights_digest, source.tokenizer_digest):
        raise PipelineError(f"source {source.uri} changed after the parent fetched it (weights "
                            f"{source.weights_digest[:12]} → {local.weights_digest[:12]}); rerun the build")
    # The parent's identity (requested revision, URI as written in the spec) with this machine's folder.
    here = source.at(local.local_dir)
    draft = fetch_draft(build_spec, here)  # the parent pinned it (pinned_draft): its digests are in the key
    spec_key = components.speculative
    want = (spec_key.draft_weights_digest, spec_key.draft_tokenizer_digest) if spec_key else (None, None)
    if draft is not None and (draft.weights_digest, draft.tokenizer_digest) != want:
        raise PipelineError(f"speculative.draft {draft.uri} changed after the parent fetched it (weights "
                            f"{str(want[0])[:12]} → {draft.weights_digest[:12]}); rerun the build")
    served, unit_source = unit_adapter_source(build_spec, the_unit, components, here)
    ckpt = convert_variant(build_spec, the_unit.variant, unit_source)
    outcome = run_unit_stages(UnitWork(spec=build_spec, unit=the_unit, key_components=components,
                                       snapshot=unit_source, ckpt=ckpt, parent_run_id=parent_run_id, replace=replace,
                                       sibling=sibling, spec_draft=draft, spec_adapters=served or None))
    save_outcome(open_store(build_spec.publish.store, build_spec.publish.s3_endpoint_url), build_spec.model.name,
                 parent_run_id, outcome)
    # A rejected or failed unit's run shows Failed in the UI; the parent still reads the outcome from the store.
    return outcome if outcome.ok else unit_failed_state(outcome)


def unit_adapter_source(spec: BuildSpec, unit: Unit, components: KeyComponents,
                        base: SourceSnapshot) -> tuple[dict[str, SourceSnapshot], SourceSnapshot]:
    """model.adapters on the worker, as embedded mode does them in the parent's process (flows/build_engines.py):
    the adapters this unit needs fetched (adapter_mode merge: its own; serve: every one; the parent pinned Hub
    revisions in the spec it sent), their digests checked against the unit's key, and the unit's source: the base ⊕
    its adapter (merged once per digest on this machine), the base recording every served adapter, or the base.
    Returns (the adapters the unit serves by name: serve mode's, else none; the unit's source)."""
    if not spec.model.adapters:
        return {}, base
    adapters = fetch_adapters(unit_adapters(spec, unit.adapter), base)
    if changed := changed_adapters(components.adapter, adapters):
        raise PipelineError(f"model.adapters {', '.join(changed)}: not the adapter revision the parent fetched (the "
                            "digest in the unit's key); an adapter changed during the run: rerun the build")
    if spec.model.serves_adapters:
        return adapters, served_source(base, adapters)
    if unit.adapter is None:  # merge mode makes one unit per adapter: a unit without one is not of this spec
        raise InputError(f"unit {unit.name}: model.adapter_mode merge builds one unit per adapter; start units "
                         "through the parent flow (build-engines, mode cluster)")
    return {}, merge_adapter(base, unit.adapter, adapters[unit.adapter])
