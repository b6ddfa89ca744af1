"""The gate: one verdict from per-prompt evidence, the family's policy (policy.py) and the statistics (stats.py).

Every rule carries its numbers; the verdict names the failed rules, the policy and the reference it was judged
against. Hard rules (tokenizer, chat template, EOS, degenerate, truncation) hold whatever the statistics say.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel

from enginefoundry.smoke.logprobs import LogprobSpread, TeacherForced
from enginefoundry.smoke.policy import GatePolicy
from enginefoundry.smoke.stats import NonInferiority, paired_noninferiority, wilson_lower_bound

__all__ = ["CaseEvidence", "GateRule", "GateVerdict", "judge", "wilson_lower_bound"]

# Text that only shows up in an answer when the server decodes special tokens or ignores end-of-sequence.
SPECIAL_MARKERS = ("<|im_end|>", "<|im_start|>", "<|endoftext|>", "<end_of_turn>", "<start_of_turn>", "</s>",
                   "<|eot_id|>", "<|end|>", "<eos>")


class GateRule(BaseModel):
    name: str
    ok: bool
    detail: str
    kind: Literal["hard", "statistical", "divergence", "info"] = "statistical"
    warning: bool = False  # passed, but the user should know (e.g. a prompt set smaller than the derived minimum)
    # The check could not run, and why in a few words ("the server returns no log-probs"): the verdict's closing
    # line says so, never "all rules passed" (issue 39).
    not_run: str | None = None


class GateVerdict(BaseModel):
    passed: bool
    rules: list[GateRule]
    reference: str = ""  # which reference the unit was judged against
    reference_why: str = ""  # why that one (like with like, or why no reference of the unit's precision)
    policy: GatePolicy | None = None

    def with_rule(self, rule: GateRule) -> GateVerdict:
        rules = [*self.rules, rule]
        return self.model_copy(update={"passed": all(r.ok for r in rules), "rules": rules})

    @property
    def failed(self) -> list[GateRule]:
        return [r for r in self.rules if not r.ok]

    @property
    def skipped(self) -> list[GateRule]:
        """The checks that could not run (and did not fail the verdict for it)."""
        return [r for r in self.rules if r.not_run is not None and r.ok]

    def not_run_summary(self) -> str:
        """'2 checks not run: the server returns no log-probs' (each rule named where their reasons differ); empty
        when every check ran."""
        skipped = self.skipped
        if not skipped:
            return ""
        whys = list(dict.fromkeys(r.not_run for r in skipped))
        what = (whys[0] if len(whys) == 1 else
                ", ".join(f"{r.name} ({r.not_run})" for r in skipped))
        return f"{len(skipped)} check{'s' if len(skipped) > 1 else ''} not run: {what}"

    @property
    def reason(self) -> str:
        """The failed rules with their numbers; for a pass, 'all rules passed' only when every check ran, else
        'passed; 2 checks not run: …'. Checks that did not run are named after the failed rules too."""
        failed = [f"{r.name}: {r.detail}" for r in self.failed]
        skipped = self.not_run_summary()
        if failed:
            return "; ".join(failed) + (f"; {skipped}" if skipped else "")
        return f"passed; {skipped}" if skipped else "all rules passed"


class CaseEvidence(BaseModel):
    """One prompt: what the endpoint and the reference did. Token ids come from the reference tokenizer for both."""

    id: str
    served: str
    reference: str
    served_ids: list[int]
    reference_ids: list[int]
    served_correct: bool | None = None
    reference_correct: bool | None = None
    served_finish: str | None = None  # "stop", "length", None (not reported)
    reference_finish: str = "length"
    served_completion_tokens: int | None = None
    served_prompt_tokens: int | None = None
    reference_prompt_tokens: int | None = None
    refused: str | None = None  # the endpoint's error for this prompt
    server_error: bool = False  # that error was the server's own failure (HTTP 5xx), not a refused request
    slice: str | None = None  # the prompt's slice (PromptCase.slice): judged on its own as well as in the whole set

    @property
    def agree(self) -> bool:
        return self.refused is None and self.served == self.reference

    def first_n_agree(self, n: int) -> bool:
        return self.refused is None and self.served_ids[:n] == self.reference_ids[:n]

    @property
    def matched_prefix(self) -> int:
        k = 0
        for a, b in zip(self.served_ids, self.reference_ids, strict=False):
            if a != b:
                break
            k += 1
        return k

    @property
    def prefix_share(self) -> float:
        return 1.0 if not self.reference_ids else self.matched_prefix / len(self.reference_ids)


def is_degenerate(ids: list[int], text: str) -> bool:
    """Empty, or mostly one repeated 3-gram of tokens (a loop), or one character over and over."""
    if not text.strip():
        return True
    if len(ids) >= 8:
        grams = [tuple(ids[i:i + 3]) for i in range(len(ids) - 2)]
        if len(set(grams)) / len(grams) < 0.5:
            return True
    stripped = text.replace(" ", "")
    return len(stripped) >= 12 and len(set(stripped)) <= 2


LOSSLESS = "lossless speculation"


def rule_lossless(served: list[tuple[str, str, str | None]], twin: list[tuple[str, str, str | None]] | None,
                  why_not: str = "") -> GateRule:
    """A speculative unit's greedy answers (case id, text, finish reason) against those of the same unit without
    speculation: verification keeps a correct speculative decoder's answers the target's own, so one differing
    answer means the draft changed what the model says. `twin` None: the check could not run, and the unit is
    not passed on trust (`why_not` says why)."""
    if twin is None:
        return GateRule(name=LOSSLESS, ok=False, kind="hard",
                        detail=f"could not compare with the non-speculative twin: {why_not}",
                        not_run=why_not or "no non-speculative twin")
    other = {case: (text, finish) for case, text, finish in twin}
    differ = [(case, text, other.get(case, ("", None))[0]) for case, text, finish in served
              if (text, finish) != other.get(case)]
    if not differ:
        return GateRule(name=LOSSLESS, ok=True, kind="hard",
                        detail=f"all {len(served)} greedy answers equal the non-speculative twin's")
    case, text, theirs = differ[0]
    return GateRule(name=LOSSLESS, ok=False, kind="hard",
                    detail=f"{len(differ)} of {len(served)} greedy answers differ from the non-speculative twin's "
                           f"(first: '{case}': {text[:60]!r} vs {theirs[:60]!r}): the speculative path changed the "
                           "model's answers")


def _rule_server(cases: list[CaseEvidence], server_message: str | None) -> GateRule | None:
    """Prompts the server failed on (HTTP 5xx): its own failure, named with its own words, not a truncation."""
    failed = [c for c in cases if c.server_error]
    if not failed:
        return None
    detail = (f"the server failed on {len(failed)}/{len(cases)} prompts (e.g. '{failed[0].id}': "
              f"{(failed[0].refused or '')[:200]})")
    if server_message:
        detail += f"; the server's log says: {server_message[:300]}"
    return GateRule(name="server errors", ok=False, kind="hard", detail=detail)


def _rule_answers(cases: list[CaseEvidence], max_new_tokens: int) -> GateRule:
    refused = [(c.id, c.refused) for c in cases if c.refused is not None and not c.server_error]
    cut = [c for c in cases if c.refused is None and c.served_finish == "length"
           and c.served_completion_tokens is not None and c.served_completion_tokens < max_new_tokens]
    ok = not refused and not cut
    parts = [f"{sum(c.refused is None for c in cases)}/{len(cases)} prompts answered"]
    if refused:
        case_id, reason = refused[0]
        parts.append(f"refused '{case_id}': {reason[:160]}")
    if cut:
        parts.append(f"{len(cut)} answers cut at length before {max_new_tokens} tokens "
                     f"(e.g. '{cut[0].id}' after {cut[0].served_completion_tokens})")
    if ok:
        parts.append("none cut short")
    return GateRule(name="truncation", ok=ok, kind="hard", detail="; ".join(parts))


def _rule_tokenizer(cases: list[CaseEvidence], served_digest: str | None, reference_digest: str) -> GateRule:
    problems, checked = [], []
    if served_digest is not None:
        checked.append("digest")
        if served_digest != reference_digest:
            problems.append(f"served tokenizer digest {served_digest[:12]} ≠ reference {reference_digest[:12]}")
    counted = [c for c in cases if c.served_prompt_tokens is not None and c.reference_prompt_tokens is not None]
    if counted:
        checked.append(f"prompt token counts on {len(counted)} prompts")
        off = [c for c in counted if c.served_prompt_tokens != c.reference_prompt_tokens]
        if off:
            problems.append(f"prompt token count differs on {len(off)}/{len(counted)} prompts (e.g. '{off[0].id}': "
                            f"served {off[0].served_prompt_tokens} vs reference {off[0].reference_prompt_tokens}; "
                            "another tokenizer or chat template)")
    if not checked:
        return GateRule(name="tokenizer and chat template", ok=True, kind="hard", warning=True,
                        detail="not checked: no served tokenizer folder and no usage.prompt_tokens from the endpoint")
    return GateRule(name="tokenizer and chat template", ok=not problems, kind="hard",
                    detail="; ".join(problems) if problems else f"equal to the reference ({', '.join(checked)})")


def _rule_eos(cases: list[CaseEvidence]) -> GateRule:
    leaks = [c for c in cases if c.refused is None and any(m in c.served and m not in c.reference
                                                           for m in SPECIAL_MARKERS)]
    stopped = [c for c in cases if c.reference_finish == "stop" and c.refused is None]
    ran_on = [c for c in stopped if c.served_finish == "length" and c.reference
              and c.served.startswith(c.reference) and len(c.served) > len(c.reference)]
    ok = not leaks and not (len(ran_on) >= 2 and len(ran_on) > 0.25 * len(stopped))
    detail = (f"special-token text in {len(leaks)} answers"
              + (f" (e.g. '{leaks[0].id}')" if leaks else "")
              + f"; {len(ran_on)}/{len(stopped)} answers ran past the reference's end of sequence")
    return GateRule(name="EOS handling", ok=ok, kind="hard", detail=detail)


def _rule_degenerate(cases: list[CaseEvidence], policy: GatePolicy) -> GateRule:
    bad = [c for c in cases if c.refused is None and is_degenerate(c.served_ids, c.served)
           and not is_degenerate(c.reference_ids, c.reference)]
    share = len(bad) / len(cases)
    ok = share <= policy.max_degenerate_share
    return GateRule(name="degenerate answers", ok=ok, kind="hard",
                    detail=f"{len(bad)}/{len(cases)} empty or repetitive answers where the reference's are not "
                           f"({share:.2f} {'≤' if ok else '>'} {policy.max_degenerate_share})"
                           + (f", e.g. '{bad[0].id}': {bad[0].served[:60]!r}" if bad else ""))


def _rule_sample_size(graded: int, policy: GatePolicy, small_sample: str) -> GateRule:
    need = policy.min_samples
    enough = graded >= need
    detail = (f"{graded} graded prompts {'≥' if enough else '<'} {need} needed for margin {policy.accuracy_margin}, "
              f"α {policy.alpha}, power {policy.power} at discordance {policy.expected_discordance}")
    if enough:
        return GateRule(name="sample size", ok=True, kind="statistical", detail=detail)
    if small_sample == "warn" and graded > 0:
        return GateRule(name="sample size", ok=True, kind="statistical", warning=True,
                        detail=detail + " (warning only: smoke.small_sample is 'warn')")
    return GateRule(name="sample size", ok=False, kind="statistical",
                    detail=detail + "; add prompts with an expected answer")


def _rule_accuracy(test: NonInferiority, against: str = "reference") -> GateRule:
    ok = test.non_inferior
    return GateRule(
        name="task accuracy", ok=ok, kind="statistical",
        detail=(f"{test.unit_correct}/{test.n} vs {against} {test.reference_correct}/{test.n} "
                f"(paired: {test.b} only {'the reference' if against == 'reference' else against} right, {test.c} "
                "only the unit right); non-inferiority "
                f"at margin {test.margin}: z {test.z:.2f}, p {test.p_value:.4f} {'<' if ok else '≥'} α {test.alpha}"))


def slice_names(cases: list[CaseEvidence]) -> list[str]:
    """The named slices among the cases, in the order they first appear."""
    return list(dict.fromkeys(c.slice for c in cases if c.slice is not None))


def first_n_count_needed(bound: float, confidence: float = 0.95) -> int:
    """The fewest prompts whose Wilson lower bound reaches `bound` when every one agrees (n / (n + z²) ≥ bound):
    a slice smaller than this fails its first-N rule whatever the build does."""
    n = 1
    while wilson_lower_bound(n, n, confidence) < bound and n < 10_000:
        n += 1
    return n


def text_floor(table: float, healthy_disagreement: float, spread: LogprobSpread | None) -> tuple[float, bool]:
    """A text rule's bound: the family's table value, or lower where the spread shows that a healthy computation of
    this reference does not reach it. A healthy unit leaves the reference no more often than computation b does
    (it rounds no more coarsely than the reference), so by the union bound it disagrees with the reference on at
    most `factor · d + margin` of the prompts, d being b's share (the top-1 rule's factor and margin); the floor
    is `1 − (factor · d + margin)`. Returns the bound and whether it is the derived one. On a stable reference
    (d near 0) the derived floor is near 1, which no slice of this size can show, and the table's bound holds."""
    if spread is None:
        return table, False
    derived = round(1 - (spread.factor * healthy_disagreement + spread.margin_top1), 4)
    return (derived, True) if derived < table else (table, False)


