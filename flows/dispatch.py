"""Cluster fan-out: each unit goes to the `build-unit/<pool>` deployment of its target's work pool.

The parent creates every unit's flow run first (so pools work in parallel), then waits for all of them.
Only small JSON travels as parameters: the spec, the unit's name and key components, and the source
snapshot's identity (URI, commit, digests). The worker publishes the unit to the store and leaves its
outcome there as a small JSON file, which the parent reads back: results never depend on Prefect result
storage being shared between machines.
"""

from __future__ import annotations

import os
from typing import Any, cast

from prefect import get_run_logger
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.objects import FlowRun
from prefect.deployments import run_deployment
from prefect.exceptions import FlowRunWaitTimeout, ObjectNotFound

from enginefoundry.inputs.sources import SourceIdentity, SourceSnapshot
from enginefoundry.inputs.units import KeyComponents, Unit
from enginefoundry.planning.cluster_jobs import SECRET_ENV_VARIABLE, secret_env_map, unit_job_variables
from enginefoundry.planning.parent_run import ParentRun
from enginefoundry.records.outcomes import read_outcome
from enginefoundry.records.run_summary import UnitOutcome
from enginefoundry.settings import EnvSettings
from enginefoundry.smoke.sibling import SiblingRef
from enginefoundry.spec import BuildSpec
from enginefoundry.store.unit_status import UnitStatus
from enginefoundry.tasks.cancel_watch import track_child

UNIT_FLOW = "build-unit"
# A unit that no worker picked up, or that runs longer than EF_UNIT_TIMEOUT_S (enginefoundry.settings), counts
# as failed (a GPU build of a large model takes hours; a missing worker should not hang a rollout forever).
NOTE_EVERY_S = 60.0


def deployment_name(unit: Unit) -> str:
    return f"{UNIT_FLOW}/{unit.target.pool}"


def spec_payload(spec: BuildSpec) -> dict[str, Any]:  # JSON edge: the spec as a flow parameter
    """The spec as a flow parameter: JSON, with the folder its relative paths resolve against."""
    return {**spec.model_dump(mode="json"), "base_dir": spec.base_dir}


def unit_parameters(spec_payload: dict[str, Any],  # JSON edge: the spec as a flow parameter
                    unit: Unit, key_components: KeyComponents, snapshot: SourceSnapshot, parent_run_id: str,
                    replace: bool = False, sibling: SiblingRef | None = None,
                    ) -> dict[str, Any]:  # JSON edge: run_deployment's parameters
    """The `build-unit` flow's parameters. JSON edge: they travel through the Prefect API as JSON."""
    params = {"spec": spec_payload, "unit": unit.name, "key_components": key_components.as_json(),
              "source": SourceIdentity.of(snapshot).model_dump(mode="json"), "parent_run_id": parent_run_id,
              "replace": replace}
    if sibling is not None:  # only then: deployments registered before sibling references keep working
        params["sibling"] = sibling.model_dump(mode="json")
    return params


def existing_secret_blocks(client: SyncPrefectClient, wanted: dict[str, str]) -> dict[str, str]:
    """The env → Secret block pairs whose block exists on the Prefect server: a reference to a missing block
    would fail the worker's job preparation, so those are left out."""
    found: dict[str, str] = {}
    for name, block in wanted.items():
        try:
            client.read_block_document_by_name(block, block_type_slug="secret", include_secrets=False)
        except ObjectNotFound:
            continue
        found[name] = block
    return found


def job_variables_for(spec: BuildSpec, units: list[Unit]) -> dict[str, dict[str, Any]]:  # JSON edge: job variables
    """Per unit: its GPUs (tp × pp), the spec's image and digest, the GPU products, secrets by reference."""
    wanted = secret_env_map(os.environ.get(SECRET_ENV_VARIABLE))
    with get_client(sync_client=True) as client:
        secrets = existing_secret_blocks(client, wanted)
    if secrets:
        get_run_logger().info(f"dispatch: unit jobs get {', '.join(sorted(secrets))} from Prefect Secret blocks "
                              f"{', '.join(sorted(secrets.values()))}")
    return {u.name: unit_job_variables(spec, u, secrets).as_job_variables() for u in units}


def dispatch_units(run: ParentRun, units: list[Unit], parent_flow_run_id: str | None) -> dict[str, UnitOutcome]:
    """Run every unit of `units` (one wave of `run`) on its pool and wait; one outcome per unit, failures included.
    `run.force`: --force (each worker's build becomes the current build of its key). `run.siblings`: judged unit →
    the sibling unit whose served answers judge it (the caller dispatches siblings in an earlier wave)."""
    outcomes: dict[str, UnitOutcome] = {}
    started = _start_units(run, units, parent_flow_run_id, outcomes)
    finals = _wait(started)
    end_runs_of_ended_units(run.spec, finals)
    for unit_name, (unit, flow_run) in started.items():
        final = finals[unit_name]
        outcome = read_outcome(run.artifacts, run.spec.model.name, run.parent, unit_name)
        if outcome is not None:
            outcomes[unit_name] = outcome
        elif final.state is not None and final.state.is_completed():
            outcomes[unit_name] = _failed(unit, f"{flow_run.name} completed without leaving an outcome in the store")
        else:
            message = (final.state.message or "").splitlines()[0][:300] if final.state else ""
            outcomes[unit_name] = _failed(unit, f"{deployment_name(unit)} run {flow_run.name} ended "
                                                f"{final.state.name if final.state else 'unknown'}: {message}")
    return {u.name: outcomes[u.name] for u in units}


