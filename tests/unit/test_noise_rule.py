"""Comparisons beyond noise (issue 33 §2): intervals of the candidate/champion ratio from repeated trials, gates on
the interval (pass, fail, inconclusive), and the promotion verdict: a ×2 throughput gain promotes, the same unit
measured twice is "inconclusive: the difference is within noise" (not promoted, not held as a regression), a
regression beyond noise holds."""

from __future__ import annotations

import pytest

from enginefoundry.bench.noise import SideBySide, Trial, gate_state, ratio_interval, t975
from enginefoundry.records.promotion import NOISE, PromotionPolicy, compare
from enginefoundry.store.manifest import Manifest


def _manifest(weights: str = "w", trials: list[float] | None = None, tok_s: float = 100.0) -> Manifest:
    point = {"scenario": "short", "concurrency": 4, "valid": True, "output_tokens_per_s": tok_s, "ttft_ms_p95": 50.0}
    if trials is not None:
        point["trials"] = [{"output_tokens_per_s": t, "ttft_ms_p95": 50.0} for t in trials]
    return Manifest(key="k", key_components={"weights_digest": weights * 64, "tokenizer_digest": "t" * 64},
                    model="m", unit="fp32-tp1.chat.cpu", lane="reference", target={}, variant={}, profile={},
                    source={}, files=[], status="candidate", smoke={"smoke_agreement": 1.0},
                    benchmark={"points": [point]})


def _side_by_side(champion: list[float], candidate: list[float], ttft: float = 50.0) -> SideBySide:
    trials = [Trial(role=role, round=i, output_tokens_per_s=v, ttft_ms_p95=ttft)
              for i, (a, b) in enumerate(zip(champion, candidate, strict=True))
              for role, v in (("champion", a), ("candidate", b))]
    return SideBySide(stem="cpu", scenario="short", concurrency=4, champion_version="1", candidate_version="2",
                      trials=trials)


def test_student_t_and_the_paired_interval() -> None:
    assert t975(2) == 4.303 and t975(35) == 2.042 and t975(1000) == 1.96
    # A load that moves both units of each round alike: paired, the ratio is tight although each side spreads.
    iv = ratio_interval([100, 200, 300], [110, 220, 330], paired=True)
    assert iv is not None and iv.lo == pytest.approx(1.1) and iv.hi == pytest.approx(1.1)
    assert iv.sd_old == pytest.approx(100.0) and iv.n_new == 3
    # The same figures unpaired (Welch on the logs): far too wide to tell anything.
    wide = ratio_interval([100, 200, 300], [110, 220, 330], paired=False)
    assert wide is not None and wide.lo is not None and wide.hi is not None and wide.lo < 0.5 and wide.hi > 2
    one = ratio_interval([100], [90], paired=False)
    assert one is not None and one.lo is None and one.ratio == pytest.approx(0.9)
    assert ratio_interval([], [1.0], paired=False) is None


@pytest.mark.parametrize(("old", "new", "bound", "higher", "state"), [
    ([100, 101, 99], [150, 152, 149], 0.9, True, "pass"),
    ([100, 101, 99], [50, 51, 49], 0.9, True, "fail"),
    ([100, 140, 80], [90, 100, 95], 0.9, True, "inconclusive"),
    ([50, 51, 49], [40, 41, 39], 1.25, False, "pass"),
    ([50, 51, 49], [80, 81, 79], 1.25, False, "fail"),
])
def test_thresholds_apply_to_the_interval(old: list[float], new: list[float], bound: float, higher: bool,
                                          state: str) -> None:
    iv = ratio_interval(old, new, paired=True)
    assert iv is not None and gate_state(iv, bound, higher_is_better=higher) == state


def test_a_real_x2_gain_measured_side_by_side_promotes_a_rebuild() -> None:
    measured = _side_by_side([101.0, 96.0, 104.0], [205.0, 190.0, 212.0])
    verdict = compare(_manifest(), _manifest(), PromotionPolicy(), measured)
    assert verdict.promote and not verdict.inconclusive, verdict.reasons
    tok = next(g.detail for g in verdict.gates if "output tok/s" in g.name)
    assert "95% CI ×" in tok and "3 interleaved rounds" in tok and "better beyond noise" in tok
    assert "± " in tok  # each figure with its spread


def test_the_same_unit_twice_is_within_noise_not_promoted_nor_a_regression() -> None:
    measured = _side_by_side([101.0, 96.0, 104.0], [99.0, 103.0, 97.0])
    verdict = compare(_manifest(), _manifest(), PromotionPolicy(), measured)
    assert not verdict.promote and verdict.inconclusive
    assert verdict.reasons[0] == NOISE
    assert not any("regression beyond noise" in r for r in verdict.reasons)
    # With three rounds and ±4% noise, "not worse than ×0.90" cannot be shown either: a new checkpoint (other
    # weights) with these figures is inconclusive too; with ±1% it is shown, and the new checkpoint is promoted.
    assert compare(_manifest(weights="x"), _manifest(), PromotionPolicy(), measured).inconclusive
    steady = _side_by_side([100.0, 101.0, 99.0], [100.5, 99.5, 100.0])
    assert compare(_manifest(weights="x"), _manifest(), PromotionPolicy(), steady).promote
    # A rebuild of the same weights is promoted when not worse only when the policy says so.
    assert compare(_manifest(), _manifest(), PromotionPolicy(), steady).inconclusive
    assert compare(_manifest(), _manifest(), PromotionPolicy(rebuild_needs_gain=False), steady).promote


def test_a_noisy_comparison_straddling_the_bound_is_inconclusive() -> None:
    """The issue's figures: 98.9, 355.1 and 170.3 tok/s of one unit on a loaded host."""
    measured = _side_by_side([98.9, 355.1, 170.3], [340.0, 101.0, 180.0])
    verdict = compare(_manifest(weights="x"), _manifest(), PromotionPolicy(), measured)
    assert verdict.inconclusive and not verdict.promote
    assert verdict.reasons[0] == NOISE and any("needs ≥ ×0.90" in r for r in verdict.reasons)


def test_a_regression_beyond_noise_is_held_as_one() -> None:
    measured = _side_by_side([101.0, 96.0, 104.0], [51.0, 47.0, 50.0])
    verdict = compare(_manifest(weights="x"), _manifest(), PromotionPolicy(), measured)
    assert not verdict.promote and not verdict.inconclusive
    assert "a regression beyond noise" in verdict.reasons[0]


def test_recorded_trials_give_an_interval_where_no_side_by_side_ran() -> None:
    champion = _manifest(trials=[100.0, 104.0, 97.0, 101.0])
    doubled = _manifest(trials=[201.0, 198.0, 205.0, 199.0])
    verdict = compare(doubled, champion, PromotionPolicy())
    assert verdict.promote, verdict.reasons
    assert "4 trials" in next(g.detail for g in verdict.gates if "output tok/s" in g.name)