def _text_bound(table: float, healthy_disagreement: float, spread: LogprobSpread | None, family: str,
                says: str) -> tuple[float, str]:
    """text_floor's bound, and the words a rule's detail adds when it is the derived one (`says`: what the healthy
    computation did on these prompts), else none."""
    bound, derived = text_floor(table, healthy_disagreement, spread)
    if not derived or spread is None:
        return bound, ""
    return bound, (f" (1 − ({spread.factor:g} × {healthy_disagreement:.4f} + {spread.margin_top1:g}): a healthy "
                   f"computation of the reference {says}, measured at {spread.precision}; the {family} table's "
                   f"{table} is out of a healthy unit's reach)")


def _divergence_rules(cases: list[CaseEvidence], policy: GatePolicy, confidence: float,
                      slice_name: str | None = None, spread: LogprobSpread | None = None) -> list[GateRule]:
    """First-N-token agreement (Wilson lower bound) and matched prefix, on the whole set or on one named slice.
    Their bounds are the family's table values, lowered where the spread's healthy computation of the reference
    shows them out of a healthy unit's reach on these prompts (text_floor)."""
    n = len(cases)
    k = policy.first_n_tokens
    tag = f" [{slice_name}]" if slice_name else ""
    where = f"slice '{slice_name}': " if slice_name else ""
    healthy = spread.healthy_text([c.id for c in cases], k) if spread is not None else None
    on = spread if healthy is not None else None  # no per-prompt numbers for these prompts: the table
    family = policy.family.value
    bound, why = _text_bound(policy.min_first_n_agreement, healthy.first_n_disagreement if healthy else 0.0, on,
                             family, f"leaves its first {k} tokens on {healthy.first_n_misses}/{healthy.prompts} of "
                                     "these prompts" if healthy else "")
    first = sum(c.first_n_agree(k) for c in cases)
    lower = wilson_lower_bound(first, n, confidence)
    ok = lower >= bound
    detail = f"{where}{first}/{n}, {confidence:.0%} lower bound {lower:.3f} {'≥' if ok else '<'} {bound}{why}"
    need = first_n_count_needed(bound, confidence)
    if n < need:
        detail += f" (too few prompts: even {n}/{n} stays below the bound; it needs at least {need})"
    rules = [GateRule(name=f"first-{k}-token agreement{tag}", ok=ok, kind="divergence", detail=detail)]
    share = sum(c.prefix_share for c in cases) / n
    mean_tokens = sum(c.matched_prefix for c in cases) / n
    bound, why = _text_bound(policy.min_prefix_share, 1 - healthy.prefix_share if healthy else 0.0, on, family,
                             f"follows {healthy.prefix_share:.2f} of its answers" if healthy else "")
    ok = share >= bound
    rules.append(GateRule(name=f"matched prefix{tag}", ok=ok, kind="divergence",
                          detail=f"{where}mean matched prefix {mean_tokens:.1f} tokens, {share:.2f} of the reference "
                                 f"answer {'≥' if ok else '<'} {bound}{why}"))
    return rules


