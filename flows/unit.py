"""One unit that is not published yet: reference → build → serve → smoke → bench → serving files → publish →
track. The smoke stage judges the lane's smoke server; where that is not the server the unit ships with (the
reference lane's scoring server, which returns log-probs), the benchmark starts the shipped one.

`run_unit_stages` is the composition both modes share: embedded mode calls it inside the `unit-in-process`
subflow (`unit_pipeline`) of the parent's process; cluster mode inside the `build-unit` deployment flow on a
worker of the target's pool (flows/build_unit.py). Verdicts, the manifest and the outcome are built in the
domain (enginefoundry/records/outcomes.py).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from prefect import flow
from prefect.artifacts import create_markdown_artifact
from prefect.client.schemas.objects import State
from prefect.states import Failed

from enginefoundry import tracking_tags as mltags
from enginefoundry.bench import SweepReport
from enginefoundry.build.sources import SourceSnapshot
from enginefoundry.build.units import KeyComponents, Unit
from enginefoundry.flows.reports import report_unit_links
from enginefoundry.lanes import get_lane
from enginefoundry.model_server import Endpoint
from enginefoundry.records.lineage import adapter_tags
from enginefoundry.records.outcomes import (
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
from enginefoundry.runner import exit_if_terminating
from enginefoundry.settings import work_root
from enginefoundry.smoke import SmokeReport
from enginefoundry.smoke.gate import LOSSLESS
from enginefoundry.smoke.sibling import SiblingRef, serves_as_sibling
from enginefoundry.spec import BuildSpec
from enginefoundry.store.unit_status import UnitStatus
from enginefoundry.tasks._log import progress_logger
from enginefoundry.tasks.bench import benchmark, twin_benchmark, twin_served_apart
from enginefoundry.tasks.build import build_unit
from enginefoundry.tasks.convert import ConvertedCheckpoint
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
def unit_pipeline(
    spec: BuildSpec, unit: Unit, key_components: KeyComponents, snapshot: SourceSnapshot,
    ckpt: ConvertedCheckpoint, parent_run_id: str, replace: bool = False, sibling: SiblingRef | None = None,
    spec_draft: SourceSnapshot | None = None, spec_adapters: dict[str, SourceSnapshot] | None = None,
) -> UnitOutcome | State:
    """Embedded mode: the unit as a subflow of the parent's process. `replace`: a --force rebuild. `sibling`:
    the unit whose served answers judge this one (run before it). `spec_draft`: the fetched `speculative.draft`. A
    rejected or failed unit ends Failed, with the unit, its status and reason as the message and its outcome as the
    state's data."""
    outcome = run_unit_stages(spec, unit, key_components, snapshot, ckpt, parent_run_id, replace, sibling, spec_draft,
                              spec_adapters)
    return outcome if outcome.ok else unit_failed_state(outcome)


def unit_failed_state(outcome: UnitOutcome) -> State:
    """Failed, with our own error as the data: Prefect's engine logs no traceback for it (tasks/_log.py); the
    reason is logged at ERROR."""
    err = UnitNotPassed(outcome)
    progress_logger("error")(str(err))
    return Failed(message=str(err), data=err)


