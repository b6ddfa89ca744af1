"""`fleet`: roll out many specs in one parent run (the `rollout-fleet` flow), with per-pool limits."""

from __future__ import annotations

import argparse

from enginefoundry.cli.common import destination_flags, emit_json, quiet_prefect_defaults, wants_json
from enginefoundry.console import console, table
from enginefoundry.errors import EXIT_OK, EXIT_PIPELINE


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    fleet = sub.add_parser("fleet", help="roll out many specs at once (files or folders of specs): one parent run, "
                                         "per-pool limits, one summary; a failing spec stops no other")
    fleet.add_argument("specs", nargs="+", metavar="SPEC_OR_FOLDER",
                       help="spec files, or folders whose *.yaml are specs (e.g. configs/fleet/)")
    fleet.add_argument("--name", default="fleet", help="the fleet's name: run name, artifact keys, MLflow fleet run")
    fleet.add_argument("--pool-limit", action="append", default=[], metavar="POOL=N",
                       help="at most N unit builds at once on work pool POOL (a Prefect global concurrency limit "
                            "enginefoundry-pool-POOL, kept on the server for later builds too), e.g. gpu-sm90=2; "
                            "repeat it for each pool")
    destination_flags(fleet)
    fleet.add_argument("--mode", choices=("embedded", "cluster"), default="embedded",
                       help="cluster: each unit on its target's Prefect work pool (needs PREFECT_API_URL)")
    fleet.add_argument("--max-accuracy-drop", type=float, default=0.02)
    fleet.add_argument("--min-throughput-ratio", type=float, default=0.9)
    fleet.add_argument("--max-ttft-p95-factor", type=float, default=1.25)
    fleet.add_argument("--comparison-rounds", type=int, default=3, metavar="N",
                       help="side-by-side rounds of champion and candidate, as for `rollout` (default 3)")
    fleet.add_argument("--force-build", action="store_true", help="build every spec even when nothing is new")
    fleet.set_defaults(handler=cmd_fleet)


def cmd_fleet(args: argparse.Namespace) -> int:
    from enginefoundry.rollout.fleet import FleetNotOk, fleet_spec_paths, parse_pool_limits

    paths = fleet_spec_paths(args.specs)  # a missing file or an empty folder is refused before Prefect starts
    limits = parse_pool_limits(args.pool_limit)
    quiet_prefect_defaults()
    from enginefoundry.flows.build_engines import flow_value
    from enginefoundry.flows.fleet import rollout_fleet

    try:
        summary = flow_value(rollout_fleet(
            specs=[str(p) for p in paths], name=args.name, mode=args.mode, pool_limits=limits,
            max_accuracy_drop=args.max_accuracy_drop, min_throughput_ratio=args.min_throughput_ratio,
            max_ttft_p95_factor=args.max_ttft_p95_factor, comparison_rounds=args.comparison_rounds,
            force_build=args.force_build, store=args.store, mlflow_uri=args.mlflow_uri,
            s3_endpoint_url=args.s3_endpoint_url))
    except FleetNotOk as err:  # every spec ran, some failed: the summary is printed as any other (exit 1)
        summary = err.summary
    code = EXIT_OK if summary.ok else EXIT_PIPELINE
    if wants_json(args):
        emit_json({"ok": summary.ok, **summary.model_dump(mode="json")})
        return code
    console.print()
    table(summary.headline(), summary.rows())
    if summary.pool_limits:
        console.print("per-pool limits: " + ", ".join(f"{p}={n}" for p, n in sorted(summary.pool_limits.items())),
                      markup=False)
    if summary.mlflow_run_id:
        console.print(f"MLflow fleet run {summary.mlflow_run_id}", markup=False)
    return code