@dataclass(frozen=True)
class JudgeInputs:
    """What the gate judges besides the cases and the policy: the run's settings (max_new_tokens, small_sample,
    min_full_agreement, confidence, logprobs_required), the tokenizers' digests, the log-prob and teacher-forced
    measurements, the spread the bounds follow from, and which reference and why.

    `accuracy_against` (what, case id → correct): task accuracy judged against those answers instead of the
    reference's (a unit judged against fp32 without a like-with-like reference: its quantization's proxy, whose own
    cost is a rule apart)."""

    max_new_tokens: int
    reference_tokenizer_digest: str
    served_tokenizer_digest: str | None = None
    logprob_mean_abs_diff: float | None = None
    logprob_tokens: int = 0
    small_sample: Literal["refuse", "warn"] = "refuse"
    min_full_agreement: float | None = None
    confidence: float = 0.95
    reference: str = ""
    server_message: str | None = None
    logprob_unavailable: str | None = None
    teacher_forced: TeacherForced | None = None
    spread: LogprobSpread | None = None
    reference_why: str = ""
    teacher_forced_slices: dict[str, TeacherForced] | None = None
    logprobs_required: bool = False
    accuracy_against: tuple[str, dict[str, bool]] | None = None


def judge(cases: list[CaseEvidence], policy: GatePolicy, given: JudgeInputs) -> GateVerdict:
    """Every rule with its numbers. The divergence rules (first-N-token agreement, matched prefix) are judged on
    the whole set and again on each named slice (CaseEvidence.slice), with the same bounds; a failing slice fails
    the verdict under its own rule name, e.g. `first-4-token agreement [long-context]`. So are the teacher-forced
    rules (`teacher_forced_slices`), each slice against the spread of its own prompts (LogprobSpread.restricted)."""
    if not cases:
        raise ValueError("no cases to judge")
    server = _rule_server(cases, given.server_message)
    spread = given.spread
    rules = [
        *([server] if server is not None else []),
        _rule_answers(cases, given.max_new_tokens),
        _rule_tokenizer(cases, given.served_tokenizer_digest, given.reference_tokenizer_digest),
        _rule_eos(cases),
        _rule_degenerate(cases, policy),
    ]
    graded = [c for c in cases if c.served_correct is not None and c.reference_correct is not None]
    rules.append(_rule_sample_size(len(graded), policy, given.small_sample))
    if graded:
        against, correct = given.accuracy_against or ("reference",
                                                      {c.id: bool(c.reference_correct) for c in graded})
        rules.append(_rule_accuracy(paired_noninferiority(
            [correct[c.id] for c in graded], [bool(c.served_correct) for c in graded],
            margin=policy.accuracy_margin, alpha=policy.alpha), against))
    rules += _divergence_rules(cases, policy, given.confidence, spread=spread)
    for name in slice_names(cases):
        rules += _divergence_rules([c for c in cases if c.slice == name], policy, given.confidence,
                                   slice_name=name, spread=spread)
    rules += _logprob_rules(policy, given.logprob_mean_abs_diff, given.logprob_tokens, given.logprob_unavailable,
                            given.teacher_forced, spread, required=given.logprobs_required)
    for name, part in (given.teacher_forced_slices or {}).items():  # a fault of positions shows at a distance
        ids = {c.id for c in cases if c.slice == name}
        part_spread = spread.restricted(ids) if spread is not None else None
        rules += _teacher_rules(part, policy, part_spread if part_spread is not None else spread, slice_name=name)
    rules.append(_rule_full_agreement(cases, given.min_full_agreement, given.confidence))
    return GateVerdict(passed=all(r.ok for r in rules), rules=rules, reference=given.reference, policy=policy,
                       reference_why=given.reference_why)