def run_unit_stages(
    spec: BuildSpec, unit: Unit, key_components: KeyComponents, snapshot: SourceSnapshot,
    ckpt: ConvertedCheckpoint, parent_run_id: str, replace: bool = False, sibling: SiblingRef | None = None,
    spec_draft: SourceSnapshot | None = None, spec_adapters: dict[str, SourceSnapshot] | None = None,
) -> UnitOutcome:
    """`spec_adapters`: the fetched model.adapters of a unit that serves them all (adapter_mode serve): bundled
    with the unit, each asked by its name and gated against its own merged reference (smoke_served_adapters)."""
    key = key_components.key
    replaces = build_now_current(spec, key)  # under this run's lease: what the publish may replace, not adopt
    stages: dict[str, float] = {}
    run_id = start_unit_run(spec, parent_run_id, unit.name, unit_params(spec, unit), build_run_tags(spec, unit, key))
    unit_dir = work_root() / "units" / key[:16]
    shutil.rmtree(unit_dir, ignore_errors=True)  # a clean start: nothing from an earlier run gets published
    report_dir = unit_dir / "reports"
    described = get_lane(spec.lane).describe(spec, unit)
    commands = UnitCommands(convert=stage_commands(ckpt.result.commands, described, "convert"))
    try:
        # The reference first: a refused one (a rejected sibling) costs no build, and a GPU reference needs
        # the unit's GPUs before its server takes them.
        t = time.monotonic()
        reference = smoke_reference(spec, snapshot.local_dir, snapshot.weights_digest, sibling,
                                    precision=unit.variant.precision.value,
                                    checkpoint_dir=ckpt.result.checkpoint_dir)
        stages["reference"] = time.monotonic() - t

        t = time.monotonic()
        build = build_unit(spec, unit, ckpt.result.checkpoint_dir, key,
                           spec_draft.local_dir if spec_draft else None,
                           {n: a.local_dir for n, a in spec_adapters.items()} if spec_adapters else None)
        stages["build"] = time.monotonic() - t
        commands.build = stage_commands(build.commands, described, "build")

        smoke: SmokeReport | None = None
        sweep: SweepReport | None = None
        t = time.monotonic()
        endpoint = start_unit_server(spec, build.bundle_dir, str(report_dir), for_smoke=True)
        stages["serve"] = time.monotonic() - t
        commands.add_server(endpoint.command, endpoint.shipped)
        try:
            t = time.monotonic()
            smoke = smoke_test(spec, endpoint, snapshot.local_dir, str(report_dir),
                               precision=unit.variant.precision.value, weights_digest=snapshot.weights_digest,
                               reference=reference,
                               serves_unit=(unit.name, key) if serves_as_sibling(spec, unit) else None)
            if spec_adapters:
                smoke = smoke_served_adapters(spec, endpoint, snapshot, spec_adapters, smoke, str(report_dir),
                                              precision=unit.variant.precision.value)
            stages["smoke"] = time.monotonic() - t
            # A twin served apart judges the lossless rule after the benchmark (one server at a time): not yet failed.
            passed = smoke.passed or (twin_served_apart(spec) and [r.name for r in smoke.verdict.failed] == [LOSSLESS])
            if spec.benchmark.enabled and not passed and not spec.benchmark.on_rejected:
                progress_logger("warning")(f"bench: {unit.name} not benchmarked: its smoke gate rejected it "
                                           "(benchmark.on_rejected: true benchmarks it anyway)")
            elif spec.benchmark.enabled:
                endpoint = shipped_server(spec, endpoint, build.bundle_dir, str(report_dir), stages, commands)
                t = time.monotonic()
                sweep = benchmark(spec, endpoint, str(report_dir / "bench"), f"{spec.model.name} {unit.name}",
                                  unit=unit)
                stages["bench"] = time.monotonic() - t
                commands.bench = [p.command for p in sweep.points]
        finally:
            stop_unit_server(endpoint)
        if smoke is not None and twin_served_apart(spec):
            smoke, sweep = serve_twin(spec, unit, build.bundle_dir, report_dir, smoke, sweep, stages, commands)
    except Exception as err:
        exit_if_terminating()  # a cancel that surfaced as a stage error (its server stopped) is a cancel
        record_unit(spec, run_id, ok=False, tags={mltags.STATUS: UnitStatus.FAILED, mltags.COMMANDS: commands.tag()},
                    metrics={f"{k}_s": v for k, v in stages.items()}, sweep=None,
                    artifacts=[write_commands(unit_dir, commands)])
        failed = failed_outcome(unit, key, err, run_id, stages)
        emit_unit_outcome(spec.model.name, unit.name, unit.target.name, key, "failed", reason=failed.reason,
                          mlflow_run_id=run_id)
        return failed
    exit_if_terminating()  # cancelled during a stage whose outcome looked like a verdict (a dead server)

    # Everything the build consumed besides its named sources, by digest: signed with the manifest (DESIGN §10).
    inputs = [*([ckpt.input] if ckpt.input else []), *reference[1].inputs, *(smoke.inputs if smoke else [])]
    draft = unit_manifest(spec, unit, key, key_components.as_json(), snapshot, checkpoint_key=ckpt.key,
                          checkpoint_uri=ckpt.uri, device=build.device, build_params=build.params, smoke=smoke,
                          sweep=sweep, mlflow_run_id=run_id,
                          prefect_flow_run_id=prefect_context().get(mltags.PREFECT_FLOW_RUN_ID),
                          inputs=[i for n, i in enumerate(inputs) if i not in inputs[:n]])
    folders = {"bundle": build.bundle_dir, "reports": str(report_dir)}
    serving_dir = unit_dir / "serving"
    shutil.rmtree(serving_dir, ignore_errors=True)
    if draft.status == UnitStatus.CANDIDATE:  # a rejected unit gets nothing a serving team could deploy by mistake
        folders["serving"] = write_serving(spec, unit.name, key, build.bundle_dir, ckpt.result.checkpoint_dir,
                                           ckpt.uri, str(serving_dir))
    t = time.monotonic()
    published = publish_unit(spec, draft, folders, replace, replaces)
    stages["publish"] = time.monotonic() - t

    t = time.monotonic()
    manifest_copy = unit_dir / "manifest.json"
    manifest_copy.write_bytes(published.manifest.to_json())
    artifacts = [str(manifest_copy), write_commands(unit_dir, commands)] + [
        str(p) for p in report_dir.rglob("*")
        if p.suffix in (".json", ".md", ".png") and "phases" not in p.parts and p.name != "inputs.json"
    ]
    record_unit(spec, run_id, ok=draft.status == UnitStatus.CANDIDATE,
                tags={mltags.STATUS: draft.status, mltags.MANIFEST_URI: published.uri, mltags.COMMANDS: commands.tag(),
                      mltags.MANIFEST_SHA256: published.manifest_sha256,
                      mltags.GPU: build.device.get("gpu_name", build.device.get("cpu", "")),
                      **adapter_tags(draft.source), **(smoke.tags() if smoke else {})},
                metrics=unit_metrics(stages, build.metrics, published.bytes_total, smoke, sweep),
                sweep=sweep, artifacts=artifacts)
    register_published_unit(spec, unit, published.manifest, published.uri, run_id, published.manifest_sha256)
    stages["track"] = time.monotonic() - t
    report_unit_links(unit.name, key, mlflow_run_link(spec, run_id), published.uri)
    emit_unit_outcome(spec.model.name, unit.name, unit.target.name, key, draft.status, reason=draft.status_reason,
                      manifest_uri=published.uri, mlflow_run_id=run_id)
    if smoke:
        create_markdown_artifact(key=f"smoke-{key[:12]}", markdown=smoke.markdown(),
                                 description=f"smoke gate of {unit.name}")
    return built_outcome(unit, published.manifest, published.uri, run_id, stages)


