"""Token log-prob differences between the served unit and the reference, where the endpoint returns them.

Greedy text agreement says whether the argmax survived; log-probs say how far the distribution moved
(a quantized engine can keep every argmax and still be off by a lot). Only the agreeing prefix of an
answer is compared: after the first different token the two sides condition on different text.
"""

from __future__ import annotations

from pydantic import BaseModel

from enginefoundry.smoke.client import TokenLogprob
from enginefoundry.smoke.reference import ReferenceAnswer


class LogprobComparison(BaseModel):
    available: bool
    detail: str
    answers_with_logprobs: int = 0
    tokens_compared: int = 0
    mean_abs_diff: float | None = None  # mean |served − reference| log-prob per compared token
    max_abs_diff: float | None = None
    worst_case: str | None = None


def aligned_diffs(served: list[TokenLogprob], ref: ReferenceAnswer) -> list[float]:
    """|Δ log-prob| for each position while the served token and the reference token have the same text."""
    diffs = []
    for got, text, lp in zip(served, ref.token_texts, ref.token_logprobs, strict=False):
        if got.token != text:
            break
        diffs.append(abs(got.logprob - lp))
    return diffs


def compare_logprobs(
    served: dict[str, list[TokenLogprob] | None], refs: dict[str, ReferenceAnswer], *, refused: str | None = None,
) -> LogprobComparison:
    """Summarize every case; 'not available' (with why) when the endpoint returned no log-probs at all."""
    if refused is not None:
        return LogprobComparison(available=False, detail=f"not available: the endpoint refused log-probs ({refused})")
    with_lp = {cid: lps for cid, lps in served.items() if lps is not None}
    if not with_lp:
        return LogprobComparison(available=False, detail=(
            f"not available: the endpoint returned no log-probs in {len(served)} answers "
            "(it ignores `logprobs: true, top_logprobs: 1`)"))
    diffs: list[float] = []
    worst: tuple[float, str] = (-1.0, "")
    for cid, lps in with_lp.items():
        d = aligned_diffs(lps, refs[cid])
        diffs.extend(d)
        if d and max(d) > worst[0]:
            worst = (max(d), cid)
    if not diffs:
        return LogprobComparison(available=True, answers_with_logprobs=len(with_lp), detail=(
            "log-probs returned, but no served token matched the reference's first token text"))
    return LogprobComparison(
        available=True, answers_with_logprobs=len(with_lp), tokens_compared=len(diffs),
        mean_abs_diff=round(sum(diffs) / len(diffs), 6), max_abs_diff=round(max(diffs), 6), worst_case=worst[1],
        detail=f"mean |Δ log-prob| {sum(diffs) / len(diffs):.4f} over {len(diffs)} tokens "
               f"(max {max(diffs):.4f} in '{worst[1]}')",
    )