def _rule_full_agreement(cases: list[CaseEvidence], min_full_agreement: float | None, confidence: float) -> GateRule:
    n = len(cases)
    agree = sum(c.agree for c in cases)
    if min_full_agreement is not None:
        lb = wilson_lower_bound(agree, n, confidence)
        ok = lb >= min_full_agreement
        return GateRule(name="full-answer agreement", ok=ok, kind="divergence",
                        detail=f"{agree}/{n}, {confidence:.0%} lower bound {lb:.3f} "
                               f"{'≥' if ok else '<'} {min_full_agreement}")
    return GateRule(name="full-answer agreement", ok=True, kind="info",
                    detail=f"{agree}/{n} (reported, not judged: late drift is expected below fp32)")


def logprob_bound(policy: GatePolicy, spread: LogprobSpread | None) -> tuple[float, str]:
    """The limit on mean |Δ log-prob| and where it comes from: the spread measured at the reference's precision
    when the unit is judged like with like, else the family's table value."""
    if spread is not None:
        return spread.max_mean_abs_diff, (f"{spread.factor:g} × spread {spread.mean_abs_diff:.4f} + "
                                          f"{spread.logprob_margin:g}, measured at {spread.precision}")
    return policy.max_logprob_diff, f"the {policy.family.value} family's table limit"


