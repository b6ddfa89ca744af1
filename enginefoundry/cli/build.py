"""Commands over a build spec: run, validate, plan, explain, rollout."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from enginefoundry.cli.common import (
    destination_flags,
    emit_json,
    load,
    load_searched,
    quiet_prefect_defaults,
    start_prefect_early,
    wants_json,
)
from enginefoundry.cli.signing import export_trust, signing_line, trust_options
from enginefoundry.console import console, error, say, table
from enginefoundry.errors import EXIT_INPUT, EXIT_OK, EXIT_PIPELINE
from enginefoundry.spec import load_spec

if TYPE_CHECKING:
    from enginefoundry.records.run_summary import RunSummary
    from enginefoundry.settings import Destinations
    from enginefoundry.spec import BuildSpec


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser("run", help="run the pipeline for a spec (embedded mode: in this process)")
    run.add_argument("spec", help="build spec YAML, e.g. configs/tiny-cpu.yaml")
    run.add_argument("--targets", nargs="+", metavar="NAME", help="only these targets")
    run.add_argument("--force", action="store_true", help="rebuild units whose manifest already exists")
    run.add_argument("--verify-hits", action="store_true",
                     help="re-hash every file of a cache hit (default: manifest consistency and file sizes)")
    destination_flags(run)
    run.add_argument("--mode", choices=("embedded", "cluster"), default="embedded",
                     help="cluster: each unit on its target's Prefect work pool (needs PREFECT_API_URL)")
    run.add_argument("--wait-for-tracking", action="store_true",
                     help="when every unit is a cache hit, record the hits in MLflow before exiting "
                          "(default: a background process records them)")
    run.set_defaults(handler=cmd_run)

    val = sub.add_parser("validate", help="check a spec, its inputs and every unit's preflight; nothing runs or "
                                          "downloads; prints the effective store, MLflow URI and S3 endpoint")
    val.add_argument("spec")
    val.add_argument("--targets", nargs="+", metavar="NAME", help="only these targets")
    destination_flags(val)
    val.set_defaults(handler=cmd_validate)

    plan = sub.add_parser("plan", help="print the unit matrix, commands and preflight verdicts; nothing runs")
    plan.add_argument("spec")
    plan.add_argument("--targets", nargs="+", metavar="NAME")
    plan.set_defaults(handler=cmd_plan)

    exp = sub.add_parser("explain", help="for each unit: cache hit or miss, and for a miss what changed")
    exp.add_argument("spec")
    exp.add_argument("--targets", nargs="+", metavar="NAME")
    destination_flags(exp, mlflow=False)
    exp.set_defaults(handler=cmd_explain)

    roll = sub.add_parser("rollout", help="build when the source has something new, then promote or hold")
    roll.add_argument("spec")
    roll.add_argument("--targets", nargs="+", metavar="NAME", help="only these targets")
    destination_flags(roll)
    roll.add_argument("--mode", choices=("embedded", "cluster"), default="embedded",
                      help="cluster: each unit on its target's Prefect work pool (needs PREFECT_API_URL)")
    roll.add_argument("--max-accuracy-drop", type=float, default=0.02)
    roll.add_argument("--min-throughput-ratio", type=float, default=0.9)
    roll.add_argument("--max-ttft-p95-factor", type=float, default=1.25)
    roll.add_argument("--reference-concurrency", type=int)
    roll.add_argument("--max-cost-increase", type=float, metavar="FRACTION",
                      help="hold a candidate whose $/1M output tokens at the SLO exceeds the champion's by more "
                           "than this (0.1 = 10%%; searched units, docs/search.md)")
    roll.add_argument("--comparison-rounds", type=int, default=3, metavar="N",
                      help="side-by-side rounds of champion and candidate where this machine serves both (cpu "
                           "targets); thresholds apply to the ratio's 95%% interval (default 3)")
    roll.add_argument("--promote-neutral-rebuilds", action="store_true",
                      help="promote a rebuild of the champion's weights (toolchain bump) when it is not worse "
                           "(default: only for a gain beyond noise)")
    roll.add_argument("--force-build", action="store_true", help="build even when nothing is new")
    trust_options(roll)
    roll.set_defaults(handler=cmd_rollout)


def cmd_run(args: argparse.Namespace) -> int:
    """refuse early → an all-hits run ends before Prefect → else the build-engines flow → the summary."""
    spec, dest = load(args.spec, args)
    _refuse_before_work(spec, dest, args)
    summary, tracking_note = (None, "") if args.force else _all_hits(spec, args)
    if summary is None:
        summary = _run_flow(spec, args)
    if wants_json(args):
        emit_json({"ok": summary.ok, "destinations": dest, **summary.model_dump(mode="json")})
        return EXIT_OK if summary.ok else EXIT_PIPELINE
    _print_summary(spec, summary, tracking_note)
    return EXIT_OK if summary.ok else EXIT_PIPELINE


def _refuse_before_work(spec: BuildSpec, dest: Destinations, args: argparse.Namespace) -> None:
    """Every input problem before Prefect, downloads or servers start; prints the source and destinations."""
    from enginefoundry.planning.validate import validate_deep

    validate_deep(spec)  # every input problem before Prefect, downloads or servers start
    from enginefoundry.inputs.sources import probe
    from enginefoundry.planning.plan_report import refuse_on_preflight

    refuse_on_preflight(spec, args.targets)
    if spec.search is None:  # a searched spec's units are known once the flow decided them: it checks there
        from enginefoundry.records.alias_lineage import refuse_alias_collisions

        refuse_alias_collisions(spec, args.targets)

    resolved = probe(spec.model.parsed_source(spec.base_path))
    console.print(f"source {spec.model.source} → {resolved}", markup=False)
    for row in dest.rows():
        console.print(f"{row['setting']}: {row['value']} (from {row['from']})", markup=False)
    console.print(signing_line(spec), markup=False)  # a bad key fails here, before any download


def _all_hits(spec: BuildSpec, args: argparse.Namespace) -> tuple[RunSummary | None, str]:
    """Hits are decided before Prefect, model tooling or a server start: an all-hits run ends here (its summary,
    and a note where a background process records the hits); (None, "") where some unit must be built."""
    from enginefoundry.planning import noop_run

    hits = noop_run.decide_all_hits(spec, args.targets, progress=say, rehash=args.verify_hits)
    if hits is None:
        return None, ""
    if args.wait_for_tracking:
        return noop_run.record_all_hits(spec, hits), ""
    pid, log = noop_run.record_in_background(spec, hits)
    return noop_run.summary_of(spec, hits), (
        f"MLflow: {len(hits.units)} cache hit(s) being recorded in {spec.tracking.mlflow_uri} by a background "
        f"process (pid {pid}, log {log})")


def _run_flow(spec: BuildSpec, args: argparse.Namespace) -> RunSummary:
    """The build-engines flow in this process, on a Prefect server started early."""
    from enginefoundry.planning.noop_run import flush_in_background

    flush_in_background(spec)  # hits an earlier recorder could not record, in this run's destinations
    server = start_prefect_early()
    from enginefoundry.flows.build_engines import build_engines, flow_value, spec_payload
    from enginefoundry.records.run_records import prepare_tracking

    prepare_tracking(spec)  # a new SQLite MLflow file is created while the Prefect server starts
    if server is not None:
        server.adopt(float(os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"]))

    # The effective destinations travel as the flow's override parameters: they outrank the environment the
    # flow reads again (the same one here, a worker's in cluster mode).
    from enginefoundry.records.run_summary import UnitsNotPassed

    try:
        # The spec as written: the flow resolves the destinations again and, where a parameter only repeats
        # the environment or the spec, logs where the value really came from (settings.true_origins).
        return flow_value(build_engines(spec_path=None, spec=spec_payload(load_spec(args.spec)),
                                        targets=args.targets, force=args.force,
                                        mode=args.mode, validated=True, verify_hits=args.verify_hits,
                                        store=spec.publish.store, mlflow_uri=spec.tracking.mlflow_uri,
                                        s3_endpoint_url=spec.publish.s3_endpoint_url))
    except UnitsNotPassed as err:  # the run ended Failed; its summary is printed as any other (exit 1)
        return err.summary


def _print_summary(spec: BuildSpec, summary: RunSummary, tracking_note: str) -> None:
    console.print()
    table(f"{summary.spec}: {summary.source_uri}"
          + (f" @ {summary.source_revision[:12]}" if summary.source_revision else ""), summary.rows())
    if any(o.bench.slo for o in summary.outcomes):
        from enginefoundry.records.run_summary import best_profiles

        table("best profile per target (within the benchmark SLOs)", best_profiles(summary.outcomes))
    if any(o.bench.search is not None for o in summary.outcomes):
        from enginefoundry.records.run_summary import search_rows

        objective = spec.search.objective.value if spec.search else "tokens_per_gpu"
        table("searched units: goodput at the SLO, predicted vs measured, cost and energy",
              search_rows(summary.outcomes, objective))
    for o in summary.outcomes:
        if o.manifest_uri:
            console.print(f"  {o.unit}: {o.manifest_uri}", markup=False)
    console.print(tracking_note or f"MLflow parent run {summary.parent_run_id} in {spec.tracking.mlflow_uri}",
                  markup=False)


def cmd_validate(args: argparse.Namespace) -> int:
    from enginefoundry.inputs.units import expand_units
    from enginefoundry.planning.preflight import reference_summary
    from enginefoundry.planning.validate import validate_file
    from enginefoundry.rollout.toolchain_channel import channel_status
    from enginefoundry.settings import effective_spec
    from enginefoundry.smoke.prompts import load_prompt_set, prompt_set_warnings

    spec, dest = effective_spec(validate_file(args.spec, args.targets), store=args.store,
                                mlflow_uri=args.mlflow_uri, s3_endpoint_url=args.s3_endpoint_url)
    if spec.search is not None:
        from enginefoundry.search.plan import materialise

        spec, _ = materialise(spec, args.targets, progress=say)
    from enginefoundry.records.alias_lineage import refuse_alias_collisions

    refuse_alias_collisions(spec, args.targets)  # another spec's unit lineage holds an alias stem of this one
    expanded = expand_units(spec, args.targets)
    units = len(expanded)
    references = {u.name: reference_summary(spec, u) for u in expanded}
    warnings = prompt_set_warnings(load_prompt_set(spec.resolve_path(spec.smoke.prompts)))
    channel = channel_status(spec)
    bad_channel = channel is not None and channel.value is None and not channel.transient
    if wants_json(args):
        emit_json({"ok": not bad_channel, "spec": args.spec, "lane": spec.lane, "units": units, "destinations": dest,
                   "references": references, "warnings": warnings,
                   "toolchain_channel": channel.model_dump(mode="json") if channel else None})
        return EXIT_INPUT if bad_channel else EXIT_OK
    if bad_channel and channel is not None:
        error(channel.line())
        return EXIT_INPUT
    console.print(f"[green]ok[/green]: {args.spec} is valid: lane {spec.lane}, {units} unit(s), preflight passed")
    by_reference: dict[str, list[str]] = {}
    for name, reference in references.items():
        by_reference.setdefault(reference, []).append(name)
    for reference, names in by_reference.items():
        console.print(f"  judged against {reference}: {', '.join(names)}", markup=False, highlight=False)
    for warning in warnings:
        console.print(f"  warning: {warning}", markup=False, highlight=False)
    if channel is not None:
        console.print(f"  {channel.line()}", markup=False, highlight=False)
    table("effective settings (flag > environment > spec > default)", dest.rows())
    return EXIT_OK


def cmd_plan(args: argparse.Namespace) -> int:
    from enginefoundry.planning.plan_report import plan_report
    from enginefoundry.rollout.toolchain_channel import channel_status

    spec, _, searched = load_searched(args.spec, args)
    report = plan_report(spec, args.targets)
    channel = channel_status(spec)  # shown, never fatal here: `rollout` reads it again and refuses a bad one
    if wants_json(args):
        emit_json({"ok": not report.refused, "spec": spec.name, "lane": spec.lane, "units": report.rows,
                   "commands": report.commands, "preflight": report.preflight,
                   "search": searched.model_dump(mode="json") if searched else None,
                   "workload": spec.search.workload.model_dump(mode="json") if spec.search else None,
                   "toolchain_channel": channel.model_dump(mode="json") if channel else None})
        return EXIT_INPUT if report.refused else EXIT_OK
    if searched is not None:
        from enginefoundry.search.plan import disagg_lines, rows

        table(f"{spec.name}: search (predicted, ranked by {searched.objective.value}; 'unit' = became a unit)",
              rows(searched))
        if spec.search is not None:
            w = spec.search.workload
            console.print(f"  workload: ISL {w.isl}±{w.isl_stddev} from {w.source()}, OSL {w.osl}±{w.osl_stddev}",
                          markup=False)
        for ts in searched.targets:
            console.print(f"  {ts.target}: " + (f"{ts.predictor}; {ts.note}" if ts.covered else
                                                 f"not predicted ({ts.reason}): measured search"), markup=False)
        for line in disagg_lines(searched):
            console.print(f"  {line}", markup=False)
    table(f"{spec.name}: {len(report.rows)} unit(s), lane {spec.lane}", report.rows)
    if channel is not None:
        console.print(f"{channel.line()} (`rollout` builds with the channel's value)", markup=False,
                      highlight=False)
    for unit_name, commands in report.commands.items():
        console.print(f"\n[bold]{unit_name}[/bold]")
        for line in commands:
            console.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)
    if report.refused:
        error(f"{report.refused} unit(s) refused by preflight; fix the spec as the verdicts say")
        return EXIT_INPUT
    return EXIT_OK


def cmd_explain(args: argparse.Namespace) -> int:
    from enginefoundry.inputs.adapters import fetch_adapters
    from enginefoundry.inputs.quantized_source import refuse_contradiction
    from enginefoundry.inputs.sources import fetch
    from enginefoundry.lanes import get_lane
    from enginefoundry.lanes.speculation import fetch_speculative_draft
    from enginefoundry.planning.explain import explain
    from enginefoundry.store.backends import open_store

    spec, _ = load(args.spec, args)
    snapshot = fetch(spec.model.parsed_source(spec.base_path), progress=say,
                     check=lambda quant: refuse_contradiction(spec, quant))
    draft = fetch_speculative_draft(spec, snapshot, say)
    lane = get_lane(spec.lane)
    adapters = fetch_adapters(spec, snapshot, lane.name, lane.max_lora_rank, say)
    rows = explain(spec, snapshot, open_store(spec.publish.store, spec.publish.s3_endpoint_url), args.targets,
                   draft, adapters)
    if wants_json(args):
        emit_json({"spec": spec.name, "store": spec.publish.store, "units": rows})
        return EXIT_OK
    table(f"{spec.name}: cache against {spec.publish.store}", [
        {"unit": r.unit, "status": "hit" if r.hit else "miss", "key": r.key[:12],
         "nearest published": (r.nearest or "-")[:12],
         "judged against": r.reference or "-",
         "what differs": "\n".join([*([r.refused] if r.refused else []), *r.differences])} for r in rows])
    return EXIT_OK


def cmd_rollout(args: argparse.Namespace) -> int:
    from enginefoundry.planning.validate import validate_deep

    spec, _ = load(args.spec, args)
    validate_deep(spec)
    quiet_prefect_defaults()
    export_trust(args)  # the promotion step reads the trust policy from the environment
    from enginefoundry.flows.build_engines import flow_value, spec_payload
    from enginefoundry.flows.rollout import rollout

    report = flow_value(rollout(
        spec_path=None, spec=spec_payload(load_spec(args.spec)), targets=args.targets, mode=args.mode,
        max_accuracy_drop=args.max_accuracy_drop, min_throughput_ratio=args.min_throughput_ratio,
        max_ttft_p95_factor=args.max_ttft_p95_factor, reference_concurrency=args.reference_concurrency,
        max_cost_increase=args.max_cost_increase, comparison_rounds=args.comparison_rounds,
        promote_neutral_rebuilds=args.promote_neutral_rebuilds, force_build=args.force_build, store=spec.publish.store,
        mlflow_uri=spec.tracking.mlflow_uri, s3_endpoint_url=spec.publish.s3_endpoint_url))
    if wants_json(args):
        emit_json(report)
        return EXIT_OK if (not report.built or report.build_ok) else EXIT_PIPELINE
    console.print()
    table(f"{spec.name}: {report.change.describe()}", report.change.rows())
    if not report.built:
        what = "nothing new" if not report.promoted else "source unchanged"
        console.print(f"{what}: no build ({report.duration_s:.1f} s)")
    if report.decisions:
        table(f"{spec.name}: promote or hold", [d.row() for d in report.decisions])
    if report.comparison:
        table(f"{spec.name}: old vs new per rebuilt target", [r.row() for r in report.comparison])
    return EXIT_OK if (not report.built or report.build_ok) else EXIT_PIPELINE
