"""The smoke stage as four steps, reference → ask → score → judge, over one input model (`SmokeInputs`).

`run_smoke` is the one entry for the pipeline's smoke stage and the `enginefoundry smoke` command. `plan` decides,
before any endpoint or reference work, what the unit is judged against and by which policy (refusing what cannot
be judged); each step then reads the inputs and the plan and hands its result to the next.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import JsonValue

from enginefoundry.errors import InputError
from enginefoundry.evidence.inputs import InputTrust
from enginefoundry.inputs.quantized_source import DEQUANTIZED, SourceQuantization, read_quantization
from enginefoundry.smoke.ask import (
    ask_all,
    case_evidence,
    check_prompt_count,
    last_error_line,
    lossless_rule,
    probe,
    score_all,
    served_as_reference,
    tokenizer_digest,
)
from enginefoundry.smoke.client import ChatClient, ServedAnswer, TokenLogprob
from enginefoundry.smoke.fallback import (
    PROXIES,
    bounded_by_cast,
    load_or_compute_quantization_spread,
    proxy_model,
)
from enginefoundry.smoke.gate import (
    CaseEvidence,
    GateRule,
    GateVerdict,
    JudgeInputs,
    judge,
    slice_names,
    wilson_lower_bound,
)
from enginefoundry.smoke.logprobs import (
    LogprobComparison,
    LogprobSpread,
    TeacherForced,
    compare_logprobs,
    compare_teacher_forced,
)
from enginefoundry.smoke.policy import GatePolicy, policy_for
from enginefoundry.smoke.prompts import PromptCase, PromptSet
from enginefoundry.smoke.reference import (
    ReferenceAnswer,
    ReferenceAsk,
    ReferenceOutcome,
    ReferenceSet,
    ReferenceSettings,
    load_or_compute_reference,
    load_or_compute_spread,
)
from enginefoundry.smoke.report import CaseResult, SliceSummary, SmokeReport
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
from enginefoundry.spec.checks import SIMULATED_REFERENCE, UNIT_PRECISION, no_like_reference, simulated_why
from enginefoundry.store.backends import Store

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class SmokeInputs:
    """Everything one smoke run reads: the spec's smoke section and prompts, the endpoint, the reference.

    `reference_dir`: the source checkpoint (its tokenizer is the reference's). `served_tokenizer_dir`: the served
    unit's tokenizer folder (None: not compared). `server_alive` lets a failure say that the server process died
    rather than "connection refused" (asked until the process has had time to exit: runner.exited_after_error).
    `server_log`: the server's log, whose last error line names the cause of HTTP 5xx answers in the verdict.

    `simulated` (the `smoke` command's --reference-precision simulated), or `spec.simulates(precision)` (the spec's
    smoke.reference_precision: simulated): a weight-only quantized unit is judged against the quantization tool's
    simulated model of the source (smoke/simulated.py; int4_awq calibrated on the prompt set) in the build's dtype,
    like with like: the compute dtype's policy, log-prob limits from the spread measured on the simulated model; and
    the quantization's own cost is a rule of its own (`quantization cost`: the simulated model's task accuracy
    against the source's at the same dtype, with the precision family's margin). `simulated` refuses a precision that
    is not simulated; both refuse a format whose simulation needs ModelOpt where it is missing (InputError, before
    the endpoint is asked). `checkpoint`: the unit's own quantized checkpoint (ModelOpt's unified export),
    dequantized as its reference instead of a simulation. `build_dtype` (bf16, fp16): the dtype a quantized build
    computes in (the engine lane's lane_options.dtype), else the source's 16-bit dtype, fp16 for an fp32 source
    (simulated.simulated_dtype).

    A pre-quantized source (`reference_dir` is a ModelOpt export: build.quantized_source) is judged against itself
    dequantized (`checkpoint`, or the reference stage's outcome); its `quantization cost` rule compares with the
    unquantized `original_dir` where one is given, and is not judged otherwise.

    `speculative`: the unit speculates, and the rule `lossless speculation` compares its greedy answers with those
    of its non-speculative twin: the same endpoint asked with `twin_body` (the lane's switch; None: there is none,
    and the rule fails as not run).
    """

    spec: SmokeSpec
    prompts: PromptSet
    reference_dir: Path
    base_url: str
    model_name: str
    served_tokenizer_dir: Path | None
    precision: str = "fp32"
    progress: Callable[[str], None] = print
    server_alive: Callable[[], bool] | None = None
    max_logprob_diff: float | None = None
    store: Store | None = None
    weights_digest: str | None = None
    reference: ReferenceSet | None = None
    reference_outcome: ReferenceOutcome | None = None
    server_log: Path | None = None
    reference_device: str = "cpu"
    simulated: bool = False
    checkpoint: Path | None = None
    trust: InputTrust | None = None
    build_dtype: str | None = None
    speculative: bool = False
    twin_body: Mapping[str, JsonValue] | None = None  # the twin's request fields (Lane.speculative_twin)
    # fields every request carries (lane trtllm's lora_request selecting a served adapter: Lane.adapter_request)
    request_body: Mapping[str, JsonValue] | None = None
    original_dir: Path | None = None

    @property
    def cases(self) -> list[PromptCase]:
        return self.prompts.cases

    @property
    def reference_ask(self) -> ReferenceAsk:
        """The reference answers asked for: these prompts, the spec's answer length, on the reference device."""
        return ReferenceAsk(self.cases, self.spec.max_new_tokens, self.reference_device)

    @property
    def reference_settings(self) -> ReferenceSettings:
        return ReferenceSettings(store=self.store, trust=self.trust, progress=self.progress)


@dataclass(frozen=True)
class SmokePlan:
    """What `plan` decided before any endpoint or reference work: the reference's kind and dtype, the policy."""

    source_dir: Path
    prequantized: SourceQuantization | None
    checkpoint: Path | None  # the quantized checkpoint dequantized as the reference (a pre-quantized source's own)
    simulated: bool  # like with like: judged against a simulation or a dequantized checkpoint
    given: bool  # the reference stage computed the simulated reference
    build: str | None  # the dtype a quantized build computes in (its simulation's, its quantization spread's)
    sim_dtype: str | None
    policy: GatePolicy
    ref_dtype: str
    reference_why: str


@dataclass(frozen=True)
class Judged:
    """The reference the unit was judged against (after the reference step)."""

    reference: ReferenceSet
    outcome: ReferenceOutcome
    reference_dir: Path
    reference_why: str


@dataclass(frozen=True)
class Scored:
    """The served answers against the reference's (after the ask and score steps)."""

    answers: list[ServedAnswer]
    evidence: list[CaseEvidence]
    served_answers: list[ReferenceAnswer]
    logprobs: LogprobComparison
    teacher: TeacherForced
    teacher_slices: dict[str, TeacherForced] = field(default_factory=dict)


@dataclass(frozen=True)
class Bounds:
    """The log-prob spread the bounds follow from, and the quantization's proxy accuracy is judged against."""

    spread: LogprobSpread | None
    proxy: tuple[str, ReferenceSet] | None
    reference_why: str


def run_smoke(inputs: SmokeInputs) -> SmokeReport:
    """Every prompt through the endpoint (`spec.concurrency` at a time), compared with the reference answers
    (computed once per key), then the gate.

    Before any reference work: the prompt set is checked against the policy's minimum (refused with the number
    needed, InputError) and the endpoint answers one token of the first prompt (ToolError when it does not).
    Raises ToolError (one line first: which prompt, how many answered) when the endpoint stops answering.
    """
    t0 = time.monotonic()
    smoke_plan = plan(inputs)
    client = ChatClient(inputs.base_url, inputs.model_name, max_tokens=inputs.spec.max_new_tokens,
                        extra=dict(inputs.request_body or {}))
    probe(client, inputs.cases, inputs.server_alive, inputs.progress)
    judged = reference_step(inputs, smoke_plan)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smoke_plan.source_dir)
    answers = ask_step(inputs, client)
    scored = score_step(inputs, client, answers, judged.reference, tok)
    bounds = bounds_step(inputs, smoke_plan, judged, scored)
    verdict = judge_step(inputs, smoke_plan, judged, scored, bounds)
    return report_of(inputs, smoke_plan, judged, scored, bounds, verdict, duration_s=time.monotonic() - t0)


def plan(inputs: SmokeInputs) -> SmokePlan:
    """Refuse what cannot be judged, and decide like with like (issue 39): a weight-only unit against its
    quantizer's simulation, a unit whose own quantized checkpoint is given against that checkpoint dequantized."""
    spec, precision, outcome = inputs.spec, inputs.precision, inputs.reference_outcome
    source_dir, checkpoint = inputs.reference_dir, inputs.checkpoint
    prequantized = read_quantization(source_dir)
    if prequantized is not None and not prequantized.dequantizable:
        raise InputError(f"smoke: {source_dir} is pre-quantized ({prequantized.label()}), and the gate has no "
                         f"reference for it (it dequantizes {', '.join(sorted(DEQUANTIZED))} exports without a "
                         "quantized KV cache); judge against the unquantized checkpoint instead")
    if prequantized is not None and checkpoint is None:
        checkpoint = source_dir  # a pre-quantized source is judged against itself, dequantized
    given = outcome is not None and outcome.simulated is not None  # by the reference stage
    sibling = outcome is not None and outcome.sibling_unit is not None
    simulated = (inputs.simulated or (spec.simulates(precision) and not sibling) or given
                 or checkpoint is not None)
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
    build = (simulated_dtype(source_dir, TORCH_DTYPES[inputs.build_dtype] if inputs.build_dtype else None)
             if simulated or precision in PROXIES else None)
    sim_dtype = (outcome.dtype if given and outcome is not None else build) if simulated else None
    overrides = spec.policy_overrides()
    if inputs.max_logprob_diff is not None:
        overrides["max_logprob_diff"] = inputs.max_logprob_diff
    policy = policy_for(sim_dtype or precision, **overrides)
    check_prompt_count(inputs.prompts, policy, spec.small_sample, precision)
    ref_dtype, reference_why = (sim_dtype, simulated_why(precision)) if sim_dtype else spec.reference_for(precision)
    return SmokePlan(source_dir=source_dir, prequantized=prequantized, checkpoint=checkpoint, simulated=simulated,
                     given=given, build=build, sim_dtype=sim_dtype, policy=policy, ref_dtype=ref_dtype,
                     reference_why=reference_why)


def reference_step(inputs: SmokeInputs, smoke_plan: SmokePlan) -> Judged:
    """The reference answers: the reference stage's, else the simulation's or the source's (by key, computed on a
    miss)."""
    reference, outcome = inputs.reference, inputs.reference_outcome
    reference_dir, reference_why = inputs.reference_dir, smoke_plan.reference_why
    if smoke_plan.simulated:
        if outcome is None or outcome.simulated is None:  # else from the reference stage
            reference, outcome = simulated_reference(
                smoke_plan.source_dir, inputs.precision, inputs.reference_ask, inputs.reference_settings,
                weights_digest=inputs.weights_digest, checkpoint=smoke_plan.checkpoint, dtype=smoke_plan.sim_dtype,
                original=inputs.original_dir)
        reference_dir = Path(outcome.model_dir)
        reference_why = f"{outcome.simulated_why or reference_why}: {outcome.simulated}"
    if reference is None or outcome is None:
        reference, outcome = load_or_compute_reference(
            reference_dir, inputs.reference_ask, inputs.reference_settings, dtype=smoke_plan.ref_dtype,
            weights_digest=inputs.weights_digest)
    if outcome.sibling_unit is not None:
        reference_why = f"the gated higher-precision sibling unit {outcome.sibling_unit} (smoke.reference)"
    return Judged(reference=reference, outcome=outcome, reference_dir=reference_dir, reference_why=reference_why)


def ask_step(inputs: SmokeInputs, client: ChatClient) -> list[ServedAnswer]:
    """Every prompt through the endpoint, `spec.concurrency` at a time."""
    t_ask = time.monotonic()
    answers = ask_all(client, inputs.cases, concurrency=inputs.spec.concurrency, progress=inputs.progress,
                      server_alive=inputs.server_alive)
    inputs.progress(f"smoke: {len(inputs.cases)} prompts answered in {time.monotonic() - t_ask:.1f} s "
                    f"({inputs.spec.concurrency} at a time)")
    return answers


def score_step(inputs: SmokeInputs, client: ChatClient, answers: list[ServedAnswer], reference: ReferenceSet,
               tok: PreTrainedTokenizerBase) -> Scored:
    """Each answer against the reference's (text, tokens, log-probs), then the reference's answers scored under the
    served model (teacher forcing), overall and per slice."""
    cases, refs, progress = inputs.cases, reference.by_id, inputs.progress
    evidence: list[CaseEvidence] = []
    served_answers: list[ReferenceAnswer] = []
    served_logprobs: dict[str, list[TokenLogprob] | None] = {}
    for case, answer in zip(cases, answers, strict=True):
        served_logprobs[case.id] = answer.logprobs
        served_answers.append(served_as_reference(case.id, answer, tok))
        evidence.append(case_evidence(case, answer, refs[case.id], tok))
    logprobs = compare_logprobs(served_logprobs, refs, refused=client.logprobs_refused)
    progress(f"smoke: log-probs: {logprobs.detail}")
    progress(f"smoke: scoring the {len(cases)} reference answers under the served model (teacher forcing)")
    scores = score_all(client, cases, refs, tok, concurrency=inputs.spec.concurrency, progress=progress)
    teacher = compare_teacher_forced(scores, refs, unavailable=client.scoring_unavailable)
    progress(f"smoke: teacher-forced log-probs: {teacher.detail}")
    slice_of = {c.id: c.slice for c in cases}
    teacher_slices = {name: compare_teacher_forced({k: v for k, v in scores.items() if slice_of[k] == name}, refs)
                      for name in slice_names(evidence)} if teacher.available else {}
    return Scored(answers=answers, evidence=evidence, served_answers=served_answers, logprobs=logprobs,
                  teacher=teacher, teacher_slices=teacher_slices)


def bounds_step(inputs: SmokeInputs, smoke_plan: SmokePlan, judged: Judged, scored: Scored) -> Bounds:
    """The spread the log-prob bounds follow from (like with like), or, with no reference at the unit's own
    precision, the quantization spread and the format-rounded proxy that task accuracy is judged against."""
    precision, outcome, spec = inputs.precision, judged.outcome, inputs.spec
    # The spread loads the reference's weights again in wider arithmetic (float64 for fp32: twice its memory), so it
    # is measured only where like with like applies (`unit`, the spec's default; the pipeline's preflight budgets it).
    like = smoke_plan.simulated or (spec.like_with_like(precision) and outcome.sibling_unit is None
                                    and outcome.dtype == precision)
    served_logprobs_any = scored.teacher.available or scored.logprobs.mean_abs_diff is not None
    if like and served_logprobs_any:
        spread = load_or_compute_spread(judged.reference_dir, inputs.cases, judged.reference, store=inputs.store,
                                        device=inputs.reference_device, progress=inputs.progress, trust=inputs.trust)
        return Bounds(spread=spread, proxy=None, reference_why=judged.reference_why)
    if not like and bounded_by_cast(precision, outcome) and served_logprobs_any:
        # A 16-bit unit against an explicit fp32 reference: bounds from the spread of the source cast to its dtype.
        cast = load_or_compute_quantization_spread(
            smoke_plan.source_dir, inputs.cases, judged.reference, precision=precision, dtype=precision,
            device=inputs.reference_device, progress=inputs.progress)
        if cast is not None:
            return Bounds(spread=cast, proxy=None, reference_why=(
                f"{judged.reference_why}; bounds derived from the spread of the source cast to {precision} "
                f"({cast.describe()})"))
    build = smoke_plan.build
    if (like or outcome.sibling_unit is not None or precision not in PROXIES or build is None
            or outcome.dtype != "fp32" or spec.reference_precision not in (UNIT_PRECISION, SIMULATED_REFERENCE)):
        return Bounds(spread=None, proxy=None, reference_why=judged.reference_why)
    # No reference at the unit's own precision: the fp32 source, with bounds derived from the quantization spread
    # (smoke/fallback.py) where the endpoint returned log-probs to judge by, else the family's table; task accuracy
    # against the source's weights rounded to the format, whose own cost is a rule apart.
    spread = None
    if served_logprobs_any:
        spread = load_or_compute_quantization_spread(
            smoke_plan.source_dir, inputs.cases, judged.reference, precision=precision, dtype=build,
            device=inputs.reference_device, progress=inputs.progress)
    rounded = proxy_model(smoke_plan.source_dir, precision, progress=inputs.progress)
    proxy_ref, _ = load_or_compute_reference(rounded.folder, inputs.reference_ask, inputs.reference_settings,
                                             dtype=build)
    proxy = (f"the {precision}-rounded source", proxy_ref)
    why = judged.reference_why + (
        "; bounds derived from the quantization spread (" + spread.describe() + ")" if spread is not None else
        f"; the {smoke_plan.policy.family.value} family's table bounds (no log-probs to measure a spread against)"
    ) + (f"; task accuracy against {proxy[0]} ({PROXIES[precision]}, computed in {build}), whose own cost against "
         "the source is the rule `quantization cost`")
    return Bounds(spread=spread, proxy=proxy, reference_why=why)


def judge_step(inputs: SmokeInputs, smoke_plan: SmokePlan, judged: Judged, scored: Scored,
               bounds: Bounds) -> GateVerdict:
    """The gate's verdict, then the rules judged apart: the quantization's own cost, lossless speculation."""
    spec, logprobs, proxy = inputs.spec, scored.logprobs, bounds.proxy
    served_tok = tokenizer_digest(inputs.served_tokenizer_dir) if inputs.served_tokenizer_dir is not None else None
    given = JudgeInputs(
        max_new_tokens=spec.max_new_tokens, reference_tokenizer_digest=tokenizer_digest(smoke_plan.source_dir),
        served_tokenizer_digest=served_tok, logprob_mean_abs_diff=logprobs.mean_abs_diff,
        logprob_tokens=logprobs.tokens_compared, small_sample=spec.small_sample,
        min_full_agreement=spec.min_agreement, confidence=spec.confidence, reference=judged.outcome.label(),
        logprob_unavailable=(None if logprobs.mean_abs_diff is not None
                             else logprobs.detail.removeprefix("not available: ")),
        server_message=(last_error_line(inputs.server_log) if any(a.server_error for a in scored.answers)
                        else None),
        teacher_forced=scored.teacher, spread=bounds.spread, reference_why=bounds.reference_why,
        teacher_forced_slices={k: v for k, v in scored.teacher_slices.items() if v.available},
        logprobs_required=spec.logprob_checks == "required",
        accuracy_against=None if proxy is None else (proxy[0], {
            c.id: bool(c.is_correct(proxy[1].by_id[c.id].text)) for c in inputs.cases if c.expected is not None}))
    verdict = judge(scored.evidence, smoke_plan.policy, given)
    cost = cost_rule(inputs, smoke_plan, judged, proxy)
    if cost is not None:
        verdict = verdict.with_rule(cost)
    if inputs.speculative:
        verdict = verdict.with_rule(lossless_rule(inputs.base_url, inputs.model_name, spec, inputs.cases,
                                                  scored.answers, inputs.twin_body, inputs.progress,
                                                  inputs.server_alive))
    return verdict


def cost_rule(inputs: SmokeInputs, smoke_plan: SmokePlan, judged: Judged,
              proxy: tuple[str, ReferenceSet] | None) -> GateRule | None:
    """The rule `quantization cost` where the unit has one: its simulation (or its pre-quantized source,
    dequantized) against the source, or the format-rounded proxy against it; None where neither applies."""
    prequantized = smoke_plan.prequantized
    costed = replace(inputs, weights_digest=None) if prequantized is not None else inputs
    if smoke_plan.simulated and prequantized is not None and inputs.original_dir is None:
        return GateRule(
            name=QUANTIZATION_COST, ok=True, kind="info",
            detail=f"not judged: the source is pre-quantized ({prequantized.label()}) and no unquantized original "
                   "was given to compare its task accuracy with")
    if smoke_plan.simulated:
        return quantization_cost(
            inputs.original_dir or smoke_plan.source_dir, judged.reference, costed, dtype=judged.outcome.dtype,
            what=(f"the pre-quantized source ({prequantized.quant_algo}), dequantized," if prequantized is not None
                  else None))
    if proxy is not None:  # the format's own cost on this model, apart from the build's fidelity
        return quantization_cost(smoke_plan.source_dir, proxy[1], inputs, dtype="fp32", what=proxy[0])
    return None


def report_of(inputs: SmokeInputs, smoke_plan: SmokePlan, judged: Judged, scored: Scored, bounds: Bounds,
              verdict: GateVerdict, *, duration_s: float) -> SmokeReport:
    """The report of one smoke run: the counts, the tokenizers compared, every case and slice, the verdict."""
    evidence, spec = scored.evidence, inputs.spec
    n = len(evidence)
    agree = sum(c.agree for c in evidence)
    graded = [c for c in evidence if c.served_correct is not None and c.reference_correct is not None]
    k = smoke_plan.policy.first_n_tokens
    served_tok = tokenizer_digest(inputs.served_tokenizer_dir) if inputs.served_tokenizer_dir is not None else None
    ref_tok = tokenizer_digest(smoke_plan.source_dir)
    return SmokeReport(
        n=n, agree=agree, agreement=agree / n, agreement_lower_bound=wilson_lower_bound(agree, n, spec.confidence),
        first_n_agreement=sum(c.first_n_agree(k) for c in evidence) / n,
        mean_prefix_share=round(sum(c.prefix_share for c in evidence) / n, 4),
        served_accuracy=sum(bool(c.served_correct) for c in graded) / len(graded) if graded else None,
        reference_accuracy=sum(bool(c.reference_correct) for c in graded) / len(graded) if graded else None,
        tokenizer_match=None if served_tok is None else served_tok == ref_tok, served_tokenizer_digest=served_tok,
        reference_tokenizer_digest=ref_tok, precision=inputs.precision, reference=judged.outcome, verdict=verdict,
        duration_s=round(duration_s, 2), logprobs=scored.logprobs, teacher_forced=scored.teacher,
        spread=bounds.spread,
        cases=[CaseResult(id=c.id, served=c.served, reference=c.reference, agree=c.agree,
                          first_n_agree=c.first_n_agree(k), matched_prefix=c.matched_prefix,
                          served_correct=c.served_correct, reference_correct=c.reference_correct,
                          finish_reason=c.served_finish, refused=c.refused, slice=c.slice) for c in evidence],
        slices=[SliceSummary.of(name, [c for c in evidence if c.slice == name], k, spec.confidence,
                                scored.teacher_slices.get(name)) for name in slice_names(evidence)],
        served_answers=scored.served_answers, inputs=list(inputs.trust.consumed) if inputs.trust is not None else [],
    )


def quantization_cost(source_dir: Path, simulated: ReferenceSet, inputs: SmokeInputs, *, dtype: str,
                      what: str | None = None) -> GateRule:
    """The quantization's own cost, apart from the build's fidelity: the simulated model's task accuracy against
    the source's at the same dtype (paired non-inferiority at the margin of the precision's family); `what` names
    the simulated model (default: the simulated `precision` model)."""
    cases, precision = inputs.cases, inputs.precision
    source, _ = load_or_compute_reference(source_dir, inputs.reference_ask, inputs.reference_settings, dtype=dtype,
                                          weights_digest=inputs.weights_digest)
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
