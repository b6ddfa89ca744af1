"""The gate's statistics, its policy table and its rules, on hand-made evidence (no model, no server)."""

from __future__ import annotations

import math

import pytest

from enginefoundry.smoke.gate import CaseEvidence, JudgeInputs, judge
from enginefoundry.smoke.policy import DEFAULT_POLICIES, PrecisionFamily, policy_for, policy_table_markdown
from enginefoundry.smoke.stats import min_sample_size, paired_noninferiority, tango_z


def _binom_pmf(n: int, k: int, p: float) -> float:
    return math.comb(n, k) * p**k * (1 - p) ** (n - k)


def test_tango_test_keeps_its_size_at_the_margin():
    """Exact rejection probability at the H0 boundary (θ = δ), summed over every (b, c): close to α, not above
    it by much. Deterministic: enumerates the trinomial instead of simulating."""
    n, margin, alpha = 60, 0.10, 0.05
    for p21 in (0.0, 0.02, 0.05):
        p12 = p21 + margin
        size = 0.0
        for b in range(n + 1):
            pb = _binom_pmf(n, b, p12)
            for c in range(n - b + 1):
                pc = _binom_pmf(n - b, c, p21 / (1 - p12))
                if tango_z(b, c, n, margin) < -1.6448536:
                    size += pb * pc
        assert size < alpha + 0.02, (p21, size)


def test_zero_discordant_pairs_is_evidence_in_proportion_to_n():
    assert tango_z(0, 0, 40, 0.1) == pytest.approx(-2.108, abs=1e-3)
    assert paired_noninferiority([True] * 40, [True] * 40, margin=0.1, alpha=0.05).non_inferior
    # 24 prompts are too few to show non-inferiority at δ = 0.1, even with perfect agreement.
    assert not paired_noninferiority([True] * 24, [True] * 24, margin=0.1, alpha=0.05).non_inferior


def test_a_unit_much_worse_than_the_reference_is_not_non_inferior():
    ref = [True] * 40 + [False] * 24
    unit = [False] * 40 + [False] * 24
    t = paired_noninferiority(ref, unit, margin=0.1, alpha=0.05)
    assert (t.b, t.c, t.n) == (40, 0, 64) and not t.non_inferior and t.p_value > 0.99


def test_equal_accuracy_with_late_drift_is_non_inferior():
    # the bf16 unit: same accuracy, different prompts flipped both ways
    ref = [True] * 45 + [False] * 19
    unit = [True] * 44 + [False] + [True] + [False] * 18
    t = paired_noninferiority(ref, unit, margin=0.1, alpha=0.05)
    assert (t.b, t.c) == (1, 1) and t.non_inferior


def test_sample_size_follows_margin_power_and_discordance():
    assert min_sample_size(margin=0.1, alpha=0.05, power=0.8, discordance=0.05) == 47
    assert min_sample_size(margin=0.1, alpha=0.05, power=0.8, discordance=0.02) == 38
    assert min_sample_size(margin=0.05, alpha=0.05, power=0.8, discordance=0.05) > 100
    assert min_sample_size(margin=0.1, alpha=0.05, power=0.9, discordance=0.05) > 47
    with pytest.raises(ValueError):
        min_sample_size(margin=0.0, alpha=0.05, power=0.8, discordance=0.05)


def test_one_policy_table_for_four_families():
    assert set(DEFAULT_POLICIES) == set(PrecisionFamily)
    assert policy_for("bf16").family is PrecisionFamily.HALF and policy_for("fp16").family is PrecisionFamily.HALF
    assert policy_for("fp8").family is PrecisionFamily.EIGHT and policy_for("int4_awq").family is PrecisionFamily.FOUR
    assert policy_for("bf16", accuracy_margin=0.2, alpha=None).accuracy_margin == 0.2
    table = policy_table_markdown()
    assert table.count("\n") == 2 + len(DEFAULT_POLICIES)
    assert "| 16-bit | bf16, fp16 | 0.1 | 0.05 | 0.8 | 0.05 | 47 |" in table
    with pytest.raises(ValueError, match="unknown precision"):
        policy_for("fp64")


def _case(i: int, served: str, ref: str, *, correct: bool = True, ref_correct: bool = True, **kw) -> CaseEvidence:
    def ids(text: str) -> list[int]:
        return [hash(w) % 1000 for w in text.split()]
    return CaseEvidence(id=f"q{i}", served=served, reference=ref, served_ids=ids(served), reference_ids=ids(ref),
                        served_correct=correct, reference_correct=ref_correct, served_finish="stop",
                        reference_finish="stop", served_prompt_tokens=30, reference_prompt_tokens=30, **kw)


