"""`lengths`: observed prompt lengths → percentiles and profile limits."""

from __future__ import annotations

import argparse

from enginefoundry.console import console, table
from enginefoundry.errors import EXIT_OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    lens = sub.add_parser("lengths", help="observed prompt lengths → percentiles, max_input_len/max_seq_len")
    lens.add_argument("file", help='JSONL: {"tokens": N} / {"input_tokens": N}, or {"prompt": …} / {"messages": …}')
    lens.add_argument("--tokenizer", help="tokenizer folder, needed for raw prompts")
    lens.add_argument("--output-budget", type=int, default=1024, help="output tokens to add for max_seq_len")
    lens.set_defaults(handler=cmd_lengths)


def cmd_lengths(args: argparse.Namespace) -> int:
    from enginefoundry.spec.lengths import analyze_lengths, read_lengths

    r = analyze_lengths(read_lengths(args.file, args.tokenizer), output_budget=args.output_budget)
    table(f"{args.file}: {r.count} prompts", [{"p50": str(r.p50), "p90": str(r.p90), "p95": str(r.p95),
                                               "p99": str(r.p99), "max": str(r.max), "mean": f"{r.mean:.0f}",
                                               "stddev": f"{r.stddev:.0f}"}])
    console.print(f"recommended: max_input_len {r.max_input_len}, max_seq_len {r.max_seq_len} "
                  f"(from {r.base} + {r.headroom:.0%} headroom, output budget {r.output_budget})", markup=False)
    if r.split:
        table("proposed profiles", [{"profile": p.name, "covers": p.covers, "max_input_len": str(p.max_input_len),
                                     "max_seq_len": str(p.max_seq_len)} for p in r.split])
    console.print(f"rule: {r.rule}", markup=False)
    return EXIT_OK
