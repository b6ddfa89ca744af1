"""Commands over a build spec: run, validate, plan, explain, rollout."""

from __future__ import annotations

import argparse

from enginefoundry.cli.common import load, quiet_prefect_defaults
from enginefoundry.console import console, error, table
from enginefoundry.errors import EXIT_INPUT, EXIT_OK, EXIT_PIPELINE


def register(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="run the pipeline for a spec (embedded mode: in this process)")
    run.add_argument("spec", help="build spec YAML, e.g. configs/tiny-cpu.yaml")
    run.add_argument("--targets", nargs="+", metavar="NAME", help="only these targets")
    run.add_argument("--force", action="store_true", help="rebuild units whose manifest already exists")
    run.add_argument("--verify-hits", action="store_true",
                     help="re-hash every file of a cache hit (default: manifest consistency and file sizes)")
    run.add_argument("--store", help="override publish.store (s3://bucket/prefix or file://path)")
    run.add_argument("--mlflow-uri", help="override tracking.mlflow_uri")
    run.add_argument("--mode", choices=("embedded", "cluster"), default="embedded",
                     help="cluster: each unit on its target's Prefect work pool (needs PREFECT_API_URL)")
    run.add_argument("--wait-for-tracking", action="store_true",
                     help="when every unit is a cache hit, record the hits in MLflow before exiting "
                          "(default: a background process records them)")
    run.set_defaults(handler=cmd_run)

    val = sub.add_parser("validate", help="check a spec and its inputs; nothing runs")
    val.add_argument("spec")
    val.set_defaults(handler=cmd_validate)

    plan = sub.add_parser("plan", help="print the unit matrix, commands and preflight verdicts; nothing runs")
    plan.add_argument("spec")
    plan.add_argument("--targets", nargs="+", metavar="NAME")
    plan.set_defaults(handler=cmd_plan)

    exp = sub.add_parser("explain", help="for each unit: cache hit or miss, and for a miss what changed")
    exp.add_argument("spec")
    exp.add_argument("--targets", nargs="+", metavar="NAME")
    exp.add_argument("--store", help="override publish.store")
    exp.set_defaults(handler=cmd_explain)

    roll = sub.add_parser("rollout", help="build when the source has something new, then promote or hold")
    roll.add_argument("spec")
    roll.add_argument("--targets", nargs="+", metavar="NAME", help="only these targets")
    roll.add_argument("--store", help="override publish.store")
    roll.add_argument("--mlflow-uri", help="override tracking.mlflow_uri")
    roll.add_argument("--mode", choices=("embedded", "cluster"), default="embedded",
                      help="cluster: each unit on its target's Prefect work pool (needs PREFECT_API_URL)")
    roll.add_argument("--max-accuracy-drop", type=float, default=0.02)
    roll.add_argument("--min-throughput-ratio", type=float, default=0.9)
    roll.add_argument("--max-ttft-p95-factor", type=float, default=1.25)
    roll.add_argument("--reference-concurrency", type=int)
    roll.add_argument("--force-build", action="store_true", help="build even when nothing is new")
    roll.set_defaults(handler=cmd_rollout)


