"""One unit that is not published yet: reference → build → serve → smoke → bench → serving files → publish →
track. The smoke stage judges the lane's smoke server; where that is not the server the unit ships with (the
reference lane's scoring server, which returns log-probs), the benchmark starts the shipped one.

`run_unit_stages` is the composition both modes share: embedded mode calls it inside the `unit-in-process`
subflow (`unit_pipeline`) of the parent's process; cluster mode inside the `build-unit` deployment flow on a
worker of the target's pool (flows/build_unit.py). Verdicts, the manifest and the outcome are built in the
domain (enginefoundry/records/outcomes.py).
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact
from prefect.client.schemas.objects import State
from prefect.states import Failed

from enginefoundry import tracking_tags as mltags
from enginefoundry.bench import SweepReport
from enginefoundry.flows.reports import report_unit_links
from enginefoundry.inputs.units import Unit
from enginefoundry.lanes import get_lane
from enginefoundry.model_server import Endpoint
from enginefoundry.records.lineage import adapter_tags
from enginefoundry.records.outcomes import (
    BuiltUnit,
    UnitCommands,
    build_run_tags,
    built_outcome,
    failed_outcome,
    stage_commands,
    unit_manifest,
    unit_metrics,
    unit_params,
)
from enginefoundry.records.run_records import mlflow_run_link
from enginefoundry.records.run_summary import UnitNotPassed, UnitOutcome
from enginefoundry.records.unit_run import Staged, UnitRun, UnitWork
from enginefoundry.runner import exit_if_terminating
from enginefoundry.smoke import SmokeReport
from enginefoundry.smoke.gate import LOSSLESS
from enginefoundry.smoke.sibling import serves_as_sibling
from enginefoundry.spec import BuildSpec
from enginefoundry.store.manifest import Manifest
from enginefoundry.store.unit_status import UnitStatus
from enginefoundry.tasks._log import progress_logger
from enginefoundry.tasks.bench import benchmark, twin_benchmark, twin_served_apart
from enginefoundry.tasks.build import build_bundle
from enginefoundry.tasks.events import emit_unit_outcome
from enginefoundry.tasks.publish import build_now_current, publish_unit
from enginefoundry.tasks.serve import start_unit_server, stop_unit_server
from enginefoundry.tasks.serve_files import write_serving
from enginefoundry.tasks.smoke import smoke_reference, smoke_served_adapters, smoke_test, smoke_twin
from enginefoundry.tasks.track import (
    prefect_context,
    record_unit,
    register_published_unit,
    start_unit_run,
)


@flow(name="unit-in-process")
def unit_pipeline(work: UnitWork) -> UnitOutcome | State:
    """Embedded mode: the unit as a subflow of the parent's process. A rejected or failed unit ends Failed, with
    the unit, its status and reason as the message and its outcome as the state's data."""
    outcome = run_unit_stages(work)
    return outcome if outcome.ok else unit_failed_state(outcome)


def unit_failed_state(outcome: UnitOutcome) -> State:
    """Failed, with our own error as the data: Prefect's engine logs no traceback for it (tasks/_log.py); the
    reason is logged at ERROR."""
    err = UnitNotPassed(outcome)
    progress_logger("error")(str(err))
    return Failed(message=str(err), data=err)


def run_unit_stages(work: UnitWork) -> UnitOutcome:
    """reference → build → serve → smoke → bench, then the publish and the records; a stage that raises ends the
    unit failed (recorded, its commands kept), a cancel ends the process."""
    spec, unit = work.spec, work.unit
    replaces = build_now_current(spec, work.key)  # under this run's lease: what the publish may replace, not adopt
    run_id = start_unit_run(spec, work.parent_run_id, unit.name, unit_params(spec, unit),
                            build_run_tags(spec, unit, work.key))
    described = get_lane(spec.lane).describe(spec, unit)
    run = UnitRun.start(work.key, run_id,
                        UnitCommands(convert=stage_commands(work.ckpt.result.commands, described, "convert")))
    try:
        staged = judge_unit(work, run, described)
    except Exception as err:
        exit_if_terminating()  # a cancel that surfaced as a stage error (its server stopped) is a cancel
        return record_failure(work, run, err)
    exit_if_terminating()  # cancelled during a stage whose outcome looked like a verdict (a dead server)
    return publish_and_record(work, run, staged, replaces)


