"""Comparisons beyond noise: repeated benchmark trials of a candidate and its champion, each figure with its spread
and a confidence interval of the candidate/champion ratio, and gates that apply their thresholds to the interval.

The same unit measured 98.9, 355.1 and 170.3 output tok/s at c=4 within 25 minutes on one loaded host (issue 33):
one sample each cannot tell a toolchain from the load. Here a figure is a list of trials. Measured side by side
(`SideBySide`: the champion and the candidate served on one worker, benchmarked in alternating rounds, ABBA order),
the trials are paired by round and the interval is a paired t-interval on the log ratios (a load that drifts
across the comparison hits both units of a round alike). Otherwise (trials recorded by each build) it is Welch's
interval on the logs. A gate with bound b on a higher-is-better figure passes when the whole interval is ≥ b,
fails (a regression beyond noise) when it is all < b, and is inconclusive otherwise; lower-is-better alike. A
figure with fewer than two trials on a side has no interval. No Prefect here.
"""

from __future__ import annotations

import math
import statistics
from typing import Literal

from pydantic import BaseModel, Field

CONFIDENCE = 0.95
# Student's t, two-sided 95% (0.975 quantile), by degrees of freedom (any statistics table; e.g. NIST/SEMATECH
# e-Handbook of Statistical Methods, 1.3.6.7.2 "Critical Values of the Student's t Distribution").
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048,
         29: 2.045, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}

GateState = Literal["pass", "fail", "inconclusive"]
Role = Literal["champion", "candidate"]


def t975(df: float) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom (rounded down to a tabled one: wider)."""
    if df < 1:
        return math.inf
    tabled = [k for k in _T975 if k <= df]
    return _T975[max(tabled)] if df <= 120 else 1.960


class Trial(BaseModel):
    """One benchmark run of one unit at the operating point."""

    role: Role
    round: int = Field(ge=0, description="side by side: the round it belongs to (a pair); else its index")
    output_tokens_per_s: float | None = None
    ttft_ms_p95: float | None = None
    valid: bool = True


class SideBySide(BaseModel):
    """Champion and candidate measured in the same rollout, on one worker, in alternating rounds."""

    stem: str
    scenario: str
    concurrency: int
    champion_version: str
    candidate_version: str
    trials: list[Trial] = Field(default_factory=list)
    note: str = ""  # why it was not measured (then `trials` is empty), or what went wrong with a round

    def samples(self, role: str, figure: str) -> list[float]:
        return [float(v) for t in self.trials if t.role == role and t.valid
                for v in [getattr(t, figure)] if v is not None and v > 0]

    def pairs(self, figure: str) -> tuple[list[float], list[float]]:
        """(champion, candidate) values of the rounds where both were measured, in round order."""
        by_round: dict[int, dict[str, float]] = {}
        for t in self.trials:
            value = getattr(t, figure)
            if t.valid and value is not None and value > 0:
                by_round.setdefault(t.round, {})[t.role] = float(value)
        both = [r for r in sorted(by_round) if len(by_round[r]) == 2]
        return [by_round[r]["champion"] for r in both], [by_round[r]["candidate"] for r in both]


class Interval(BaseModel):
    """A figure of both units with its spread, and the candidate/champion ratio with its confidence interval."""

    mean_old: float
    mean_new: float
    sd_old: float
    sd_new: float
    n_old: int
    n_new: int
    ratio: float
    lo: float | None = None  # None: fewer than two trials on a side, no interval
    hi: float | None = None
    paired: bool = False

    def describe(self, fmt: str) -> str:
        def fig(mean: float, sd: float, n: int) -> str:
            return f"{format(mean, fmt)}" + (f" ± {format(sd, fmt)} (n={n})" if n > 1 else " (one sample)")

        how = "interleaved rounds" if self.paired else "trials"
        ci = (f"×{self.ratio:.2f}, 95% CI ×{self.lo:.2f}–×{self.hi:.2f} over {min(self.n_old, self.n_new)} {how}"
              if self.lo is not None and self.hi is not None else f"×{self.ratio:.2f}, no interval")
        new, old = fig(self.mean_new, self.sd_new, self.n_new), fig(self.mean_old, self.sd_old, self.n_old)
        return f"{new} vs champion {old} ({ci})"


def _sd(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def ratio_interval(old: list[float], new: list[float], *, paired: bool) -> Interval | None:
    """candidate/champion with its 95% interval (None: a side has no sample). `paired`: old[i] and new[i] were
    measured in the same round."""
    old, new = [v for v in old if v > 0], [v for v in new if v > 0]
    if not old or not new:
        return None
    base = Interval(mean_old=statistics.fmean(old), mean_new=statistics.fmean(new), sd_old=_sd(old), sd_new=_sd(new),
                    n_old=len(old), n_new=len(new), ratio=statistics.fmean(new) / statistics.fmean(old), paired=paired)
    if paired and len(old) == len(new) and len(old) >= 2:
        d = [math.log(n) - math.log(o) for o, n in zip(old, new, strict=True)]
        m, half = statistics.fmean(d), t975(len(d) - 1) * _sd(d) / math.sqrt(len(d))
        return base.model_copy(update={"ratio": math.exp(m), "lo": math.exp(m - half), "hi": math.exp(m + half)})
    if len(old) < 2 or len(new) < 2:
        return base.model_copy(update={"paired": False})
    lo_, ln_ = [math.log(v) for v in old], [math.log(v) for v in new]
    vo, vn = statistics.variance(lo_) / len(lo_), statistics.variance(ln_) / len(ln_)
    m = statistics.fmean(ln_) - statistics.fmean(lo_)
    se = math.sqrt(vo + vn)
    # Welch–Satterthwaite degrees of freedom.
    df = (vo + vn) ** 2 / ((vo**2 / (len(lo_) - 1)) + (vn**2 / (len(ln_) - 1))) if se > 0 else len(lo_) + len(ln_) - 2
    half = t975(df) * se
    return base.model_copy(update={"ratio": math.exp(m), "lo": math.exp(m - half), "hi": math.exp(m + half),
                                   "paired": False})


def gate_state(interval: Interval, bound: float, *, higher_is_better: bool) -> GateState:
    """The threshold applied to the interval: pass when all of it meets the bound, fail when none of it does,
    inconclusive when the bound lies inside it. Without an interval (one sample a side) the point ratio decides
    pass or fail, as a single comparison always did; the caller says it had no interval."""
    lo, hi = (interval.lo, interval.hi) if interval.lo is not None and interval.hi is not None else (
        interval.ratio, interval.ratio)
    if higher_is_better:
        return "pass" if lo >= bound else "fail" if hi < bound else "inconclusive"
    return "pass" if hi <= bound else "fail" if lo > bound else "inconclusive"


def gained(interval: Interval, *, higher_is_better: bool) -> bool:
    """Better beyond noise: the whole interval on the better side of 1 (never without an interval)."""
    if interval.lo is None or interval.hi is None:
        return False
    return interval.lo > 1.0 if higher_is_better else interval.hi < 1.0