REQUIRED_WORDS = ("smoke.logprob_checks is required: a check that cannot run fails the verdict (serve the unit "
                  "with a server that returns log-probs, e.g. the scoring server python -m enginefoundry.smoke.serve, "
                  "or set smoke.logprob_checks: when-served)")


def not_run_reason(detail: str, *, prompt: bool = False, chat_missing: bool = False) -> str:
    """A log-prob check's reason for not running, in a few words, from its comparison's detail."""
    if "reference answers have no token log-probs" in detail or "no answer was scored" in detail:
        return "the reference has no log-probs"
    if prompt and not chat_missing:
        return "the server returns no prompt log-probs"
    return "the server returns no log-probs"


def _not_run(name: str, detail: str, short: str, required: bool) -> GateRule:
    """A check that could not run: named with why (info, the verdict's closing line says so), or, where the spec
    requires the log-prob checks, a failed hard rule."""
    if required:
        return GateRule(name=name, ok=False, kind="hard", detail=f"not run: {detail}; {REQUIRED_WORDS}")
    return GateRule(name=name, ok=True, kind="info", warning=True, not_run=short,
                    detail=f"not run: {detail}; judged on the other rules (docs/smoke-gate.md, 'Where log-probs "
                           "are unavailable')")


def _logprob_rules(policy: GatePolicy, chat_mean: float | None, chat_tokens: int, chat_unavailable: str | None,
                   teacher: TeacherForced | None, spread: LogprobSpread | None,
                   required: bool = False) -> list[GateRule]:
    """Log-prob distance on the agreeing prefix of the greedy answers (chat log-probs), and the teacher-forced
    checks (the reference's answers scored under the served model): each judged where the endpoint returned the
    log-probs, each named as not run (info, `not_run`) where it did not, or failed where they are `required`."""
    bound, why = logprob_bound(policy, spread)
    rules = []
    if chat_mean is not None:
        ok = chat_mean <= bound
        rules.append(GateRule(name="log-prob distance", ok=ok, kind="divergence",
                              detail=f"mean |Δ log-prob| {chat_mean:.4f} over {chat_tokens} tokens "
                                     f"{'≤' if ok else '>'} limit {bound} (the answers' agreeing prefix; {why})"))
    elif chat_unavailable is not None:  # the check that could not run is named, not silently left out
        rules.append(_not_run("log-prob distance", chat_unavailable, not_run_reason(chat_unavailable), required))
    if teacher is None:
        return rules
    if not teacher.available or teacher.mean_abs_diff is None:
        detail = teacher.detail.removeprefix("not available: ")
        rules.append(_not_run("teacher-forced log-probs", detail,
                              not_run_reason(detail, prompt=True, chat_missing=chat_mean is None), required))
        return rules
    return rules + _teacher_rules(teacher, policy, spread)


