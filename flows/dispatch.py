"""Cluster fan-out: each unit goes to the `build-unit/<pool>` deployment of its target's work pool.

Pools work in parallel; within a pool the parent keeps at most the pool's limit of its units submitted and
unfinished (the `build-unit/<pool>` deployment's concurrency limit, or the pool's limit where smaller) and sends the
next as one ends, so Prefect never has to refuse a unit run for want of a slot (enginefoundry/planning/release.py).
Only small JSON travels as parameters: the spec, the unit's name and key components, and the source
snapshot's identity (URI, commit, digests). The worker publishes the unit to the store and leaves its
outcome there as a small JSON file, which the parent reads back: results never depend on Prefect result
storage being shared between machines.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from prefect import get_run_logger
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.objects import FlowRun
from prefect.exceptions import FlowRunWaitTimeout, ObjectNotFound

from enginefoundry.inputs.sources import SourceIdentity, SourceSnapshot
from enginefoundry.inputs.units import KeyComponents, Unit
from enginefoundry.planning.cluster_jobs import SECRET_ENV_VARIABLE, secret_env_map, unit_job_variables
from enginefoundry.planning.parent_run import ParentRun
from enginefoundry.planning.release import PoolRelease, release_limit
from enginefoundry.records.outcomes import read_outcome
from enginefoundry.records.run_summary import UnitOutcome
from enginefoundry.runner import cancel_reason, terminating
from enginefoundry.settings import EnvSettings
from enginefoundry.smoke.sibling import SiblingRef
from enginefoundry.spec import BuildSpec
from enginefoundry.store.unit_status import UnitStatus
from enginefoundry.tasks.cancel_watch import track_child
from enginefoundry.tasks.pool_limits import pool_limit

if TYPE_CHECKING:
    from anyio.abc import TaskGroup
    from prefect.client.orchestration import PrefectClient

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
    the sibling unit whose served answers judge it (the caller dispatches siblings in an earlier wave).

    A pool's units are released no faster than the pool takes them (enginefoundry/planning/release.py): at most its
    limit submitted and unfinished, the next sent as one ends, so Prefect's deployment concurrency limit has nothing
    to refuse. A cancel of the run stops the release: the units not sent yet are not dispatched."""
    from prefect.utilities.asyncutils import run_coro_as_sync

    outcomes: dict[str, UnitOutcome] = {}
    release = PoolRelease(((u.name, u.target.pool) for u in units), release_limits(units))
    job_variables = job_variables_for(run.spec, units)
    sent: tuple[Started, dict[str, FlowRun]] | None = run_coro_as_sync(
        _dispatch_all(run, units, parent_flow_run_id, release, job_variables, outcomes))
    started, finals = sent if sent is not None else ({}, {})
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


def deployment_limit(client: SyncPrefectClient, name: str) -> int | None:
    """The deployment's concurrency limit (Prefect 3.9.1 keeps it as a global concurrency limit of the deployment,
    `DeploymentResponse.global_concurrency_limit`, prefect/client/schemas/responses.py; the server enforces it in
    `SecureFlowConcurrencySlots`, prefect/server/orchestration/core_policy.py), None where it has none, it is
    inactive or the deployment is missing (its units then fail with the fix when they are sent)."""
    try:
        deployment = client.read_deployment_by_name(name)
    except ObjectNotFound:
        return None
    found = deployment.global_concurrency_limit
    return found.limit if found is not None and found.active else None


def release_limits(units: list[Unit]) -> dict[str, int | None]:
    """Per pool of `units`: how many of its units the parent keeps submitted and unfinished (its deployment's
    concurrency limit, or its pool's limit of tasks/pool_limits.py where that is smaller); logged."""
    log = get_run_logger()
    by_pool = {u.target.pool: deployment_name(u) for u in units}
    limits: dict[str, int | None] = {}
    with get_client(sync_client=True) as client:
        for pool, name in by_pool.items():
            of_deployment, of_pool = deployment_limit(client, name), pool_limit(pool)
            limits[pool] = limit = release_limit(of_deployment, of_pool)
            count = sum(1 for u in units if u.target.pool == pool)
            if limit is not None and count > limit:
                log.info(f"dispatch: pool {pool} takes {limit} unit(s) at once ({name}'s concurrency limit "
                         f"{of_deployment if of_deployment is not None else 'none'}, the pool's limit "
                         f"{of_pool if of_pool is not None else 'none'}): of its {count} units, the next is sent "
                         "when one ends")
    return limits


Started = dict[str, tuple[Unit, FlowRun]]  # unit → its flow run, as sent


