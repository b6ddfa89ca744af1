"""The statistical gate: a smoke verdict a platform team can trust.

Agreement is judged by the lower bound of its Wilson score interval, not the point estimate, so a
perfect score on 20 prompts does not clear a 0.95 bar (its 95% lower bound is 0.84).
"""

from __future__ import annotations

import math
from statistics import NormalDist

from pydantic import BaseModel


def wilson_lower_bound(successes: int, n: int, confidence: float = 0.95) -> float:
    """Lower end of the two-sided Wilson score interval for a binomial proportion."""
    if n == 0:
        return 0.0
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    p = successes / n
    denom = 1 + z * z / n
    centre = p + z * z / (2 * n)
    margin = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - margin) / denom)


class GateRule(BaseModel):
    name: str
    ok: bool
    detail: str


class GateVerdict(BaseModel):
    passed: bool
    rules: list[GateRule]

    def with_rule(self, rule: GateRule) -> GateVerdict:
        rules = [*self.rules, rule]
        return GateVerdict(passed=all(r.ok for r in rules), rules=rules)

    @property
    def reason(self) -> str:
        failed = [r.detail for r in self.rules if not r.ok]
        return "; ".join(failed) if failed else "all rules passed"


def judge(
    *, agree: int, n: int, min_agreement: float, confidence: float, min_samples: int,
    served_accuracy: float | None, reference_accuracy: float | None, max_accuracy_drop: float,
    logprob_mean_abs_diff: float | None = None, max_logprob_diff: float | None = None,
    logprob_tokens: int = 0,
) -> GateVerdict:
    """Every rule with its numbers. The log-prob rule applies only with a limit and served log-probs."""
    lower = wilson_lower_bound(agree, n, confidence)
    rules = [
        GateRule(name="sample size", ok=n >= min_samples,
                 detail=f"{n} prompts {'≥' if n >= min_samples else '<'} minimum {min_samples}"),
        GateRule(name="agreement", ok=lower >= min_agreement,
                 detail=f"agreement {agree}/{n}, {confidence:.0%} lower bound {lower:.3f} "
                        f"{'≥' if lower >= min_agreement else '<'} threshold {min_agreement}"),
    ]
    if served_accuracy is not None and reference_accuracy is not None:
        drop = reference_accuracy - served_accuracy
        rules.append(GateRule(name="accuracy drop", ok=drop <= max_accuracy_drop,
                              detail=f"accuracy {served_accuracy:.3f} vs reference {reference_accuracy:.3f} "
                                     f"(drop {drop:+.3f}, limit {max_accuracy_drop})"))
    if max_logprob_diff is not None and logprob_mean_abs_diff is not None:
        ok = logprob_mean_abs_diff <= max_logprob_diff
        rules.append(GateRule(name="log-prob difference", ok=ok,
                              detail=f"mean |Δ log-prob| {logprob_mean_abs_diff:.4f} over {logprob_tokens} tokens "
                                     f"{'≤' if ok else '>'} limit {max_logprob_diff}"))
    return GateVerdict(passed=all(r.ok for r in rules), rules=rules)
