"""The fleet flow: one parent run rolls out many specs (files, or folders of them), each as a `rollout` subflow
with its own champions, under per-pool limits on concurrent unit builds; one summary for all (Prefect artifacts
`fleet-<name>`, MLflow fleet run, the CLI's table and `--json`). A spec that fails (an invalid spec, a build that
breaks, units that do not pass) is recorded as failed and the next spec runs; the run ends Failed when any did.

The specs roll out one after another in this parent. In cluster mode each spec's units run on their targets' work
pools, in parallel, and hold a slot of their pool's limit while they build (tasks/pool_limits.py): the limits are
Prefect global concurrency limits on the server, so they hold across workers, concurrent fleets and builds.
"""

from __future__ import annotations

import time
from pathlib import Path

from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.client.schemas.objects import State
from prefect.states import Failed

from enginefoundry.errors import EngineFoundryError, InputError
from enginefoundry.flows.build_engines import Mode, input_failure, readable_name
from enginefoundry.flows.reports import artifact_key
from enginefoundry.flows.rollout import rollout
from enginefoundry.rollout.fleet import (
    FleetMember,
    FleetNotOk,
    FleetRolloutOptions,
    FleetSummary,
    check_pool_limit,
    fleet_spec_paths,
)
from enginefoundry.rollout.source_change import RolloutReport
from enginefoundry.settings import effective_spec
from enginefoundry.spec import BuildSpec, load_spec
from enginefoundry.tasks._log import progress_logger
from enginefoundry.tasks.fleet import FleetRun, finish_fleet_run, link_to_fleet, start_fleet_run
from enginefoundry.tasks.pool_limits import set_pool_limits


def _run_name() -> str:
    from prefect.runtime import flow_run

    return readable_name(f"fleet {flow_run.parameters.get('name') or 'fleet'}")


@flow(name="rollout-fleet", flow_run_name=_run_name, log_prints=True)
def rollout_fleet(
    specs: list[str] | None = None,
    name: str = "fleet",
    mode: Mode = "embedded",
    pool_limits: dict[str, int] | None = None,
    max_accuracy_drop: float = 0.02,
    min_throughput_ratio: float = 0.9,
    max_ttft_p95_factor: float = 1.25,
    comparison_rounds: int = 3,
    force_build: bool = False,
    store: str | None = None,
    mlflow_uri: str | None = None,
    s3_endpoint_url: str | None = None,
) -> FleetSummary | State:
    """Roll out every spec of a fleet; one failing spec stops no other.

    Args:
        specs: spec files and folders of specs (their *.yaml) on the worker, relative to the project folder
        name: the fleet's name (run name, artifact keys, MLflow fleet run)
        mode: embedded (units in this process) or cluster (each unit on its target's work pool)
        pool_limits: work pool → most unit builds at once on it (a Prefect global concurrency limit per pool,
            `enginefoundry-pool-<pool>`, set before the first spec runs; empty: the limits stay as they are)
        max_accuracy_drop: as the rollout flow's, for every spec
        min_throughput_ratio: as the rollout flow's, for every spec
        max_ttft_p95_factor: as the rollout flow's, for every spec
        comparison_rounds: as the rollout flow's, for every spec
        force_build: build every spec even when its source has nothing new
        store: artifact store for every spec; empty: $EF_STORE of the worker, else each spec's
        mlflow_uri: MLflow tracking URI for every spec; empty: $MLFLOW_TRACKING_URI of the worker, else each spec's
        s3_endpoint_url: S3 endpoint for every spec; empty: $AWS_ENDPOINT_URL_S3 of the worker, else each spec's
    """
    t0 = time.monotonic()
    try:
        paths = fleet_spec_paths(specs or [])
        limits = {pool: check_pool_limit(pool, n, f"pool_limits.{pool}") for pool, n in (pool_limits or {}).items()}
    except InputError as err:
        return input_failure(err)
    log = progress_logger()
    log(f"fleet {name}: {len(paths)} spec(s): {', '.join(str(p) for p in paths)}")
    if limits:
        set_pool_limits(limits)
    options = FleetRolloutOptions(
        mode=mode, max_accuracy_drop=max_accuracy_drop, min_throughput_ratio=min_throughput_ratio,
        max_ttft_p95_factor=max_ttft_p95_factor, comparison_rounds=comparison_rounds, force_build=force_build,
        store=store, mlflow_uri=mlflow_uri, s3_endpoint_url=s3_endpoint_url)
    loaded = _load_specs(paths, options)
    first = next((s for s in loaded.values() if isinstance(s, BuildSpec)), None)
    fleet_run = _start_fleet_run(name, first, [str(p) for p in paths], limits) if first is not None else None
    members: list[FleetMember] = []
    for path_text, spec in loaded.items():
        members.append(_member(path_text, spec, fleet_run, options))
        log(f"fleet {name}: {members[-1].spec}: {members[-1].status}"
            + (f" ({members[-1].reason})" if members[-1].reason else ""))
    summary = FleetSummary(name=name, members=members, pool_limits=limits,
                           mlflow_run_id=fleet_run.run_id if fleet_run else None,
                           duration_s=round(time.monotonic() - t0, 2))
    return _finish(summary, fleet_run)