def shipped_server(spec: BuildSpec, endpoint: Endpoint, bundle_dir: str, report_dir: str,
                   stages: dict[str, float], commands: UnitCommands) -> Endpoint:
    """The server the benchmark measures: the smoke stage's where it is the one the unit ships with, else that one
    stopped and the shipped one started (the reference lane's scoring server returns log-probs but does not
    stream)."""
    if endpoint.shipped:
        return endpoint
    stop_unit_server(endpoint)
    t = time.monotonic()
    shipped = start_unit_server(spec, bundle_dir, report_dir)
    stages["serve"] += time.monotonic() - t
    commands.add_server(shipped.command, shipped.shipped)
    return shipped


def serve_twin(spec: BuildSpec, unit: Unit, bundle_dir: str, report_dir: Path, smoke: SmokeReport,
               sweep: SweepReport | None, stages: dict[str, float],
               commands: UnitCommands) -> tuple[SmokeReport, SweepReport | None]:
    """A speculative unit whose lane serves its non-speculative twin apart (lane trtllm: the same checkpoint, the
    YAML less speculative_config): the twin started once the unit's own server is stopped (one GPU's memory, never
    both), asked the smoke prompts (the rule `lossless speculation`) and, where the unit was benchmarked, the same
    points (the speed-up); stopped."""
    t = time.monotonic()
    twin = start_unit_server(spec, bundle_dir, str(report_dir), twin=True)
    stages["serve"] = stages.get("serve", 0.0) + time.monotonic() - t
    commands.add_server(twin.command, False)
    try:
        t = time.monotonic()
        smoke = smoke_twin(spec, twin, smoke, str(report_dir))
        stages["smoke"] = stages.get("smoke", 0.0) + time.monotonic() - t
        if sweep is not None:
            t = time.monotonic()
            sweep = twin_benchmark(spec, twin, sweep, str(report_dir / "bench"), unit=unit)
            stages["bench"] = stages.get("bench", 0.0) + time.monotonic() - t
    finally:
        stop_unit_server(twin)
    return smoke, sweep


def write_commands(unit_dir: Path, commands: UnitCommands) -> str:
    """`commands.json` beside the unit's reports, for its MLflow run."""
    path = unit_dir / "commands.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(commands.model_dump_json(indent=2))
    return str(path)
