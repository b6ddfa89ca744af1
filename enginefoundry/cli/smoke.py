"""`smoke`: judge any OpenAI-compatible endpoint against a Hugging Face reference with the pipeline's gate.

Exit 0: passed; 1: rejected (the verdict names the rule and its numbers); 2: bad input (nothing judged).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from enginefoundry.cli.common import emit_json
from enginefoundry.console import console
from enginefoundry.errors import EXIT_OK, EXIT_PIPELINE, InputError, ToolError
from enginefoundry.spec.checks import (
    CALIBRATION_FREE,
    LOGPROB_CHECKS,
    NO_LIKE_REFERENCE,
    REFERENCE_PRECISIONS,
    SIMULATED_PRECISIONS,
    SIMULATED_REFERENCE,
    UNIT_PRECISION,
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "smoke", help="judge a running OpenAI-compatible endpoint against a Hugging Face reference",
        description="Judge a running OpenAI-compatible endpoint against a Hugging Face reference with the pipeline's "
                    "gate. The log-prob rules need a server that returns log-probs: the project's scoring server "
                    "serves any Hugging Face folder with chat log-probs and the prompt log-probs of teacher forcing "
                    "(python -m enginefoundry.smoke.serve MODEL_DIR --host 127.0.0.1 --port 8000 [--device cpu|cuda]; "
                    "docs/smoke-gate.md). Against a server without them (transformers serve) those checks do not run, "
                    "and the verdict says so.")
    p.add_argument("--endpoint", required=True, help="base URL of the server, e.g. http://gpu-node:8000")
    p.add_argument("--served-model", required=True, help="the `model` name the server expects in requests")
    p.add_argument("--reference", required=True, help="Hugging Face model folder: the reference")
    p.add_argument("--prompts", required=True, help="JSONL prompt set (prompt or messages, optional expected/match)")
    p.add_argument("--precision", default="fp32",
                   help="precision of the unit under test; picks the policy family (default fp32)")
    p.add_argument("--reference-precision", default="unit", choices=REFERENCE_PRECISIONS,
                   help="`unit` (default, as the spec's smoke.reference_precision): like with like where a "
                        "reference of the unit's precision exists: fp32, bf16, fp16 computed by transformers; "
                        f"{', '.join(CALIBRATION_FREE)} against TensorRT-LLM's weight-only quantization of "
                        "--reference simulated in the build's dtype; with --quantized-checkpoint, that checkpoint "
                        "dequantized (fp8, nvfp4: each linear's input quantized as the engine does); log-prob "
                        "bounds derived from the spread measured there, and the quantization's own accuracy cost "
                        "judged apart; without it, fp8, nvfp4 and int4_awq against the fp32 source with bounds "
                        "derived from its quantization spread "
                        "(--no-like-reference); one dtype for the reference; or `simulated`: as unit, and "
                        f"--precision one of {', '.join(SIMULATED_PRECISIONS)} (int4_awq: ModelOpt's fake quant "
                        "calibrated on --prompts, the simulate extra)")
    p.add_argument("--quantized-checkpoint", metavar="DIR",
                   help="the unit's own quantized checkpoint (ModelOpt's unified export, as hf_ptq.py writes it: "
                        "W4A16_AWQ, FP8, NVFP4), dequantized as the reference, FP8 and NVFP4 with each linear's input "
                        "quantized as the engine does: the build's own calibration and export")
    p.add_argument("--unquantized-original", metavar="DIR",
                   help="--reference is a pre-quantized checkpoint (ModelOpt's W4A16_AWQ, FP8 or NVFP4 export, judged "
                        "against itself dequantized): its unquantized original, which the rule `quantization cost` "
                        "compares with (as the spec's model.unquantized)")
    p.add_argument("--build-dtype", choices=("bf16", "fp16"),
                   help="the dtype a quantized unit computes in, which its simulated reference is computed in (as the "
                        "engine lane's lane_options.dtype); default the source's 16-bit dtype, fp16 for an fp32 "
                        "source (convert_checkpoint.py's dtype auto)")
    p.add_argument("--no-like-reference", choices=NO_LIKE_REFERENCE, default="fallback",
                   help="a --precision with no reference at its own precision: fallback (default: the fp32 source, "
                        "bounds derived from the quantization spread, said in the verdict) or refuse (exit 2)")
    p.add_argument("--logprob-checks", choices=LOGPROB_CHECKS, default="when-served",
                   help="the log-prob rules: when-served (default: named as not run where the server returns no "
                        "log-probs) or required (a rule that cannot run fails the verdict)")
    p.add_argument("--reference-device", choices=("auto", "cpu", "gpu"), default="auto",
                   help="where the reference answers are computed on a cache miss: a GPU where one is visible "
                        "(auto, the default), or cpu / gpu")
    p.add_argument("--concurrency", type=int, default=8,
                   help="requests in flight against the endpoint (default 8; a batching server answers them "
                        "together)")
    p.add_argument("--server-log", help="the server's log file: its last error line explains HTTP 5xx answers")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--served-tokenizer", help="the served unit's tokenizer folder, for the digest check")
    p.add_argument("--store", help="artifact store URI (s3://… or file://…) to reuse and publish reference answers")
    p.add_argument("--small-sample", choices=("refuse", "warn"), default="refuse",
                   help="a prompt set smaller than the policy's derived minimum: fail (default) or warn")
    p.add_argument("--report-dir", help="write smoke.json and smoke.md here")
    p.set_defaults(handler=cmd_smoke)


def cmd_smoke(args: argparse.Namespace) -> int:
    from enginefoundry.smoke import SmokeInputs, load_prompt_set, run_smoke, write_report
    from enginefoundry.smoke.policy import FAMILY_OF
    from enginefoundry.spec import SmokeSpec
    from enginefoundry.store.backends import open_store

    ref = Path(args.reference)
    if not (ref / "config.json").is_file():
        raise InputError(f"smoke: --reference {ref} is not a Hugging Face model folder (no config.json)")
    if args.precision not in FAMILY_OF:
        raise InputError(f"smoke: --precision '{args.precision}' is unknown; one of {', '.join(FAMILY_OF)}")
    if args.served_tokenizer and not Path(args.served_tokenizer).is_dir():
        raise InputError(f"smoke: --served-tokenizer {args.served_tokenizer} is not a folder")
    if not args.endpoint.startswith(("http://", "https://")):
        raise InputError(f"smoke: --endpoint '{args.endpoint}' must start with http:// or https://")
    if args.quantized_checkpoint and (args.reference_precision not in (UNIT_PRECISION, SIMULATED_REFERENCE)
                                      or not Path(args.quantized_checkpoint).is_dir()):
        raise InputError(f"smoke: --quantized-checkpoint {args.quantized_checkpoint}: a folder, with "
                         "--reference-precision unit (the default) or simulated")
    if args.unquantized_original and not Path(args.unquantized_original).is_dir():
        raise InputError(f"smoke: --unquantized-original {args.unquantized_original} is not a folder")
    prompts = load_prompt_set(Path(args.prompts))
    try:
        simulated = args.reference_precision == SIMULATED_REFERENCE
        spec = SmokeSpec(prompts=args.prompts, reference_precision=args.reference_precision,
                         max_new_tokens=args.max_new_tokens, small_sample=args.small_sample,
                         concurrency=args.concurrency, no_like_reference=args.no_like_reference,
                         logprob_checks=args.logprob_checks)
    except ValueError as err:
        raise InputError(f"smoke: {str(err).splitlines()[0]}") from None
    store = open_store(args.store) if args.store else None
    def say(message: str) -> None:
        if args.json:
            print(message, file=sys.stderr)
        else:
            console.print(message, markup=False, soft_wrap=True)

    try:
        report = run_smoke(SmokeInputs(spec, prompts, reference_dir=ref, base_url=args.endpoint,
                           model_name=args.served_model,
                           served_tokenizer_dir=Path(args.served_tokenizer) if args.served_tokenizer else None,
                           precision=args.precision, progress=say, store=store,
                           server_log=Path(args.server_log) if args.server_log else None,
                           reference_device=args.reference_device, simulated=simulated,
                           checkpoint=Path(args.quantized_checkpoint) if args.quantized_checkpoint else None,
                           build_dtype=args.build_dtype,
                           original_dir=Path(args.unquantized_original) if args.unquantized_original else None))
    except ToolError as err:
        if "(0/" in str(err):  # not a single answer: the endpoint or the model name is wrong
            raise InputError(str(err).splitlines()[0]) from None
        raise
    if args.report_dir:
        write_report(report, Path(args.report_dir))
    if args.json:
        emit_json(report)  # stdout carries only the report (json_mode sends everything else to stderr)
    else:
        console.print(report.markdown(), markup=False, soft_wrap=True)
        console.print(f"{'PASS' if report.passed else 'REJECTED'} (judged against {report.reference.label()}, "
                      f"{report.verdict.policy.family.value if report.verdict.policy else ''} policy): "
                      f"{report.verdict.reason}", markup=False, soft_wrap=True)
    return EXIT_OK if report.passed else EXIT_PIPELINE
