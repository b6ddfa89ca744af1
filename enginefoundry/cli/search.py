"""`enginefoundry search SPEC`: predict, per target, the configurations that best meet the spec's `search` section
(workload, SLO, GPU budget, objective) and print the ranked table; nothing is built, no GPU is needed."""

from __future__ import annotations

import argparse

from enginefoundry.cli.common import emit_json, load_searched, wants_json
from enginefoundry.console import console, table
from enginefoundry.errors import EXIT_INPUT, EXIT_OK, SpecError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("search", help="predict the best serving configurations per target for the spec's search "
                                      "section (SLO, workload, objective); nothing is built")
    p.add_argument("spec", help="build spec YAML with a `search` section (docs/search.md)")
    p.add_argument("--targets", nargs="+", metavar="NAME", help="only these targets")
    p.set_defaults(handler=cmd_search)


def cmd_search(args: argparse.Namespace) -> int:
    from enginefoundry.search.plan import disagg_lines, rows

    spec, _, report = load_searched(args.spec, args)
    if report is None:
        raise SpecError([("search", "the spec has no search section: add one (workload, slo, precisions, "
                                    "top_k; docs/search.md)")], args.spec)
    if wants_json(args):
        emit_json({"ok": True, "spec": spec.name, **report.model_dump(mode="json"),
                   "workload": spec.search.workload.model_dump(mode="json") if spec.search else None,
                   "units": [s.model_dump(mode="json") for s in spec.searched]})
        return EXIT_OK
    s = spec.search
    assert s is not None
    w = s.workload
    table(f"{spec.name}: ISL {w.isl}±{w.isl_stddev} / OSL {w.osl}±{w.osl_stddev}, TTFT p95 ≤ {s.slo.ttft_p95_ms:g} ms, "
          f"ITL p95 ≤ {s.slo.itl_p95_ms:g} ms, ranked by {s.objective.value}, top {s.top_k}", rows(report))
    console.print(f"  workload: ISL from {w.source()}", markup=False)
    if report.config_source:
        moe = f"; mixture of experts, {report.experts} routed experts" if report.experts else ""
        console.print(f"  model: config.json from {report.config_source}{moe}", markup=False)
    for ts in report.targets:
        what = (f"{ts.predictor} ({ts.cached} cached, {ts.seconds:.1f} s)" if ts.covered
                else f"not predicted: {ts.reason}")
        console.print(f"  {ts.target}: {what}" + (f"; {ts.note}" if ts.note else ""), markup=False)
    for line in disagg_lines(report):
        console.print(f"  {line}", markup=False)
    console.print(f"search: {report.seconds:.1f} s", markup=False)
    return EXIT_OK if any(ts.units for ts in report.targets) else EXIT_INPUT