def judge_unit(work: UnitWork, run: UnitRun, described: list[Any]) -> Staged:
    """The reference, the build, the smoke gate on the lane's smoke server, the benchmark, the twin."""
    spec, unit = work.spec, work.unit
    # The reference first: a refused one (a rejected sibling) costs no build, and a GPU reference needs
    # the unit's GPUs before its server takes them.
    with run.timed("reference"):
        reference = smoke_reference(spec, work.snapshot.local_dir, work.snapshot.weights_digest, work.sibling,
                                    precision=work.precision, checkpoint_dir=work.ckpt.result.checkpoint_dir)
    with run.timed("build"):
        build = build_bundle(spec, unit, work.ckpt.result.checkpoint_dir, work.key,
                           work.spec_draft.local_dir if work.spec_draft else None,
                           {n: a.local_dir for n, a in work.spec_adapters.items()} if work.spec_adapters else None)
    run.commands.build = stage_commands(build.commands, described, "build")
    smoke: SmokeReport | None = None
    sweep: SweepReport | None = None
    with run.timed("serve"):
        endpoint = start_unit_server(spec, build.bundle_dir, str(run.report_dir), for_smoke=True)
    run.commands.add_server(endpoint.command, endpoint.shipped)
    try:
        with run.timed("smoke"):
            smoke = smoke_test(spec, endpoint, work.snapshot.local_dir, str(run.report_dir),
                               precision=work.precision, weights_digest=work.snapshot.weights_digest,
                               reference=reference,
                               serves_unit=(unit.name, work.key) if serves_as_sibling(spec, unit) else None)
            if work.spec_adapters:
                smoke = smoke_served_adapters(spec, endpoint, work.snapshot, work.spec_adapters, smoke,
                                              str(run.report_dir), precision=work.precision)
        endpoint, sweep = bench_unit(work, run, endpoint, build.bundle_dir, smoke)
    finally:
        stop_unit_server(endpoint)
    if smoke is not None and twin_served_apart(spec):
        smoke, sweep = serve_twin(spec, unit, build.bundle_dir, run, smoke, sweep)
    return Staged(reference=reference, build=build, smoke=smoke, sweep=sweep)


def bench_unit(work: UnitWork, run: UnitRun, endpoint: Endpoint, bundle_dir: str,
               smoke: SmokeReport) -> tuple[Endpoint, SweepReport | None]:
    """The benchmark on the shipped server where the spec asks for one and the gate did not reject the unit (or
    benchmark.on_rejected); the endpoint now serving, to be stopped."""
    spec, unit = work.spec, work.unit
    # A twin served apart judges the lossless rule after the benchmark (one server at a time): not yet failed.
    passed = smoke.passed or (twin_served_apart(spec) and [r.name for r in smoke.verdict.failed] == [LOSSLESS])
    if not spec.benchmark.enabled:
        return endpoint, None
    if not passed and not spec.benchmark.on_rejected:
        progress_logger("warning")(f"bench: {unit.name} not benchmarked: its smoke gate rejected it "
                                   "(benchmark.on_rejected: true benchmarks it anyway)")
        return endpoint, None
    endpoint = shipped_server(spec, endpoint, bundle_dir, str(run.report_dir), run)
    with run.timed("bench"):
        sweep = benchmark(spec, endpoint, str(run.report_dir / "bench"), f"{spec.model.name} {unit.name}", unit=unit)
    run.commands.bench = [p.command for p in sweep.points]
    return endpoint, sweep


def record_failure(work: UnitWork, run: UnitRun, err: Exception) -> UnitOutcome:
    """A unit a stage failed: its MLflow run (the stages' times, its commands), its event, its outcome."""
    spec, unit = work.spec, work.unit
    record_unit(spec, run.run_id, ok=False,
                tags={mltags.STATUS: UnitStatus.FAILED, mltags.COMMANDS: run.commands.tag()},
                metrics=run.stage_metrics(), sweep=None, artifacts=[run.write_commands()])
    failed = failed_outcome(unit, work.key, err, run.run_id, run.stages)
    emit_unit_outcome(spec.model.name, unit.name, unit.target.name, work.key, "failed", reason=failed.reason,
                      mlflow_run_id=run.run_id)
    return failed