def cmd_run(args: argparse.Namespace) -> int:
    from enginefoundry.validate import validate_deep

    spec = load(args.spec, {"store": args.store, "mlflow_uri": args.mlflow_uri})
    validate_deep(spec)  # every input problem before Prefect, downloads or servers start
    from enginefoundry.planning import refuse_on_preflight
    from enginefoundry.sources import probe

    refuse_on_preflight(spec, args.targets)

    resolved = probe(spec.model.parsed_source(spec.base_path))
    console.print(f"source {spec.model.source} → {resolved}", markup=False)
    summary, tracking_note = None, ""
    if not args.force:
        # Hits are decided before Prefect, model tooling or a server start: an all-hits run ends here.
        from enginefoundry import noop_run
        from enginefoundry.console import say

        hits = noop_run.decide_all_hits(spec, args.targets, progress=say, rehash=args.verify_hits)
        if hits is not None and args.wait_for_tracking:
            summary = noop_run.record_all_hits(spec, hits)
        elif hits is not None:
            pid, log = noop_run.record_in_background(spec, hits)
            summary = noop_run.summary_of(spec, hits)
            tracking_note = (f"MLflow: {len(hits.units)} cache hit(s) being recorded in {spec.tracking.mlflow_uri} "
                             f"by a background process (pid {pid}, log {log})")
    if summary is None:
        from enginefoundry.noop_run import flush_pending

        flush_pending()  # hits an earlier recorder could not record
        quiet_prefect_defaults()
        from enginefoundry.flows.build_engines import build_engines, spec_payload

        summary = build_engines(spec_path=None, spec=spec_payload(spec), targets=args.targets, force=args.force,
                                mode=args.mode, validated=True, verify_hits=args.verify_hits)
    console.print()
    table(f"{summary.spec}: {summary.source_uri}"
          + (f" @ {summary.source_revision[:12]}" if summary.source_revision else ""), summary.rows())
    if any(o.bench.get("slo") for o in summary.outcomes):
        from enginefoundry.pipeline import best_profiles

        table("best profile per target (within the benchmark SLOs)", best_profiles(summary.outcomes))
    for o in summary.outcomes:
        if o.manifest_uri:
            console.print(f"  {o.unit}: {o.manifest_uri}", markup=False)
    console.print(tracking_note or f"MLflow parent run {summary.parent_run_id} in {spec.tracking.mlflow_uri}",
                  markup=False)
    return EXIT_OK if summary.ok else EXIT_PIPELINE


def cmd_validate(args: argparse.Namespace) -> int:
    from enginefoundry.plan import expand_units
    from enginefoundry.validate import validate_deep

    spec = load(args.spec)
    validate_deep(spec)
    console.print(f"[green]ok[/green]: {args.spec} is valid: lane {spec.lane}, "
                  f"{len(expand_units(spec))} unit(s)")
    return EXIT_OK


def cmd_plan(args: argparse.Namespace) -> int:
    from enginefoundry.planning import plan_report

    spec = load(args.spec)
    report = plan_report(spec, args.targets)
    table(f"{spec.name}: {len(report.rows)} unit(s), lane {spec.lane}", report.rows)
    for unit_name, commands in report.commands.items():
        console.print(f"\n[bold]{unit_name}[/bold]")
        for line in commands:
            console.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)
    if report.refused:
        error(f"{report.refused} unit(s) refused by preflight; fix the spec as the verdicts say")
        return EXIT_INPUT
    return EXIT_OK


def cmd_explain(args: argparse.Namespace) -> int:
    from enginefoundry.console import say
    from enginefoundry.explain import explain
    from enginefoundry.sources import fetch
    from enginefoundry.store import open_store

    spec = load(args.spec, {"store": args.store, "mlflow_uri": None})
    snapshot = fetch(spec.model.parsed_source(spec.base_path), progress=say)
    rows = explain(spec, snapshot, open_store(spec.publish.store, spec.publish.s3_endpoint_url), args.targets)
    table(f"{spec.name}: cache against {spec.publish.store}", [
        {"unit": r.unit, "status": "hit" if r.hit else "miss", "key": r.key[:12],
         "nearest published": (r.nearest or "-")[:12], "what differs": "\n".join(r.differences)} for r in rows])
    return EXIT_OK


def cmd_rollout(args: argparse.Namespace) -> int:
    from enginefoundry.validate import validate_deep

    spec = load(args.spec, {"store": args.store, "mlflow_uri": args.mlflow_uri})
    validate_deep(spec)
    quiet_prefect_defaults()
    from enginefoundry.flows.build_engines import spec_payload
    from enginefoundry.flows.rollout import rollout

    report = rollout(spec_path=None, spec=spec_payload(spec), targets=args.targets, mode=args.mode,
                     max_accuracy_drop=args.max_accuracy_drop, min_throughput_ratio=args.min_throughput_ratio,
                     max_ttft_p95_factor=args.max_ttft_p95_factor, reference_concurrency=args.reference_concurrency,
                     force_build=args.force_build)
    console.print()
    table(f"{spec.name}: {report.change.source.describe()}", report.change.rows())
    if not report.built:
        console.print(f"nothing new: no build ({report.duration_s:.1f} s)")
        return EXIT_OK
    table(f"{spec.name}: promotion", [d.row() for d in report.decisions])
    return EXIT_OK if report.build_ok else EXIT_PIPELINE
