#!/usr/bin/env python3
"""Why a broken build passed the gate: two in-process probes of one build against its model's fp32 source.

    .venv/bin/python benchmarks/gate_probe.py MODEL BUILD [BUILD ...] [--context-tokens 600] [--every 4]
    .venv/bin/python benchmarks/gate_probe.py MODEL BUILD [BUILD ...] --slice long-context [--prompts FILE]

Run after benchmarks/gate.py (it reuses the cached builds and the fp32 reference answers of gate_prompts.jsonl).
  * log-probs: each reference answer teacher-forced through the build; mean |Δ log-prob| on the prefix where the
    build's argmax equals the reference token. That is what the gate's log-prob rule would measure if the
    endpoint returned log-probs (`transformers serve` ignores them; enginefoundry/smoke/logprobs.py).
  * long prompts: greedy answers (16 new tokens) of every `--every`-th gate question asked after the first
    `--context-tokens` tokens of docs/smoke-gate.md and docs/facts/hf-hub-and-test-model.md; first-4-token and
    full agreement with the fp32 source. The gate's own prompts are short (median about 40 tokens).
With --slice NAME the long-prompt probe asks the prompt set's slice (e.g. the long-context slice of
gate_prompts.jsonl, benchmarks/make_long_prompts.py) instead, and also reports the first-4 Wilson lower bound,
the mean matched-prefix share and task accuracy: what the gate's per-slice rules would see.
Builds are loaded in bf16 (fp16 for the fp16 build), on one CPU thread.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import gate_models  # noqa: E402

from enginefoundry.smoke.prompts import load_prompt_set  # noqa: E402
from enginefoundry.smoke.reference import ReferenceAsk, ReferenceSettings, load_or_compute_reference  # noqa: E402
from enginefoundry.smoke.stats import wilson_lower_bound  # noqa: E402

PROMPTS = REPO / "benchmarks" / "gate_prompts.jsonl"
DOCUMENT = (REPO / "docs" / "smoke-gate.md", REPO / "docs" / "facts" / "hf-hub-and-test-model.md")


def main() -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("builds", nargs="+", help="healthy dtypes (bf16, fp16) or breakages (rope-theta, …)")
    ap.add_argument("--context-tokens", type=int, default=600)
    ap.add_argument("--every", type=int, default=4, help="use every N-th gate prompt for the long-prompt probe")
    ap.add_argument("--slice", help="probe this slice of the prompt set instead of document-prefixed questions")
    ap.add_argument("--prompts", default=str(PROMPTS), help="prompt set (JSONL)")
    ap.add_argument("--skip-short", action="store_true", help="skip the short-prompt log-prob probe")
    args = ap.parse_args()
    torch.set_num_threads(1)

    src = gate_models.source_dir(args.model)
    all_cases = load_prompt_set(Path(args.prompts)).cases
    cases = [c for c in all_cases if c.slice is None]
    tok = AutoTokenizer.from_pretrained(src)
    if args.skip_short:
        answers = {}
    else:
        ref, _ = load_or_compute_reference(src, ReferenceAsk(cases, 16), ReferenceSettings(), dtype="fp32")
        answers = {a.id: a for a in ref.answers}
    if args.slice:
        long_cases = [c for c in all_cases if c.slice == args.slice]
        if not long_cases:
            raise SystemExit(f"no prompts of slice {args.slice!r} in {args.prompts}")
    else:
        text = "\n\n".join(p.read_text() for p in DOCUMENT)
        doc = tok.decode(tok(text).input_ids[:args.context_tokens])
        long_cases = cases[::args.every]

    def long_messages(c) -> list[dict]:
        if args.slice:
            return c.chat()
        return [{"role": "user", "content": f"{doc}\n\n---\n\n{c.messages[-1].content}"}]

    def prompt_ids(messages: list[dict]) -> list[int]:
        templated: Any = tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
        return list(templated["input_ids"])

    def long_answers(model) -> tuple[list[list[int]], int]:
        out, n = [], 0
        for c in long_cases:
            ids = prompt_ids(long_messages(c))
            n = max(n, len(ids))
            with torch.no_grad():
                g = model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)
            out.append(g[0, len(ids):].tolist())
        return out, n

    source = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    ref_long, n_long = long_answers(source)
    del source
    for name in args.builds:
        healthy = name in ("fp32", "bf16", "fp16")
        build = gate_models.dtype_build(args.model, name) if healthy else gate_models.broken_build(args.model, name)
        dtype = {"fp32": torch.float32, "fp16": torch.float16}.get(name, torch.bfloat16)
        model = AutoModelForCausalLM.from_pretrained(build, dtype=dtype)
        diffs: list[float] = []
        for c in cases if not args.skip_short else []:
            a = answers[c.id]
            p = prompt_ids([m.model_dump() for m in c.messages or []])
            with torch.no_grad():
                lp = torch.log_softmax(model(torch.tensor([p + a.token_ids])).logits[0].float(), -1)
            for i, (tid, ref_lp) in enumerate(zip(a.token_ids, a.token_logprobs, strict=False)):
                row = lp[len(p) - 1 + i]
                if int(row.argmax()) != tid:
                    break
                diffs.append(abs(float(row[tid]) - ref_lp))
        got, _ = long_answers(model)
        first4 = sum(x[:4] == y[:4] for x, y in zip(got, ref_long, strict=True))
        full = sum(x == y for x, y in zip(got, ref_long, strict=True))
        if args.slice:
            share = sum(_prefix(x, y) / max(len(y), 1) for x, y in zip(got, ref_long, strict=True)) / len(got)
            right = sum(bool(c.is_correct(str(tok.decode(x, skip_special_tokens=True))))
                        for c, x in zip(long_cases, got, strict=True))
            ref_right = sum(bool(c.is_correct(str(tok.decode(y, skip_special_tokens=True))))
                            for c, y in zip(long_cases, ref_long, strict=True))
            lower = wilson_lower_bound(first4, len(got), 0.95)
            print(f"{args.model} {name}: slice {args.slice}: first-4 {first4}/{len(got)} (Wilson 95% lower bound "
                  f"{lower:.3f}), prefix share {share:.2f}, full {full}/{len(got)}, "
                  f"accuracy {right}/{len(got)} (fp32 source {ref_right}/{len(got)})", flush=True)
            for c, x, y in zip(long_cases, got, ref_long, strict=True):
                if x[:4] != y[:4]:
                    print(f"    {c.id}: {tok.decode(x, skip_special_tokens=True)!r} vs "
                          f"{tok.decode(y, skip_special_tokens=True)!r}", flush=True)
        print(f"{args.model} {name}: short prompts: mean |Δ log-prob| {sum(diffs) / max(len(diffs), 1):.4f} over "
              f"{len(diffs)} agreeing tokens (max {max(diffs, default=0):.3f}); prompts of up to {n_long} tokens: "
              f"first-4 agreement {first4}/{len(got)}, full {full}/{len(got)}", flush=True)
        del model
    return 0


def _prefix(a: list[int], b: list[int]) -> int:
    k = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        k += 1
    return k


if __name__ == "__main__":
    sys.exit(main())