def draft_manifest(work: UnitWork, run: UnitRun, staged: Staged) -> Manifest:
    """The unit's manifest before the publish: everything the build consumed besides its named sources, by
    digest, signed with it (DESIGN §10)."""
    ckpt, smoke = work.ckpt, staged.smoke
    inputs = [*([ckpt.input] if ckpt.input else []), *staged.reference[1].inputs, *(smoke.inputs if smoke else [])]
    built = BuiltUnit(checkpoint_key=ckpt.key, checkpoint_uri=ckpt.uri, device=staged.build.device,
                      build_params=staged.build.params, smoke=smoke, sweep=staged.sweep,
                      inputs=[i for n, i in enumerate(inputs) if i not in inputs[:n]])
    return unit_manifest(work.spec, work.unit, work.key_components, work.snapshot, built, mlflow_run_id=run.run_id,
                         prefect_flow_run_id=prefect_context().get(mltags.PREFECT_FLOW_RUN_ID))


def publish_and_record(work: UnitWork, run: UnitRun, staged: Staged, replaces: str) -> UnitOutcome:
    """The serving files (a candidate only), the publish, the unit's MLflow run and registration, its event."""
    spec, unit, key, build, smoke = work.spec, work.unit, work.key, staged.build, staged.smoke
    draft = draft_manifest(work, run, staged)
    folders = {"bundle": build.bundle_dir, "reports": str(run.report_dir)}
    serving_dir = run.serving_dir()
    if draft.status == UnitStatus.CANDIDATE:  # a rejected unit gets nothing a serving team could deploy by mistake
        folders["serving"] = write_serving(spec, unit.name, key, build.bundle_dir, work.ckpt.result.checkpoint_dir,
                                           work.ckpt.uri, str(serving_dir))
    with run.timed("publish"):
        published = publish_unit(spec, draft, folders, work.replace, replaces)
    with run.timed("track"):
        record_unit(spec, run.run_id, ok=draft.status == UnitStatus.CANDIDATE,
                    tags={mltags.STATUS: draft.status, mltags.MANIFEST_URI: published.uri,
                          mltags.COMMANDS: run.commands.tag(), mltags.MANIFEST_SHA256: published.manifest_sha256,
                          mltags.GPU: build.device.get("gpu_name", build.device.get("cpu", "")),
                          **adapter_tags(draft.source), **(smoke.tags() if smoke else {})},
                    metrics=unit_metrics(run.stages, build.metrics, published.bytes_total, smoke, staged.sweep),
                    sweep=staged.sweep, artifacts=run.artifacts(published.manifest.to_json()))
        register_published_unit(spec, unit, published.manifest, published.uri, run.run_id, published.manifest_sha256)
    report_unit_links(unit.name, key, mlflow_run_link(spec, run.run_id), published.uri)
    emit_unit_outcome(spec.model.name, unit.name, unit.target.name, key, draft.status, reason=draft.status_reason,
                      manifest_uri=published.uri, mlflow_run_id=run.run_id)
    if smoke:
        create_markdown_artifact(key=f"smoke-{key[:12]}", markdown=smoke.markdown(),
                                 description=f"smoke gate of {unit.name}")
    return built_outcome(unit, published.manifest, published.uri, run.run_id, run.stages)


def shipped_server(spec: BuildSpec, endpoint: Endpoint, bundle_dir: str, report_dir: str, run: UnitRun) -> Endpoint:
    """The server the benchmark measures: the smoke stage's where it is the one the unit ships with, else that one
    stopped and the shipped one started (the reference lane's scoring server returns log-probs but does not
    stream)."""
    if endpoint.shipped:
        return endpoint
    stop_unit_server(endpoint)
    with run.timed("serve"):
        shipped = start_unit_server(spec, bundle_dir, report_dir)
    run.commands.add_server(shipped.command, shipped.shipped)
    return shipped


def serve_twin(spec: BuildSpec, unit: Unit, bundle_dir: str, run: UnitRun, smoke: SmokeReport,
               sweep: SweepReport | None) -> tuple[SmokeReport, SweepReport | None]:
    """A speculative unit whose lane serves its non-speculative twin apart (lane trtllm: the same checkpoint, the
    YAML less speculative_config): the twin started once the unit's own server is stopped (one GPU's memory, never
    both), asked the smoke prompts (the rule `lossless speculation`) and, where the unit was benchmarked, the same
    points (the speed-up); stopped."""
    with run.timed("serve"):
        twin = start_unit_server(spec, bundle_dir, str(run.report_dir), twin=True)
    run.commands.add_server(twin.command, False)
    try:
        with run.timed("smoke"):
            smoke = smoke_twin(spec, twin, smoke, str(run.report_dir))
        if sweep is not None:
            with run.timed("bench"):
                sweep = twin_benchmark(spec, twin, sweep, str(run.report_dir / "bench"), unit=unit)
    finally:
        stop_unit_server(twin)
    return smoke, sweep