REF = "the capital of that country is the city you asked about"


def _judge(cases: list[CaseEvidence], precision: str = "bf16", **kw):
    return judge(cases, policy_for(precision), JudgeInputs(max_new_tokens=16, reference_tokenizer_digest="t" * 64,
                 reference="fp32 reference abc", **kw))


def test_late_drift_passes_the_16_bit_gate_and_names_its_reference():
    drift = REF.replace("about", "before")  # differs in the last word only
    cases = [_case(i, drift if i % 3 == 0 else REF, REF) for i in range(60)]
    v = _judge(cases)
    assert v.passed, v.reason
    assert v.reference == "fp32 reference abc" and v.policy.family is PrecisionFamily.HALF
    full = next(r for r in v.rules if r.name == "full-answer agreement")
    assert full.kind == "info" and full.detail.startswith("40/60")


def test_early_divergence_is_rejected_even_with_equal_accuracy():
    cases = [_case(i, "a completely different answer here", REF) for i in range(60)]
    v = _judge(cases)
    assert not v.passed
    assert {r.name for r in v.failed} == {"first-4-token agreement", "matched prefix"}
    assert "0/60, 95% lower bound 0.000 < 0.6" in v.reason


def test_too_few_graded_prompts_are_refused_or_warned():
    cases = [_case(i, REF, REF) for i in range(20)]
    refused = _judge(cases)
    assert not refused.passed and "20 graded prompts < 47 needed for margin 0.1" in refused.reason
    warned = _judge(cases, small_sample="warn")
    size = next(r for r in warned.rules if r.name == "sample size")
    assert size.ok and size.warning
    assert not warned.passed  # 20 prompts still cannot show non-inferiority
    assert [r.name for r in warned.failed] == ["task accuracy"]


def test_hard_rules_reject_whatever_the_statistics_say():
    good = [_case(i, REF, REF) for i in range(60)]
    template = [c.model_copy(update={"served_prompt_tokens": 26}) for c in good]
    assert [r.name for r in _judge(template).failed] == ["tokenizer and chat template"]
    assert "prompt token count differs on 60/60 prompts" in _judge(template).reason
    digest = _judge(good, served_tokenizer_digest="u" * 64)
    assert [r.name for r in digest.failed] == ["tokenizer and chat template"]
    leak = [c.model_copy(update={"served": c.served + "<|im_end|>"}) if c.id == "q1" else c for c in good]
    assert [r.name for r in _judge(leak).failed] == ["EOS handling"]
    ran_on = [c.model_copy(update={"served": REF + " and more", "served_finish": "length"}) for c in good]
    assert "EOS handling" in {r.name for r in _judge(ran_on).failed}
    loops = [c.model_copy(update={"served": "yes yes yes yes yes yes yes yes yes yes",
                                  "served_ids": [7] * 10}) if int(c.id[1:]) < 10 else c for c in good]
    assert "degenerate answers" in {r.name for r in _judge(loops).failed}
    refused = [c.model_copy(update={"refused": "HTTP 500: prompt does not fit", "served": "", "served_ids": []})
               if c.id == "q5" else c for c in good]
    v = _judge(refused)
    assert [r.name for r in v.failed] == ["truncation"] and "59/60 prompts answered; refused 'q5'" in v.reason
    cut = [c.model_copy(update={"served_finish": "length", "served_completion_tokens": 3}) for c in good]
    assert "3 answers" not in _judge(cut).reason and "60 answers cut at length before 16 tokens" in _judge(cut).reason


def test_first_n_agreement_compares_one_tokenisation_path():
    """A served answer equal to the reference's text agrees token for token: both sides are tokenised alike."""
    same = [_case(i, REF, REF) for i in range(50)]
    assert all(c.first_n_agree(4) and c.prefix_share == 1.0 for c in same)


def test_logprob_distance_is_judged_only_where_the_endpoint_returns_logprobs():
    good = [_case(i, REF, REF) for i in range(60)]
    assert "log-prob distance" not in {r.name for r in _judge(good).rules}
    far = _judge(good, logprob_mean_abs_diff=0.4, logprob_tokens=500)
    assert [r.name for r in far.failed] == ["log-prob distance"]
    assert "mean |Δ log-prob| 0.4000 over 500 tokens > limit 0.15" in far.reason
    assert _judge(good, precision="int4_awq", logprob_mean_abs_diff=0.4, logprob_tokens=500).passed


def test_the_documented_table_is_the_code_table():
    from tests.support.paths import REPO

    assert policy_table_markdown() in (REPO / "docs" / "smoke-gate.md").read_text()