def _start_units(run: ParentRun, units: list[Unit], parent_flow_run_id: str | None,
                 outcomes: dict[str, UnitOutcome]) -> dict[str, tuple[Unit, FlowRun]]:
    """Each unit's flow run created on its pool's deployment (not waited for); a unit whose deployment is missing
    gets its failed outcome in `outcomes` instead."""
    log = get_run_logger()
    started: dict[str, tuple[Unit, FlowRun]] = {}
    job_variables = job_variables_for(run.spec, units)
    payload = spec_payload(run.spec)
    for unit in units:
        name = deployment_name(unit)
        try:
            # run_deployment is sync_compatible: called from sync code it returns the FlowRun, not a coroutine
            flow_run = cast(FlowRun, run_deployment(
                name, parameters=unit_parameters(payload, unit, run.keyed.components[unit.name], run.snapshot,
                                                 run.parent, run.force, run.siblings.get(unit.name)),
                timeout=0, job_variables=job_variables[unit.name],
                flow_run_name=f"unit {unit.name}", tags=["enginefoundry", "unit", unit.target.pool],
                # A retried parent re-attaches to the runs it already started instead of building twice.
                idempotency_key=f"{parent_flow_run_id or run.parent}:{unit.name}",
            ))
        except ObjectNotFound:
            outcomes[unit.name] = _failed(unit, f"no deployment {name}: deploy deployment.yaml (prefect deploy "
                                                f"--all) or set targets[].work_pool to a deployed pool")
            continue
        track_child(flow_run.id)  # a cancel of this run moves it to Cancelling too (tasks/cancel_watch.py)
        log.info(f"dispatch: {unit.name} → {name} (flow run {flow_run.name}; job variables "
                 f"{ {k: v for k, v in job_variables[unit.name].items() if k != 'env'} })")
        started[unit.name] = (unit, flow_run)
    return started


def end_runs_of_ended_units(spec: BuildSpec, finals: dict[str, FlowRun]) -> None:
    """A unit run that ended (cancelled, crashed: its worker gone) without ending its MLflow run: the parent ends it
    KILLED now (records.tracking.end_orphaned_runs), instead of leaving it RUNNING until a run on that host."""
    from enginefoundry.records.tracking import Tracker, end_orphaned_runs

    over = {str(f.id): f.state.name for f in finals.values() if f.state is not None and f.state.is_final()}
    if not over:
        return
    try:
        tracker = Tracker(spec.tracking.mlflow_uri, spec.tracking.experiment)
        ended = end_orphaned_runs(tracker.client, [tracker.experiment_id], over.get)
    except Exception as err:  # MLflow away: the next rollout ends them
        get_run_logger().warning(f"dispatch: could not end the MLflow runs of ended units ({type(err).__name__})")
        return
    if ended:
        get_run_logger().warning(f"dispatch: MLflow run(s) {', '.join(ended)} of units whose flow run ended "
                                 "without ending them: ended KILLED")


def _wait(started: dict[str, tuple[Unit, FlowRun]]) -> dict[str, FlowRun]:
    """Wait for every unit run with Prefect's own wait API (prefect.flow_runs.wait_for_flow_run: the server's
    event stream, no polling), all at once; every wait is logged through the run logger, so the UI shows what
    the parent waits for. A unit past EF_UNIT_TIMEOUT_S is cancelled and counts as failed."""
    from prefect.utilities.asyncutils import run_coro_as_sync

    log = get_run_logger()
    timeout = EnvSettings().unit_timeout_s
    return run_coro_as_sync(_wait_all(started, log, timeout)) or {}


async def _wait_all(started: dict[str, tuple[Unit, FlowRun]], log: Any, timeout_s: float) -> dict[str, FlowRun]:
    import anyio
    from prefect.flow_runs import wait_for_flow_run
    from prefect.states import Cancelling

    finals: dict[str, FlowRun] = {}
    async with get_client() as client:

        async def wait_one(unit_name: str, run: FlowRun) -> None:
            try:
                final: FlowRun = await wait_for_flow_run(run.id, timeout=int(timeout_s), client=client)
            except FlowRunWaitTimeout:
                log.warning(f"dispatch: {unit_name} not finished after {timeout_s:.0f} s (EF_UNIT_TIMEOUT_S): "
                            "cancelling it")
                await client.set_flow_run_state(run.id, Cancelling(message="unit timeout"), force=True)
                final = await client.read_flow_run(run.id)
            finals[unit_name] = final
            log.info(f"dispatch: {unit_name} finished {final.state.name if final.state else '?'}")

        async def note_pending() -> None:
            while True:
                await anyio.sleep(NOTE_EVERY_S)
                for unit_name, (unit, run) in started.items():
                    if unit_name in finals:
                        continue
                    state = (await client.read_flow_run(run.id)).state
                    waiting = state is not None and (state.is_scheduled() or state.is_pending())
                    log.info(f"dispatch: waiting for {unit_name} ({run.name}): {state.name if state else '?'}"
                             + (f", no worker of pool {unit.target.pool} has taken it yet" if waiting else ""))

        for unit_name, (unit, run) in started.items():
            log.info(f"dispatch: waiting for {unit_name} on pool {unit.target.pool} (flow run {run.name})")
        async with anyio.create_task_group() as waits:
            waits.start_soon(note_pending)
            async with anyio.create_task_group() as units:
                for unit_name, (_unit, run) in started.items():
                    units.start_soon(wait_one, unit_name, run)
            waits.cancel_scope.cancel()
    return finals


def _failed(unit: Unit, reason: str) -> UnitOutcome:
    return UnitOutcome(unit=unit.name, target=unit.target.name, status=UnitStatus.FAILED, reason=reason[:300])