def _load_specs(paths: list[Path], options: FleetRolloutOptions) -> dict[str, BuildSpec | str]:
    """Path → the spec with its effective destinations, or why not (one bad spec stops no other)."""
    loaded: dict[str, BuildSpec | str] = {}
    for path in paths:
        try:
            loaded[str(path)] = effective_spec(load_spec(path), store=options.store, mlflow_uri=options.mlflow_uri,
                                               s3_endpoint_url=options.s3_endpoint_url)[0]
        except EngineFoundryError as err:
            loaded[str(path)] = str(err)
    return loaded


def _finish(summary: FleetSummary, fleet_run: FleetRun | None) -> FleetSummary | State:
    """The fleet's MLflow run ended with its summary, the summary's artifacts; Failed where any spec did."""
    name = summary.name
    if fleet_run is not None:
        try:
            finish_fleet_run(fleet_run, summary)
        except Exception as err:  # the summary still reaches the UI and the caller; the run ends at exit
            progress_logger("warning")(f"fleet {name}: could not finish MLflow run {fleet_run.run_id} "
                                       f"({type(err).__name__}: {str(err)[:200]})")
    key = artifact_key("fleet", name)
    create_markdown_artifact(key=key, markdown=summary.markdown(), description=summary.headline())
    create_table_artifact(key=f"{key}-table"[:100], table=summary.rows(), description=summary.headline())
    if summary.ok:
        return summary
    not_ok = FleetNotOk(summary)
    progress_logger("error")(str(not_ok))
    return Failed(message=str(not_ok), data=not_ok)


def _start_fleet_run(name: str, first: BuildSpec, paths: list[str], limits: dict[str, int]) -> FleetRun | None:
    """The fleet's MLflow run, in the first spec's tracking server and experiment; a fleet whose first MLflow is
    away still rolls out every spec (each spec's rollout reports its own MLflow problem)."""
    try:
        return start_fleet_run(name, first.tracking.mlflow_uri, first.tracking.experiment, paths, limits)
    except Exception as err:
        progress_logger("warning")(f"fleet {name}: no MLflow fleet run ({type(err).__name__}: {str(err)[:200]})")
        return None


def _member(path: str, spec: BuildSpec | str, fleet_run: FleetRun | None, options: FleetRolloutOptions) -> FleetMember:
    """One spec's rollout as a subflow; whatever it ends in becomes its row, never the fleet's end."""
    if isinstance(spec, str):
        return FleetMember.failure(path, Path(path).stem, spec)
    t0 = time.monotonic()
    state = rollout.with_options(flow_run_name=f"rollout {spec.name}")(
        spec_path=path, mode=options.mode, max_accuracy_drop=options.max_accuracy_drop,
        min_throughput_ratio=options.min_throughput_ratio, max_ttft_p95_factor=options.max_ttft_p95_factor,
        comparison_rounds=options.comparison_rounds, force_build=options.force_build, store=options.store,
        mlflow_uri=options.mlflow_uri, s3_endpoint_url=options.s3_endpoint_url, return_state=True)
    result = state.result(raise_on_failure=False)
    if not isinstance(result, RolloutReport):
        reason = str(result) if isinstance(result, BaseException) else (state.message or state.name)
        return FleetMember.failure(path, spec.name, f"{state.name}: {reason}", round(time.monotonic() - t0, 2))
    if fleet_run is not None and result.build_run_id:
        try:
            link_to_fleet(fleet_run, spec.tracking.mlflow_uri, spec.tracking.experiment, result.build_run_id)
        except Exception as err:  # the spec's MLflow away now: its rollout stands, only the link is missing
            progress_logger("warning")(f"fleet: could not link {spec.name}'s build run {result.build_run_id} to the "
                                       f"fleet run ({type(err).__name__}: {str(err)[:200]})")
    return FleetMember.of_report(path, result, result.build_run_id)
