"""Statistics of the gate: paired non-inferiority of task accuracy, its sample size, binomial bounds.

Task accuracy is compared on the same prompts (paired data): per prompt the reference is right or wrong and
the unit is right or wrong. Only the discordant prompts carry information about the difference:
  b = reference right, unit wrong;   c = reference wrong, unit right;   θ = p_ref − p_unit = (b − c)/n.
Non-inferiority with margin δ: H0 θ ≥ δ (the unit is worse by at least δ) against H1 θ < δ. The unit passes
when H0 is rejected at level α. The test is Tango's score test for paired proportions (Tango 1998, Stat Med
17:891; as written in Liu et al. 2002, Stat Med 21:231), which keeps its size for small n and for zero
discordant pairs, where a Wald test or a paired bootstrap degenerate (b = c = 0 gives a zero-width interval).

The minimum sample size follows Nam (1997, Biometrics 53:1422) for that test, given α, the power 1 − β at
θ = 0 (a unit exactly as accurate as the reference) and the expected discordance rate ψ = P(b) + P(c).
"""

from __future__ import annotations

import math
from statistics import NormalDist

from pydantic import BaseModel

_N = NormalDist()


def wilson_lower_bound(successes: int, n: int, confidence: float = 0.95) -> float:
    """Lower end of the two-sided Wilson score interval for a binomial proportion."""
    if n == 0:
        return 0.0
    z = _N.inv_cdf(1 - (1 - confidence) / 2)
    p = successes / n
    denom = 1 + z * z / n
    centre = p + z * z / (2 * n)
    margin = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - margin) / denom)


class NonInferiority(BaseModel):
    """The outcome of the paired test, with every number a verdict needs."""

    n: int
    reference_correct: int
    unit_correct: int
    b: int  # reference right, unit wrong
    c: int  # reference wrong, unit right
    margin: float
    alpha: float
    z: float
    p_value: float

    @property
    def difference(self) -> float:
        return (self.b - self.c) / self.n if self.n else 0.0

    @property
    def non_inferior(self) -> bool:
        return self.p_value < self.alpha


def tango_z(b: int, c: int, n: int, margin: float) -> float:
    """Tango's score statistic for H0: p_ref − p_unit = margin (negative: evidence the unit is not worse)."""
    if n <= 0:
        raise ValueError("n must be positive")
    a = 2 * n
    bb = (2 * n - b + c) * margin - b - c
    cc = -c * margin * (1 - margin)
    p21 = (-bb + math.sqrt(max(bb * bb - 4 * a * cc, 0.0))) / (2 * a)  # restricted MLE of P(c) under H0
    var = n * (2 * p21 + margin * (1 - margin))
    if var <= 0:
        return -math.inf if b - c - n * margin < 0 else math.inf
    return (b - c - n * margin) / math.sqrt(var)


def paired_noninferiority(ref_correct: list[bool], unit_correct: list[bool], *, margin: float,
                          alpha: float) -> NonInferiority:
    if len(ref_correct) != len(unit_correct):
        raise ValueError("paired lists differ in length")
    n = len(ref_correct)
    b = sum(r and not u for r, u in zip(ref_correct, unit_correct, strict=True))
    c = sum(u and not r for r, u in zip(ref_correct, unit_correct, strict=True))
    z = tango_z(b, c, n, margin) if n else math.inf
    return NonInferiority(n=n, reference_correct=sum(ref_correct), unit_correct=sum(unit_correct), b=b, c=c,
                          margin=margin, alpha=alpha, z=round(z, 4) if math.isfinite(z) else z,
                          p_value=_N.cdf(z) if math.isfinite(z) else (0.0 if z < 0 else 1.0))


def min_sample_size(*, margin: float, alpha: float, power: float, discordance: float) -> int:
    """Prompts needed so that a unit with θ = 0 and discordance rate ψ passes with probability `power`.

    Nam (1997): n = (z_{1−α}·√V0 + z_{power}·√V1)² / δ², V1 = ψ (variance of b − c per prompt at θ = 0),
    V0 = 2·p21₀ + δ(1 − δ) with p21₀ = max((ψ − δ)/2, 0) (the P(c) of the H0 boundary with the same ψ).
    """
    if not 0 < margin < 1 or not 0 < alpha < 0.5 or not 0.5 <= power < 1 or not 0 < discordance <= 1:
        raise ValueError("need 0<margin<1, 0<alpha<0.5, 0.5≤power<1, 0<discordance≤1")
    p21_0 = max((discordance - margin) / 2, 0.0)
    v0 = 2 * p21_0 + margin * (1 - margin)
    v1 = discordance
    n = (_N.inv_cdf(1 - alpha) * math.sqrt(v0) + _N.inv_cdf(power) * math.sqrt(v1)) ** 2 / margin**2
    return math.ceil(n)
