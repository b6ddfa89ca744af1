"""The smoke stage: served answers against the Hugging Face reference, judged by the gate (gate.py, policy.py).

`run_smoke` is the one entry for the pipeline's smoke stage and the `enginefoundry smoke` command.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from enginefoundry import tracking_tags as mltags
from enginefoundry.build.quantized_source import read_quantization
from enginefoundry.errors import InputError, ToolError
from enginefoundry.evidence.inputs import InputTrust
from enginefoundry.identity import TOKENIZER_FILES, digest_files, list_files
from enginefoundry.runner import exited_after_error
from enginefoundry.smoke.client import ChatClient, ScoredToken, ServedAnswer, TokenLogprob
from enginefoundry.smoke.fallback import PROXIES, load_or_compute_quantization_spread, proxy_model
from enginefoundry.smoke.gate import (
    LOSSLESS,
    CaseEvidence,
    GateRule,
    GateVerdict,
    judge,
    rule_lossless,
    slice_names,
    wilson_lower_bound,
)
from enginefoundry.smoke.lm_eval import LmEvalConfig, LmEvalResult, run_lm_eval
from enginefoundry.smoke.logprobs import (
    LogprobComparison,
    LogprobSpread,
    TeacherForced,
    compare_logprobs,
    compare_teacher_forced,
)
from enginefoundry.smoke.policy import GatePolicy, policy_for, policy_table_markdown
from enginefoundry.smoke.prompts import PromptCase, PromptSet, load_prompt_set
from enginefoundry.smoke.reference import (
    PROGRESS_EVERY_S,
    ReferenceAnswer,
    ReferenceOutcome,
    ReferenceSet,
    load_or_compute_reference,
    load_or_compute_spread,
)
from enginefoundry.smoke.simulated import (
    QUANTIZATION_COST,
    TORCH_DTYPES,
    can_simulate,
    export_problem,
    simulated_dtype,
    simulated_reference,
)
from enginefoundry.smoke.stats import paired_noninferiority
from enginefoundry.spec import SmokeSpec
from enginefoundry.spec.checks import (
    COMPUTABLE,
    SIMULATED_REFERENCE,
    UNIT_PRECISION,
    no_like_reference,
    reference_precision_for,
    simulated_why,
)
from enginefoundry.store.backends import Store
from enginefoundry.store.manifest import BuildInput

__all__ = [
    "COMPUTABLE", "UNIT_PRECISION", "GatePolicy", "GateRule", "GateVerdict", "LmEvalConfig", "LmEvalResult",
    "LogprobComparison", "SliceSummary", "SmokeReport", "ask_all", "check_prompt_count", "last_error_line",
    "load_or_compute_reference", "load_prompt_set", "policy_for", "policy_table_markdown", "reference_precision_for",
    "run_lm_eval", "run_smoke", "tokenizer_digest", "twin_answers", "wilson_lower_bound", "with_twin_answers",
    "write_report",
]


class CaseResult(BaseModel):
    id: str
    served: str
    reference: str
    agree: bool
    first_n_agree: bool
    matched_prefix: int
    served_correct: bool | None
    reference_correct: bool | None
    finish_reason: str | None = None
    refused: str | None = None
    slice: str | None = None


class SliceSummary(BaseModel):
    """One named slice of the prompt set (PromptCase.slice), measured on its own as the gate judges it."""

    name: str
    n: int
    agree: int
    first_n_agree: int
    first_n_agreement: float
    first_n_lower_bound: float
    mean_prefix_share: float
    served_accuracy: float | None
    reference_accuracy: float | None
    tf_mean_abs_diff: float | None = None  # teacher-forced mean |Δ log-prob| of the slice's reference tokens

    @classmethod
    def of(cls, name: str, cases: list[CaseEvidence], first_n: int, confidence: float,
           teacher: TeacherForced | None = None) -> SliceSummary:
        n = len(cases)
        first = sum(c.first_n_agree(first_n) for c in cases)
        graded = [c for c in cases if c.served_correct is not None and c.reference_correct is not None]
        return cls(
            name=name, n=n, agree=sum(c.agree for c in cases), first_n_agree=first, first_n_agreement=first / n,
            first_n_lower_bound=round(wilson_lower_bound(first, n, confidence), 4),
            mean_prefix_share=round(sum(c.prefix_share for c in cases) / n, 4),
            served_accuracy=sum(bool(c.served_correct) for c in graded) / len(graded) if graded else None,
            reference_accuracy=sum(bool(c.reference_correct) for c in graded) / len(graded) if graded else None,
            tf_mean_abs_diff=teacher.mean_abs_diff if teacher is not None else None)

    def metric_prefix(self) -> str:
        return "smoke_slice_" + self.name.replace("-", "_")


class SmokeReport(BaseModel):
    n: int
    agree: int
    agreement: float
    agreement_lower_bound: float
    first_n_agreement: float
    mean_prefix_share: float
    served_accuracy: float | None
    reference_accuracy: float | None
    tokenizer_match: bool | None  # None: no served tokenizer folder to compare
    served_tokenizer_digest: str | None
    reference_tokenizer_digest: str
    precision: str
    reference: ReferenceOutcome
    verdict: GateVerdict
    duration_s: float
    cases: list[CaseResult]
    logprobs: LogprobComparison | None = None
    teacher_forced: TeacherForced | None = None  # the reference's answers scored under the served model
    spread: LogprobSpread | None = None  # measured at the reference's precision: the log-prob bounds follow from it
    lm_eval: LmEvalResult | None = None
    slices: list[SliceSummary] = []  # one per named slice of the prompt set; empty when it has none
    # Which server was judged, where the pipeline started it (its command's description: "transformers serve",
    # "enginefoundry scoring server"); None where a URL was judged (`enginefoundry smoke`).
    server: str | None = None
    # What the endpoint answered, in the reference's form: a sibling unit's answers judge lower precisions
    # (reference.publish_sibling_reference). Not written to smoke.json (reports stay as they were).
    served_answers: list[ReferenceAnswer] = Field(default_factory=list, exclude=True)
    # What the gate consumed besides the reference stage's answers (the spread, the source's answers of the
    # quantization-cost rule), each bound by digest (evidence/inputs.py); in the unit's manifest, not in smoke.json.
    inputs: list[BuildInput] = Field(default_factory=list, exclude=True)

    @property
    def passed(self) -> bool:
        return self.verdict.passed

    def summary(self) -> dict[str, float | bool | int]:
        """Flat numbers for manifests and MLflow."""
        out: dict[str, float | bool | int] = {
            "smoke_n": self.n, "smoke_agreement": self.agreement,
            "smoke_agreement_lower_bound": self.agreement_lower_bound,
            "smoke_first_n_agreement": self.first_n_agreement, "smoke_prefix_share": self.mean_prefix_share,
            "smoke_passed": self.passed,
        }
        if self.policy is not None:
            out["smoke_min_samples"] = self.policy.min_samples
        if self.tokenizer_match is not None:
            out["smoke_tokenizer_match"] = self.tokenizer_match
        if self.served_accuracy is not None:
            out["smoke_accuracy"] = self.served_accuracy
        if self.reference_accuracy is not None:
            out["smoke_reference_accuracy"] = self.reference_accuracy
        if self.teacher_forced is not None and self.teacher_forced.mean_abs_diff is not None:
            out["smoke_tf_logprob_mean_abs_diff"] = self.teacher_forced.mean_abs_diff
            if self.teacher_forced.top1_agreement is not None:
                out["smoke_tf_top1_agreement"] = self.teacher_forced.top1_agreement
        if self.logprobs is not None and self.logprobs.mean_abs_diff is not None:
            out["smoke_logprob_mean_abs_diff"] = self.logprobs.mean_abs_diff
            out["smoke_logprob_max_abs_diff"] = self.logprobs.max_abs_diff or 0.0
        for sl in self.slices:
            key = sl.metric_prefix()
            out[f"{key}_n"] = sl.n
            out[f"{key}_first_n_agreement"] = sl.first_n_agreement
            out[f"{key}_prefix_share"] = sl.mean_prefix_share
            if sl.served_accuracy is not None:
                out[f"{key}_accuracy"] = sl.served_accuracy
            if sl.tf_mean_abs_diff is not None:
                out[f"{key}_tf_logprob_mean_abs_diff"] = sl.tf_mean_abs_diff
        if self.lm_eval is not None:
            out.update(self.lm_eval.summary())
        out["smoke_checks_not_run"] = len(self.verdict.skipped)
        return out

    @property
    def policy(self) -> GatePolicy | None:
        return self.verdict.policy

    def tags(self) -> dict[str, str]:
        """Strings for MLflow tags: which reference and which policy judged the unit."""
        tags = {mltags.SMOKE_REFERENCE_KEY: self.reference.key, mltags.SMOKE_REFERENCE: self.reference.label()}
        if self.policy is not None:
            tags[mltags.SMOKE_POLICY] = self.policy.family.value
        if self.server is not None:
            tags[mltags.SMOKE_SERVER] = self.server
        # Checks that could not run, on the run itself (never a silent skip): "2 checks not run: …", or "none".
        tags[mltags.SMOKE_NOT_RUN] = self.verdict.not_run_summary() or "none"
        tags[mltags.SMOKE_REFERENCE_WHY] = (self.verdict.reference_why or "n/a")[:4800]
        return tags

    def markdown(self) -> str:
        rows = [
            "| metric | value |", "|---|---|",
            f"| judged against | {self.reference.label()} |",
            *([f"| server judged | {self.server} |"] if self.server is not None else []),
            f"| why that reference | {self.verdict.reference_why or 'n/a'} |",
            f"| policy | {self.policy.family.value if self.policy else 'n/a'} ({self.precision}) |",
            f"| prompts | {self.n} |",
            f"| full-answer agreement | {self.agree}/{self.n} ({self.agreement:.3f}) |",
            f"| first-N-token agreement | {self.first_n_agreement:.3f} |",
            f"| mean matched prefix share | {self.mean_prefix_share:.3f} |",
            f"| accuracy (served / reference) | {_fmt(self.served_accuracy)} / {_fmt(self.reference_accuracy)} |",
            f"| tokenizer digest match | {_yes(self.tokenizer_match)} |",
            f"| log-probs vs reference | {self.logprobs.detail if self.logprobs else 'not checked'} |",
            f"| teacher-forced log-probs | {self.teacher_forced.detail if self.teacher_forced else 'not checked'} |",
            f"| log-prob spread at the reference's precision | {self.spread.describe() if self.spread else 'none'} |",
        ]
        for sl in self.slices:
            rows.append(f"| slice {sl.name} | {sl.n} prompts; first-N {sl.first_n_agree}/{sl.n} "
                        f"({sl.first_n_agreement:.3f}, lower bound {sl.first_n_lower_bound:.3f}); "
                        f"prefix share {sl.mean_prefix_share:.3f}; full "
                        f"{sl.agree}/{sl.n}; accuracy {_fmt(sl.served_accuracy)} / {_fmt(sl.reference_accuracy)}"
                        + (f"; teacher-forced mean |Δ log-prob| {sl.tf_mean_abs_diff:.4f}"
                           if sl.tf_mean_abs_diff is not None else "") + " |")
        if self.lm_eval is not None:
            rows.append(f"| lm-eval ({self.lm_eval.status}) | {self.lm_eval.detail} |")
        rows.append(f"| verdict | {'PASS' if self.passed else 'FAIL'}: {self.verdict.reason} |")
        rows += ["", "| rule | kind | ok | detail |", "|---|---|---|---|"]
        rows += [f"| {r.name} | {r.kind} | {'warn' if r.warning else 'yes' if r.ok else 'NO'} | {r.detail} |"
                 for r in self.verdict.rules]
        return "\n".join(rows) + "\n"


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _yes(x: bool | None) -> str:
    return "not checked" if x is None else "yes" if x else "NO"


def tokenizer_digest(folder: Path) -> str:
    files = [p for p in list_files(folder) if p.name in TOKENIZER_FILES]
    return digest_files(folder, files)[0]


def run_smoke(
    spec: SmokeSpec, prompts: PromptSet, *, reference_dir: Path, base_url: str, model_name: str,
    served_tokenizer_dir: Path | None, precision: str = "fp32", progress: Callable[[str], None] = print,
    server_alive: Callable[[], bool] | None = None, max_logprob_diff: float | None = None,
    store: Store | None = None, weights_digest: str | None = None, reference: ReferenceSet | None = None,
    reference_outcome: ReferenceOutcome | None = None, server_log: Path | None = None,
    reference_device: str = "cpu", simulated: bool = False, checkpoint: Path | None = None,
    trust: InputTrust | None = None,
    build_dtype: str | None = None,
    speculative: bool = False, twin_body: dict[str, Any] | None = None,  # JSON edge: the twin's request fields
    original_dir: Path | None = None,
) -> SmokeReport:
    """Every prompt through the endpoint (`spec.concurrency` at a time), compared with the reference answers
    (computed once per key), then the gate.

    Before any reference work: the prompt set is checked against the policy's minimum (refused with the number
    needed, InputError) and the endpoint answers one token of the first prompt (ToolError when it does not).
    Raises ToolError (one line first: which prompt, how many answered) when the endpoint stops answering;
    `server_alive` lets it say that the server process died rather than "connection refused" (asked until the
    process has had time to exit: runner.exited_after_error). `server_log`: the server's log, whose last error
    line names the cause of HTTP 5xx answers in the verdict.

    `simulated` (the `smoke` command's --reference-precision simulated), or `spec.simulates(precision)` (the spec's
    smoke.reference_precision: simulated): a weight-only quantized unit is judged against the quantization tool's
    simulated model of the source (smoke/simulated.py; int4_awq calibrated on the prompt set) in the build's dtype,
    like with like: the compute dtype's policy, log-prob limits from the spread measured on the simulated model; and the
    quantization's own cost is a rule of its own (`quantization cost`: the simulated model's task accuracy against
    the source's at the same dtype, with the precision family's margin). `simulated` refuses a precision that is
    not simulated; both refuse a format whose simulation needs ModelOpt where it is missing (InputError, before the
    endpoint is asked). `checkpoint`: the unit's own quantized checkpoint (ModelOpt's unified export), dequantized
    as its reference instead of a simulation. `build_dtype` (bf16, fp16): the dtype a quantized build computes in
    (the engine lane's lane_options.dtype), else the source's 16-bit dtype, fp16 for an fp32 source
    (simulated.simulated_dtype).

    A pre-quantized source (`reference_dir` is a ModelOpt export: build.quantized_source) is judged against itself
    dequantized (`checkpoint`, or the reference stage's outcome); its `quantization cost` rule compares with the
    unquantized `original_dir` where one is given, and is not judged otherwise.

    `speculative`: the unit speculates, and the rule `lossless speculation` compares its greedy answers with those
    of its non-speculative twin: the same endpoint asked with `twin_body` (the lane's switch; None: there is none,
    and the rule fails as not run).
    """
    t0 = time.monotonic()
    cases = prompts.cases
    overrides = spec.policy_overrides()
    if max_logprob_diff is not None:
        overrides["max_logprob_diff"] = max_logprob_diff
    source_dir = reference_dir
    prequantized = read_quantization(source_dir)
    if prequantized is not None and not prequantized.dequantizable:
        raise InputError(f"smoke: {source_dir} is pre-quantized ({prequantized.label()}), and the gate has no "
                         "reference for it (it dequantizes W4A16_AWQ exports without a quantized KV cache); judge "
                         "against the unquantized checkpoint instead")
    if prequantized is not None and checkpoint is None:
        checkpoint = source_dir  # a pre-quantized source is judged against itself, dequantized
    given = reference_outcome is not None and reference_outcome.simulated is not None  # by the reference stage
    sibling = reference_outcome is not None and reference_outcome.sibling_unit is not None
    # Like with like by default (issue 39): a weight-only unit against its quantizer's simulation, a unit whose own
    # quantized checkpoint is given against that checkpoint dequantized.
    simulated = simulated or (spec.simulates(precision) and not sibling) or given or checkpoint is not None
    if spec.no_like_reference == "refuse" and not simulated and not sibling and not spec.has_like_reference(precision):
        raise InputError(f"smoke.no_like_reference: refuse: a {precision} unit has no reference at its own precision "
                         f"({no_like_reference(precision)}): give the unit's own quantized checkpoint "
                         "(--quantized-checkpoint, ModelOpt's unified export), or smoke.no_like_reference: fallback "
                         "(--no-like-reference fallback) to judge it against the fp32 source with bounds derived from "
                         "the quantization spread")
    problem = export_problem(checkpoint) if checkpoint is not None else None
    if problem is not None:
        raise InputError(f"smoke: --quantized-checkpoint {checkpoint} is not read: {problem}")
    if simulated and not given and checkpoint is None:
        why_not = can_simulate(precision)
        if why_not is not None:
            raise InputError(f"smoke: reference precision simulated: {why_not}")
    # Against its simulation a quantized unit drifts as its compute dtype does: that dtype's policy judges it (the
    # dtype the reference stage computed it in, else the build's: simulated.simulated_dtype).
    # The dtype a quantized build computes in: its simulation's and its quantization spread's.
    build = (simulated_dtype(source_dir, TORCH_DTYPES[build_dtype] if build_dtype else None)
             if simulated or precision in PROXIES else None)
    sim_dtype = (reference_outcome.dtype if given and reference_outcome is not None else build) if simulated else None
    policy = policy_for(sim_dtype or precision, **overrides)
    check_prompt_count(prompts, policy, spec.small_sample, precision)
    client = ChatClient(base_url, model_name, max_tokens=spec.max_new_tokens)
    _probe(client, cases, server_alive, progress)
    ref_dtype, reference_why = (sim_dtype, simulated_why(precision)) if sim_dtype else spec.reference_for(precision)
    if simulated:
        if reference_outcome is None or reference_outcome.simulated is None:  # else from the reference stage
            reference, reference_outcome = simulated_reference(
                source_dir, cases, precision, max_new_tokens=spec.max_new_tokens, store=store,
                device=reference_device, weights_digest=weights_digest, checkpoint=checkpoint, dtype=sim_dtype,
                progress=progress, trust=trust, original=original_dir)
        reference_dir = Path(reference_outcome.model_dir)
        reference_why = f"{reference_outcome.simulated_why or reference_why}: {reference_outcome.simulated}"
    if reference is None or reference_outcome is None:
        reference, reference_outcome = load_or_compute_reference(
            reference_dir, cases, dtype=ref_dtype, max_new_tokens=spec.max_new_tokens, store=store,
            weights_digest=weights_digest, progress=progress, device=reference_device, trust=trust)
    refs = reference.by_id
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(source_dir)
    t_ask = time.monotonic()
    answers = ask_all(client, cases, concurrency=spec.concurrency, progress=progress, server_alive=server_alive)
    progress(f"smoke: {len(cases)} prompts answered in {time.monotonic() - t_ask:.1f} s "
             f"({spec.concurrency} at a time)")
    evidence: list[CaseEvidence] = []
    served_answers: list[ReferenceAnswer] = []
    served_logprobs: dict[str, list[TokenLogprob] | None] = {}
    for case, answer in zip(cases, answers, strict=True):
        served_logprobs[case.id] = answer.logprobs
        served_answers.append(served_as_reference(case.id, answer, tok))
        evidence.append(_evidence(case, answer, refs[case.id], tok))
    logprobs = compare_logprobs(served_logprobs, refs, refused=client.logprobs_refused)
    progress(f"smoke: log-probs: {logprobs.detail}")
    progress(f"smoke: scoring the {len(cases)} reference answers under the served model (teacher forcing)")
    scores = score_all(client, cases, refs, tok, concurrency=spec.concurrency, progress=progress)
    teacher = compare_teacher_forced(scores, refs, unavailable=client.scoring_unavailable)
    progress(f"smoke: teacher-forced log-probs: {teacher.detail}")
    slice_of = {c.id: c.slice for c in cases}
    teacher_slices = {name: compare_teacher_forced({k: v for k, v in scores.items() if slice_of[k] == name}, refs)
                      for name in slice_names(evidence)} if teacher.available else {}
    # The spread loads the reference's weights again in wider arithmetic (float64 for fp32: twice its memory), so it
    # is measured only where like with like applies (`unit`, the spec's default; the pipeline's preflight budgets it).
    like = simulated or (spec.like_with_like(precision) and reference_outcome.sibling_unit is None
                               and reference_outcome.dtype == precision)
    if reference_outcome.sibling_unit is not None:
        reference_why = f"the gated higher-precision sibling unit {reference_outcome.sibling_unit} (smoke.reference)"
    spread = None
    proxy: tuple[str, ReferenceSet] | None = None  # the quantization's proxy: accuracy is judged against it
    served_logprobs_any = teacher.available or logprobs.mean_abs_diff is not None
    if like and served_logprobs_any:
        spread = load_or_compute_spread(reference_dir, cases, reference, store=store, device=reference_device,
                                        progress=progress, trust=trust)
    elif (not like and reference_outcome.sibling_unit is None and precision in PROXIES and build is not None
          and reference_outcome.dtype == "fp32" and spec.reference_precision in (UNIT_PRECISION, SIMULATED_REFERENCE)):
        # No reference at the unit's own precision: the fp32 source, with bounds derived from the quantization
        # spread (smoke/fallback.py) where the endpoint returned log-probs to judge by, else the family's table; task
        # accuracy against the source's weights rounded to the format, whose own cost is a rule apart.
        if served_logprobs_any:
            spread = load_or_compute_quantization_spread(
                source_dir, cases, reference, precision=precision, dtype=build,
                device=reference_device, progress=progress)
        rounded = proxy_model(source_dir, precision, progress=progress)
        proxy_ref, _ = load_or_compute_reference(rounded.folder, cases, dtype=build, max_new_tokens=spec.max_new_tokens,
                                                 store=store, progress=progress, device=reference_device,
                                                 trust=trust)
        proxy = (f"the {precision}-rounded source", proxy_ref)
        reference_why += ("; bounds derived from the quantization spread (" + spread.describe() + ")"
                          if spread is not None else
                          f"; the {policy.family.value} family's table bounds (no log-probs to measure a spread "
                          "against)") + (f"; task accuracy against {proxy[0]} ({PROXIES[precision]}, computed in "
                                         f"{build}), whose own cost against the source is the rule `quantization "
                                         "cost`")
    served_tok = tokenizer_digest(served_tokenizer_dir) if served_tokenizer_dir is not None else None
    ref_tok = tokenizer_digest(source_dir)
    verdict = judge(evidence, policy, max_new_tokens=spec.max_new_tokens, reference_tokenizer_digest=ref_tok,
                    served_tokenizer_digest=served_tok, logprob_mean_abs_diff=logprobs.mean_abs_diff,
                    logprob_tokens=logprobs.tokens_compared, small_sample=spec.small_sample,
                    min_full_agreement=spec.min_agreement, confidence=spec.confidence,
                    reference=reference_outcome.label(),
                    logprob_unavailable=(None if logprobs.mean_abs_diff is not None
                                         else logprobs.detail.removeprefix("not available: ")),
                    server_message=last_error_line(server_log) if any(a.server_error for a in answers) else None,
                    teacher_forced=teacher, spread=spread, reference_why=reference_why,
                    teacher_forced_slices={k: v for k, v in teacher_slices.items() if v.available},
                    logprobs_required=spec.logprob_checks == "required",
                    accuracy_against=None if proxy is None else (proxy[0], {
                        c.id: bool(c.is_correct(proxy[1].by_id[c.id].text)) for c in cases if c.expected is not None}))
    if simulated and prequantized is not None and original_dir is None:
        verdict = verdict.with_rule(GateRule(
            name=QUANTIZATION_COST, ok=True, kind="info",
            detail=f"not judged: the source is pre-quantized ({prequantized.label()}) and no unquantized original "
                   "was given to compare its task accuracy with"))
    elif simulated:
        verdict = verdict.with_rule(quantization_cost(
            original_dir or source_dir, cases, reference, precision=precision, dtype=reference_outcome.dtype,
            max_new_tokens=spec.max_new_tokens, store=store, device=reference_device,
            weights_digest=None if prequantized is not None else weights_digest, progress=progress, trust=trust,
            what=(f"the pre-quantized source ({prequantized.quant_algo}), dequantized," if prequantized is not None
                  else None)))
    elif proxy is not None:  # the format's own cost on this model, apart from the build's fidelity
        verdict = verdict.with_rule(quantization_cost(
            source_dir, cases, proxy[1], precision=precision, dtype="fp32", max_new_tokens=spec.max_new_tokens,
            store=store, device=reference_device, weights_digest=weights_digest, progress=progress, what=proxy[0],
            trust=trust))
    if speculative:
        verdict = verdict.with_rule(lossless_rule(base_url, model_name, spec, cases, answers, twin_body, progress,
                                                  server_alive))
    n = len(evidence)
    agree = sum(c.agree for c in evidence)
    graded_cases = [c for c in evidence if c.served_correct is not None and c.reference_correct is not None]
    k = policy.first_n_tokens
    return SmokeReport(
        n=n, agree=agree, agreement=agree / n, agreement_lower_bound=wilson_lower_bound(agree, n, spec.confidence),
        first_n_agreement=sum(c.first_n_agree(k) for c in evidence) / n,
        mean_prefix_share=round(sum(c.prefix_share for c in evidence) / n, 4),
        served_accuracy=(sum(bool(c.served_correct) for c in graded_cases) / len(graded_cases)
                         if graded_cases else None),
        reference_accuracy=(sum(bool(c.reference_correct) for c in graded_cases) / len(graded_cases)
                            if graded_cases else None),
        tokenizer_match=None if served_tok is None else served_tok == ref_tok, served_tokenizer_digest=served_tok,
        reference_tokenizer_digest=ref_tok, precision=precision, reference=reference_outcome, verdict=verdict,
        duration_s=round(time.monotonic() - t0, 2), logprobs=logprobs, teacher_forced=teacher, spread=spread,
        cases=[CaseResult(id=c.id, served=c.served, reference=c.reference, agree=c.agree,
                          first_n_agree=c.first_n_agree(k), matched_prefix=c.matched_prefix,
                          served_correct=c.served_correct, reference_correct=c.reference_correct,
                          finish_reason=c.served_finish, refused=c.refused, slice=c.slice) for c in evidence],
        slices=[SliceSummary.of(name, [c for c in evidence if c.slice == name], k, spec.confidence,
                                teacher_slices.get(name)) for name in slice_names(evidence)],
        served_answers=served_answers, inputs=list(trust.consumed) if trust is not None else [],
    )


def lossless_rule(base_url: str, model_name: str, spec: SmokeSpec, cases: list[PromptCase],
                  answers: list[ServedAnswer], twin_body: dict[str, Any] | None,  # JSON edge: request fields
                  progress: Callable[[str], None], server_alive: Callable[[], bool] | None) -> GateRule:
    """Every prompt again without speculation (the twin), greedy, the same max_new_tokens: the rule compares."""
    served = [(c.id, a.text, a.finish_reason) for c, a in zip(cases, answers, strict=True)]
    if twin_body is None:
        return rule_lossless(served, None, "the lane's server has no non-speculative switch")
    twin = ChatClient(base_url, model_name, max_tokens=spec.max_new_tokens, want_logprobs=False, extra=twin_body)
    t = time.monotonic()
    theirs = ask_all(twin, cases, concurrency=spec.concurrency, progress=progress, server_alive=server_alive)
    rule = rule_lossless(served, [(c.id, a.text, a.finish_reason) for c, a in zip(cases, theirs, strict=True)])
    progress(f"smoke: lossless speculation: {len(cases)} prompts asked without speculation in "
             f"{time.monotonic() - t:.1f} s: {rule.detail}")
    return rule


def twin_answers(base_url: str, model_name: str, spec: SmokeSpec, cases: list[PromptCase],
                 progress: Callable[[str], None],
                 server_alive: Callable[[], bool] | None = None) -> list[tuple[str, str, str | None]]:
    """(case id, text, finish reason) of every prompt asked of a non-speculative twin server (a lane whose own
    server has no request switch serves its twin apart: `Lane.twin_serve_command`), greedy, the same
    max_new_tokens as the unit was asked with."""
    twin = ChatClient(base_url, model_name, max_tokens=spec.max_new_tokens, want_logprobs=False)
    t = time.monotonic()
    theirs = ask_all(twin, cases, concurrency=spec.concurrency, progress=progress, server_alive=server_alive)
    progress(f"smoke: lossless speculation: {len(cases)} prompts asked of the twin server in "
             f"{time.monotonic() - t:.1f} s")
    return [(c.id, a.text, a.finish_reason) for c, a in zip(cases, theirs, strict=True)]


def with_twin_answers(report: SmokeReport, twin: list[tuple[str, str, str | None]]) -> SmokeReport:
    """The report with its rule `lossless speculation` judged again on `twin`'s answers (the one run_smoke wrote
    without a twin to ask, as not run, is replaced)."""
    served = [(c.id, c.served, c.finish_reason) for c in report.cases]
    rules = [r for r in report.verdict.rules if r.name != LOSSLESS]
    verdict = report.verdict.model_copy(update={"rules": rules}).with_rule(rule_lossless(served, twin))
    return report.model_copy(update={"verdict": verdict})


def quantization_cost(source_dir: Path, cases: list[PromptCase], simulated: ReferenceSet, *, precision: str,
                      dtype: str, max_new_tokens: int, store: Store | None, device: str,
                      weights_digest: str | None = None, progress: Callable[[str], None],
                      what: str | None = None, trust: InputTrust | None = None) -> GateRule:
    """The quantization's own cost, apart from the build's fidelity: the simulated model's task accuracy against
    the source's at the same dtype (paired non-inferiority at the margin of the precision's family); `what` names
    the simulated model (default: the simulated `precision` model)."""
    source, _ = load_or_compute_reference(source_dir, cases, dtype=dtype, max_new_tokens=max_new_tokens,
                                          store=store, weights_digest=weights_digest, progress=progress,
                                          device=device, trust=trust)
    graded = [c for c in cases if c.expected is not None]
    if not graded:
        return GateRule(name=QUANTIZATION_COST, ok=True, kind="info",
                        detail="not judged: the prompt set has no graded prompts")
    policy = policy_for(precision)
    test = paired_noninferiority([bool(c.is_correct(source.by_id[c.id].text)) for c in graded],
                                 [bool(c.is_correct(simulated.by_id[c.id].text)) for c in graded],
                                 margin=policy.accuracy_margin, alpha=policy.alpha)
    ok = test.non_inferior
    return GateRule(name=QUANTIZATION_COST, ok=ok, kind="statistical",
                    detail=(f"{what or f'the simulated {precision} model'} {test.unit_correct}/{test.n} vs the "
                            f"{dtype} source {test.reference_correct}/{test.n} (paired: {test.b} only the source "
                            f"right, {test.c} only the simulation right); non-inferiority at the {policy.family.value} "
                            f"margin {test.margin}: z {test.z:.2f}, p {test.p_value:.4f} {'<' if ok else '≥'} α "
                            f"{test.alpha}" + ("" if ok else ": the quantization itself loses task accuracy, "
                                               "whatever the build does")))


def score_all(client: ChatClient, cases: list[PromptCase], refs: dict[str, ReferenceAnswer], tok: Any, *,
              concurrency: int, progress: Callable[[str], None]) -> dict[str, list[ScoredToken]]:
    """Teacher forcing: each reference answer scored under the served model (ChatClient.score), `concurrency` at a
    time, after one probe request says whether the endpoint returns prompt log-probs at all."""
    todo = [(c, refs[c.id]) for c in cases if refs[c.id].token_ids and refs[c.id].token_logprobs]
    if not todo:
        return {}

    def one(item: tuple[PromptCase, ReferenceAnswer]) -> tuple[str, list[ScoredToken] | None]:
        case, ref = item
        prompt = tok.apply_chat_template(case.chat(), add_generation_prompt=True, return_dict=True)["input_ids"]
        return case.id, client.score(case.id, list(prompt), ref.token_ids)

    t = last = time.monotonic()
    first = one(todo[0])
    if first[1] is None:
        return {}
    scored = {first[0]: first[1]}
    with ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="score") as pool:
        for i, (cid, got) in enumerate(pool.map(one, todo[1:]), 2):
            if got is not None:
                scored[cid] = got
            now = time.monotonic()
            if now - last >= PROGRESS_EVERY_S and i < len(todo):
                last = now
                progress(f"smoke: {i}/{len(todo)} reference answers scored ({now - t:.0f} s, about "
                         f"{(now - t) / i * (len(todo) - i):.0f} s left)")
    progress(f"smoke: {len(scored)} reference answers scored under the served model in "
             f"{time.monotonic() - t:.1f} s")
    return scored


def check_prompt_count(prompts: PromptSet, policy: GatePolicy, small_sample: str, precision: str) -> None:
    """Refuse, before any endpoint or reference work, a prompt set with fewer graded prompts than the policy of
    this precision needs (its sample-size rule would reject every unit, healthy or not)."""
    graded = sum(c.expected is not None for c in prompts.cases)
    need = policy.min_samples
    if graded >= need or small_sample == "warn":
        return
    raise InputError(
        f"smoke.prompts: {prompts.path} has {graded} graded prompts (with an expected answer); the "
        f"{policy.family.value} policy of precision {precision} needs at least {need} (margin "
        f"{policy.accuracy_margin}, α {policy.alpha}, power {policy.power} at discordance "
        f"{policy.expected_discordance}): add {need - graded} graded prompts, or set smoke.small_sample: warn "
        "(--small-sample warn) to judge with a warning")


def _probe(client: ChatClient, cases: list[PromptCase], server_alive: Callable[[], bool] | None,
           progress: Callable[[str], None]) -> None:
    t = time.monotonic()
    try:
        answer = client.probe(cases[0])
    except ToolError as err:
        if server_alive is not None and exited_after_error(server_alive):
            raise ToolError(f"smoke: the server died before the smoke test: 0/{len(cases)} prompts answered, "
                            f"no answer for '{cases[0].id}'") from None
        raise ToolError(f"{str(err).splitlines()[0]} (0/{len(cases)} prompts answered; checked before any "
                        "reference work)") from None
    said = f"answered HTTP error {answer.refused[:120]}" if answer.refused else "answers"
    progress(f"smoke: endpoint {client.base_url} {said} ({time.monotonic() - t:.1f} s)")


def ask_all(client: ChatClient, cases: list[PromptCase], *, concurrency: int, progress: Callable[[str], None],
            server_alive: Callable[[], bool] | None = None) -> list[ServedAnswer]:
    """Every prompt, `concurrency` requests in flight (a batching server answers them together); answers in
    prompt order. The first prompt the endpoint cannot answer at all stops the run (ToolError, one line)."""
    answers: list[ServedAnswer | None] = [None] * len(cases)
    done = 0
    pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="smoke")
    try:
        futures = {pool.submit(client.answer, case): i for i, case in enumerate(cases)}
        for fut in as_completed(futures):
            i = futures[fut]
            try:
                answers[i] = fut.result()
            except ToolError as err:
                if server_alive is not None and exited_after_error(server_alive):
                    raise ToolError(f"smoke: the server died during the smoke test: {done}/{len(cases)} prompts "
                                    f"answered, no answer for '{cases[i].id}'") from None
                raise ToolError(f"{str(err).splitlines()[0]} ({done}/{len(cases)} prompts answered)") from None
            done += 1
            if done % 25 == 0:
                progress(f"smoke: {done}/{len(cases)} prompts answered")
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return [a for a in answers if a is not None]


def _evidence(case: PromptCase, answer: ServedAnswer, ref: ReferenceAnswer, tok: Any) -> CaseEvidence:
    graded = case.expected is not None
    # Both texts through the same tokenisation path (the reference tokenizer), so that a served answer
    # equal to the reference's text always agrees token for token.
    return CaseEvidence(
        id=case.id, served=answer.text, reference=ref.text,
        served_ids=tok(answer.text, add_special_tokens=False)["input_ids"],
        reference_ids=tok(ref.text, add_special_tokens=False)["input_ids"],
        served_correct=case.is_correct(answer.text) if graded and answer.refused is None else
        (False if graded else None),
        reference_correct=case.is_correct(ref.text), served_finish=answer.finish_reason,
        reference_finish=ref.finish, served_completion_tokens=answer.completion_tokens,
        served_prompt_tokens=answer.prompt_tokens, reference_prompt_tokens=ref.prompt_tokens,
        refused=answer.refused, server_error=answer.server_error, slice=case.slice,
    )


# An exception's last line in a Python server's log ("ValueError: Cannot use chat template …"), or an ERROR line.
_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*(?:Error|Exception)\b.*|.*\bERROR\b.*)$")


def last_error_line(log: Path | None, *, tail_bytes: int = 65536) -> str | None:
    """The last exception or ERROR line in the server's log (its own words for a 5xx), None without one."""
    if log is None or not log.is_file():
        return None
    with log.open("rb") as f:
        f.seek(max(0, log.stat().st_size - tail_bytes))
        lines = f.read().decode(errors="replace").splitlines()
    hits = [ln.strip() for ln in lines if _ERROR_LINE.match(ln.rstrip())]  # at column 0, not traceback code
    return hits[-1] if hits else None


def served_as_reference(case_id: str, answer: ServedAnswer, tok: Any) -> ReferenceAnswer:
    """One served answer in the reference's form (ids from the reference tokenizer, the server's token texts and
    log-probs where it returned them), so that a sibling's answers judge other units like a reference's."""
    lps = answer.logprobs or []
    return ReferenceAnswer(id=case_id, text=answer.text, token_ids=tok(answer.text, add_special_tokens=False)[
        "input_ids"], token_texts=[t.token for t in lps], token_logprobs=[t.logprob for t in lps],
        finish="stop" if answer.finish_reason == "stop" else "length", prompt_tokens=answer.prompt_tokens)


def write_report(report: SmokeReport, folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    js, md = folder / "smoke.json", folder / "smoke.md"
    js.write_text(json.dumps(report.model_dump(mode="json"), indent=2))
    md.write_text(report.markdown())
    return [js, md]