async def _dispatch_all(run: ParentRun, units: list[Unit], parent_flow_run_id: str | None, release: PoolRelease,
                        job_variables: Mapping[str, Mapping[str, object]],  # each unit's, as Prefect takes them
                        outcomes: dict[str, UnitOutcome]) -> tuple[Started, dict[str, FlowRun]]:
    """Send `units` to their pools as `release` releases them and wait for each with Prefect's own wait API
    (prefect.flow_runs.wait_for_flow_run: the server's event stream, no polling), in Prefect's run-sync event loop
    (the flow run's context travels with the coroutine, so each unit run is the parent's subflow, as with
    `run_deployment`); each end sends the next. Every send and wait is logged through the run logger, so the UI
    shows what the parent waits for. Once the run is cancelled (or SIGTERM arrived) nothing more is sent: the units
    not sent get their outcome in `outcomes`. Returns the units sent and their final flow runs."""
    import anyio

    log = get_run_logger()
    by_name = {u.name: u for u in units}
    payload = spec_payload(run.spec)
    started: Started = {}
    finals: dict[str, FlowRun] = {}
    async with get_client() as client:

        async def release_next(waits: TaskGroup) -> None:
            while ready := ([] if terminating() else release.next_units()):
                for unit_name in ready:
                    unit = by_name[unit_name]
                    params = unit_parameters(payload, unit, run.keyed.components[unit_name], run.snapshot, run.parent,
                                             run.force, run.siblings.get(unit_name))
                    key = f"{parent_flow_run_id or run.parent}:{unit_name}"
                    flow_run = None if terminating() else await _send(client, unit, params, job_variables[unit_name],
                                                                      key, outcomes)
                    if flow_run is None:
                        release.finished(unit_name)
                        continue
                    started[unit_name] = (unit, flow_run)
                    log.info(f"dispatch: waiting for {unit_name} on pool {unit.target.pool} (flow run {flow_run.name})")
                    waits.start_soon(wait_one, unit_name, flow_run, waits)
            if terminating():
                _withhold(release, by_name, started, outcomes)

        async def wait_one(unit_name: str, flow_run: FlowRun, waits: TaskGroup) -> None:
            finals[unit_name] = await _wait_final(client, unit_name, flow_run)
            release.finished(unit_name)
            await release_next(waits)

        async with anyio.create_task_group() as notes:
            notes.start_soon(_note_pending, client, started, finals, release)
            async with anyio.create_task_group() as waits:
                await release_next(waits)
            notes.cancel_scope.cancel()
    return started, finals


def _withhold(release: PoolRelease, units: dict[str, Unit], started: Started,
              outcomes: dict[str, UnitOutcome]) -> None:
    """The run is stopping: no unit is released any more, and every unit not sent gets its outcome."""
    why = cancel_reason() or "the run is stopping"
    release.withhold()
    for unit_name, unit in units.items():
        if unit_name not in started and unit_name not in outcomes:
            outcomes[unit_name] = _failed(unit, f"not dispatched: {why}")


async def _send(client: PrefectClient, unit: Unit,
                parameters: Mapping[str, object],  # the build-unit flow's (unit_parameters), passed on as they are
                job_variables: Mapping[str, object],  # the unit's (job_variables_for), passed on as they are
                idempotency_key: str, outcomes: dict[str, UnitOutcome]) -> FlowRun | None:
    """The unit's flow run created on its pool's deployment (not waited for); None, its failed outcome in
    `outcomes`, where the deployment is missing."""
    from prefect.deployments import arun_deployment
    from prefect.states import Cancelling

    name = deployment_name(unit)
    try:
        flow_run = await arun_deployment(
            name, client=client, parameters=dict(parameters), timeout=0, job_variables=dict(job_variables),
            flow_run_name=f"unit {unit.name}", tags=["enginefoundry", "unit", unit.target.pool],
            idempotency_key=idempotency_key,  # a retried parent re-attaches to the runs it started, never builds twice
        )
    except ObjectNotFound:
        outcomes[unit.name] = _failed(unit, f"no deployment {name}: deploy deployment.yaml (prefect deploy "
                                            "--all) or set targets[].work_pool to a deployed pool")
        return None
    track_child(flow_run.id)  # a cancel of this run moves it to Cancelling too (tasks/cancel_watch.py)
    if terminating():  # cancelled while it was created: the watcher may have listed its children before it
        await client.set_flow_run_state(flow_run.id, Cancelling(message="its parent was cancelled"), force=True)
    get_run_logger().info(f"dispatch: {unit.name} → {name} (flow run {flow_run.name}; job variables "
                          f"{ {k: v for k, v in job_variables.items() if k != 'env'} })")
    return flow_run


async def _wait_final(client: PrefectClient, unit_name: str, run: FlowRun) -> FlowRun:
    """The unit run once it ended; past EF_UNIT_TIMEOUT_S after it was sent, cancelled (it counts as failed)."""
    from prefect.flow_runs import wait_for_flow_run
    from prefect.states import Cancelling

    log = get_run_logger()
    timeout_s = EnvSettings.read().unit_timeout_s
    try:
        final: FlowRun = await wait_for_flow_run(run.id, timeout=int(timeout_s), client=client)
    except FlowRunWaitTimeout:
        log.warning(f"dispatch: {unit_name} not finished after {timeout_s:.0f} s (EF_UNIT_TIMEOUT_S): cancelling it")
        await client.set_flow_run_state(run.id, Cancelling(message="unit timeout"), force=True)
        final = await client.read_flow_run(run.id)
    log.info(f"dispatch: {unit_name} finished {final.state.name if final.state else '?'}")
    return final


async def _note_pending(client: PrefectClient, started: Started, finals: dict[str, FlowRun],
                        release: PoolRelease) -> None:
    """Every NOTE_EVERY_S: what each sent unit is doing, and how many of each pool's units are not sent yet."""
    import anyio

    log = get_run_logger()
    while True:
        await anyio.sleep(NOTE_EVERY_S)
        for unit_name, (unit, run) in list(started.items()):
            if unit_name in finals:
                continue
            state = (await client.read_flow_run(run.id)).state
            waiting = state is not None and (state.is_scheduled() or state.is_pending())
            log.info(f"dispatch: waiting for {unit_name} ({run.name}): {state.name if state else '?'}"
                     + (f", no worker of pool {unit.target.pool} has taken it yet" if waiting else ""))
        for pool in release.pools():
            if held := release.waiting(pool):
                log.info(f"dispatch: {held} unit(s) of pool {pool} not sent yet (at most {release.limit(pool)} at "
                         "once)")


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


def _failed(unit: Unit, reason: str) -> UnitOutcome:
    return UnitOutcome(unit=unit.name, target=unit.target.name, status=UnitStatus.FAILED, reason=reason[:300])
