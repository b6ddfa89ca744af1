"""`enginefoundry`: run, validate and plan build specs; roll out, promote and roll back.

Exit codes: 0 success, 1 pipeline failure, 2 invalid input. User mistakes print one message, no
traceback; `--verbose` shows details. Prefect is imported only by `run`, through flows/.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

from enginefoundry import __version__
from enginefoundry.console import console, error, table
from enginefoundry.errors import EXIT_INPUT, EXIT_OK, EXIT_PIPELINE, EngineFoundryError, InputError
from enginefoundry.spec import BuildSpec, load_spec
from enginefoundry.spec.outputs import TrackingSpec

DEFAULT_MLFLOW = TrackingSpec().mlflow_uri


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="enginefoundry", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"enginefoundry {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="show tracebacks and details")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the pipeline for a spec (embedded mode: in this process)")
    run.add_argument("spec", help="build spec YAML, e.g. configs/tiny-cpu.yaml")
    run.add_argument("--targets", nargs="+", metavar="NAME", help="only these targets")
    run.add_argument("--force", action="store_true", help="rebuild units whose manifest already exists")
    run.add_argument("--store", help="override publish.store (s3://bucket/prefix or file://path)")
    run.add_argument("--mlflow-uri", help="override tracking.mlflow_uri")
    run.add_argument("--mode", choices=("embedded", "cluster"), default="embedded",
                     help="cluster: each unit on its target's Prefect work pool (needs PREFECT_API_URL)")

    val = sub.add_parser("validate", help="check a spec and its inputs; nothing runs")
    val.add_argument("spec")

    exp = sub.add_parser("explain", help="for each unit: cache hit or miss, and for a miss what changed")
    exp.add_argument("spec")
    exp.add_argument("--targets", nargs="+", metavar="NAME")
    exp.add_argument("--store", help="override publish.store")

    lin = sub.add_parser("lineage", help="what produced an artifact: store URI, unit key or models:/name@alias")
    lin.add_argument("ref")
    lin.add_argument("--mlflow-uri", default=os.environ.get("MLFLOW_TRACKING_URI", DEFAULT_MLFLOW),
                     help=f"MLflow tracking URI (default $MLFLOW_TRACKING_URI or {DEFAULT_MLFLOW})")
    lin.add_argument("--json", action="store_true", help="machine-readable output")

    lens = sub.add_parser("lengths", help="observed prompt lengths → percentiles, max_input_len/max_seq_len")
    lens.add_argument("file", help='JSONL: {"tokens": N} / {"input_tokens": N}, or {"prompt": …} / {"messages": …}')
    lens.add_argument("--tokenizer", help="tokenizer folder, needed for raw prompts")
    lens.add_argument("--output-budget", type=int, default=1024, help="output tokens to add for max_seq_len")

    plan = sub.add_parser("plan", help="print the unit matrix, commands and preflight verdicts; nothing runs")
    plan.add_argument("spec")
    plan.add_argument("--targets", nargs="+", metavar="NAME")

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

    for name, what in (("promote", "move <target>-champion to a version (default: <target>-candidate)"),
                       ("rollback", "put the previous <target>-champion back")):
        cmd = sub.add_parser(name, help=what)
        cmd.add_argument("registered_model", help="MLflow registered model, e.g. tiny-chat")
        cmd.add_argument("--target", required=True, help="target name (the alias prefix)")
        if name == "promote":
            cmd.add_argument("--version", help="registered model version (default: the <target>-candidate alias)")
        cmd.add_argument("--mlflow-uri", default=os.environ.get("MLFLOW_TRACKING_URI", DEFAULT_MLFLOW),
                         help=f"MLflow tracking URI (default $MLFLOW_TRACKING_URI or {DEFAULT_MLFLOW})")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        commands = {"validate": cmd_validate, "plan": cmd_plan, "explain": cmd_explain, "lineage": cmd_lineage,
                    "rollout": cmd_rollout, "lengths": cmd_lengths, "promote": cmd_registry,
                    "rollback": cmd_registry, "run": cmd_run}
        return commands[args.command](args)
    except EngineFoundryError as err:
        if args.verbose:
            traceback.print_exc()
        error(str(err))
        return err.exit_code
    except Exception as err:
        if args.verbose:
            traceback.print_exc()
        error(f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''} (rerun with --verbose)")
        return EXIT_PIPELINE
    except KeyboardInterrupt:
        error("interrupted; servers stopped, nothing half-published")
        return 130


def _load(path: str, overrides: dict[str, str | None] | None = None) -> BuildSpec:
    spec = load_spec(path)
    if overrides:
        publish = spec.publish.model_copy(update={"store": overrides["store"]}) if overrides.get("store") else None
        tracking = (spec.tracking.model_copy(update={"mlflow_uri": overrides["mlflow_uri"]})
                    if overrides.get("mlflow_uri") else None)
        spec = spec.model_copy(update={k: v for k, v in (("publish", publish), ("tracking", tracking)) if v})
    return spec


def cmd_validate(args: argparse.Namespace) -> int:
    from enginefoundry.plan import expand_units
    from enginefoundry.validate import validate_deep

    spec = _load(args.spec)
    validate_deep(spec)
    console.print(f"[green]ok[/green]: {args.spec} is valid: lane {spec.lane}, "
                  f"{len(expand_units(spec))} unit(s)")
    return EXIT_OK


def cmd_plan(args: argparse.Namespace) -> int:
    from enginefoundry.planning import plan_report

    spec = _load(args.spec)
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

    spec = _load(args.spec, {"store": args.store, "mlflow_uri": None})
    snapshot = fetch(spec.model.parsed_source(spec.base_path), progress=say)
    rows = explain(spec, snapshot, open_store(spec.publish.store, spec.publish.s3_endpoint_url), args.targets)
    table(f"{spec.name}: cache against {spec.publish.store}", [
        {"unit": r.unit, "status": "hit" if r.hit else "miss", "key": r.key[:12],
         "nearest published": (r.nearest or "-")[:12], "what differs": "\n".join(r.differences)} for r in rows])
    return EXIT_OK


def cmd_lineage(args: argparse.Namespace) -> int:
    import json

    from enginefoundry.lineage import lineage

    chain = lineage(args.ref, args.mlflow_uri)
    if args.json:
        print(json.dumps(chain, indent=2, default=str))
        return EXIT_OK
    a, src, ck, ml = chain["artifact"], chain["source"], chain["converted_checkpoint"], chain["mlflow"]
    rows = [
        ("artifact", f"{a['unit']} [{a['status']}] {a['files']} files, {a['bytes'] / 2**20:.1f} MiB"),
        ("manifest", a["manifest_uri"]), ("key", a["key"]),
        ("source", f"{src['uri']}" + (f" @ {src['commit_sha']}" if src.get("commit_sha") else "")),
        ("weights digest", src["weights_digest"]), ("tokenizer digest", src["tokenizer_digest"]),
        ("converted checkpoint", f"{ck['key']} {ck['uri'] or ''}"),
        ("lane / versions", f"{chain['lane']} " + ", ".join(f"{k} {v}" for k, v in chain["versions"].items())),
        ("built on", ", ".join(f"{k}={v}" for k, v in chain["built_on"].items()
                               if k in ("gpu_name", "arch", "memory_gib", "cpu", "device", "torch", "cuda"))),
        ("build", json.dumps(chain["build"]["params"], sort_keys=True)),
        ("smoke", ", ".join(f"{k.removeprefix('smoke_')}={v}" for k, v in chain["smoke"].items())),
        ("benchmark", ", ".join(f"{k}={v}" for k, v in chain["benchmark"].items() if not isinstance(v, list))),
        ("MLflow run", f"{ml.get('unit_run_id')} (parent {ml.get('parent_run_id')}) in {args.mlflow_uri}"),
        ("Prefect flow run", f"{ml.get('prefect_flow_run_id') or '-'} {ml.get('prefect_flow_run_url') or ''}"),
        ("project commit", str(ml.get("git_commit"))),
    ]
    if ml.get("registry"):
        reg = ml["registry"]
        rows.append(("registry", f"{reg['registered_model']} v{reg['version']}"
                     + (f" @{reg['alias']}" if reg.get("alias") else "")))
    table("lineage", [{"": k, "value": v} for k, v in rows])
    return EXIT_OK


def cmd_lengths(args: argparse.Namespace) -> int:
    from enginefoundry.lengths import analyze_lengths, read_lengths

    r = analyze_lengths(read_lengths(args.file, args.tokenizer), output_budget=args.output_budget)
    table(f"{args.file}: {r.count} prompts", [{"p50": str(r.p50), "p90": str(r.p90), "p95": str(r.p95),
                                               "p99": str(r.p99), "max": str(r.max), "mean": f"{r.mean:.0f}"}])
    console.print(f"recommended: max_input_len {r.max_input_len}, max_seq_len {r.max_seq_len} "
                  f"(from {r.base} + {r.headroom:.0%} headroom, output budget {r.output_budget})", markup=False)
    if r.split:
        table("proposed profiles", [{"profile": p.name, "covers": p.covers, "max_input_len": str(p.max_input_len),
                                     "max_seq_len": str(p.max_seq_len)} for p in r.split])
    console.print(f"rule: {r.rule}", markup=False)
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    from enginefoundry.validate import validate_deep

    spec = _load(args.spec, {"store": args.store, "mlflow_uri": args.mlflow_uri})
    validate_deep(spec)  # every input problem before Prefect, downloads or servers start
    from enginefoundry.planning import refuse_on_preflight
    from enginefoundry.sources import probe

    refuse_on_preflight(spec, args.targets)

    resolved = probe(spec.model.parsed_source(spec.base_path))
    console.print(f"source {spec.model.source} → {resolved}", markup=False)
    _quiet_prefect_defaults()
    from enginefoundry.flows.build_engines import build_engines

    payload = spec.model_dump(mode="json")
    payload["base_dir"] = spec.base_dir
    summary = build_engines(spec_path=None, spec=payload, targets=args.targets, force=args.force, mode=args.mode)
    console.print()
    table(f"{summary.spec}: {summary.source_uri}"
          + (f" @ {summary.source_revision[:12]}" if summary.source_revision else ""), summary.rows())
    if any(o.bench.get("slo") for o in summary.outcomes):
        from enginefoundry.pipeline import best_profiles

        table("best profile per target (within the benchmark SLOs)", best_profiles(summary.outcomes))
    for o in summary.outcomes:
        if o.manifest_uri:
            console.print(f"  {o.unit}: {o.manifest_uri}", markup=False)
    console.print(f"MLflow parent run {summary.parent_run_id} in {spec.tracking.mlflow_uri}", markup=False)
    return EXIT_OK if summary.ok else EXIT_PIPELINE


def cmd_rollout(args: argparse.Namespace) -> int:
    from enginefoundry.validate import validate_deep

    spec = _load(args.spec, {"store": args.store, "mlflow_uri": args.mlflow_uri})
    validate_deep(spec)
    _quiet_prefect_defaults()
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


def cmd_registry(args: argparse.Namespace) -> int:
    from enginefoundry.promotion import Registry, candidate_alias

    registry = Registry(args.mlflow_uri)
    model, stem = args.registered_model, args.target
    if args.command == "rollback":
        move = registry.rollback(model, stem)
    else:
        number = args.version
        if number is None:
            candidate = registry.version_by_alias(model, candidate_alias(stem))
            if candidate is None:
                raise InputError(f"{model} has no alias {candidate_alias(stem)}: give --version N")
            number = candidate.version
        move = registry.promote(model, stem, number, "promoted by hand (enginefoundry promote)")
    console.print(f"{model}: {move.action}: {move.detail}", markup=False)
    return EXIT_OK


def _quiet_prefect_defaults() -> None:
    """Embedded mode on a closed network: no telemetry lookups."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")


if __name__ == "__main__":
    sys.exit(main())