def _teacher_rules(teacher: TeacherForced, policy: GatePolicy, spread: LogprobSpread | None,
                   slice_name: str | None = None) -> list[GateRule]:
    """Teacher-forced log-prob distance and top-1 agreement, on the whole set or on one named slice (then against
    the spread of that slice's prompts, measured the same way)."""
    if teacher.mean_abs_diff is None:
        return []
    tag = f" [{slice_name}]" if slice_name else ""
    bound, why = logprob_bound(policy, spread)
    ok = teacher.mean_abs_diff <= bound
    rules = [GateRule(name=f"teacher-forced log-prob distance{tag}", ok=ok, kind="divergence",
                      detail=f"mean |Δ log-prob| {teacher.mean_abs_diff:.4f} over {teacher.tokens} reference "
                             f"tokens of {teacher.prompts} answers {'≤' if ok else '>'} limit {bound} ({why}); "
                             f"worst '{teacher.worst_case}'")]
    if teacher.top1_agreement is None:
        return rules
    miss = 1 - teacher.top1_agreement
    if spread is None:
        rules.append(GateRule(name=f"teacher-forced top-1 agreement{tag}", ok=True, kind="info",
                              detail=f"{teacher.top1_agreement:.4f} of reference tokens are the unit's argmax "
                                     "(reported, not judged: no spread measured at the unit's precision)"))
        return rules
    ok = miss <= spread.max_top1_disagreement
    rules.append(GateRule(name=f"teacher-forced top-1 agreement{tag}", ok=ok, kind="divergence",
                          detail=f"{miss:.4f} of {teacher.tokens} reference tokens are not the unit's argmax "
                                 f"{'≤' if ok else '>'} limit {spread.max_top1_disagreement} ({spread.factor:g} × "
                                 f"spread {spread.top1_disagreement:.4f} + {spread.top1_margin:g}, measured at "
                                 f"{spread.precision})"))
    return rules
