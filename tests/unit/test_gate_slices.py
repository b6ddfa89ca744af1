"""Named slices of a prompt set (PromptCase.slice): parsed, judged on their own by the gate, reported per slice."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from enginefoundry.errors import InputError
from enginefoundry.smoke import SliceSummary, SmokeReport, load_prompt_set
from enginefoundry.smoke.gate import CaseEvidence, JudgeInputs, first_n_count_needed, judge
from enginefoundry.smoke.policy import policy_for
from enginefoundry.smoke.prompts import PromptCase
from enginefoundry.smoke.reference import ReferenceOutcome, prompts_digest
from tests.support.paths import REPO

REF = "the bridge was built in eighteen ninety one by her"
WRONG = "it opened much later than that and nobody knows"  # differs from the first token on
VOCAB: dict[str, int] = {}  # one id per word: deterministic and collision-free (str hash() is salted per process)


def _case(i: int, served: str, ref: str = REF, *, slice_name: str | None = None) -> CaseEvidence:
    def ids(text: str) -> list[int]:
        return [VOCAB.setdefault(w, len(VOCAB)) for w in text.split()]
    return CaseEvidence(id=f"q{i}", served=served, reference=ref, served_ids=ids(served), reference_ids=ids(ref),
                        served_correct=True, reference_correct=True, served_finish="stop", reference_finish="stop",
                        served_prompt_tokens=30, reference_prompt_tokens=30, slice=slice_name)


def _judge(cases: list[CaseEvidence], precision: str = "bf16"):
    return judge(cases, policy_for(precision), JudgeInputs(max_new_tokens=16, reference_tokenizer_digest="t" * 64))


def _write(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ------------------------------------------------------------------------------------------------ parsing


def test_slices_are_parsed_in_order_of_first_appearance(tmp_path: Path):
    path = _write(tmp_path, [
        {"id": "a", "prompt": "x"},
        {"id": "b", "prompt": "x", "slice": "long-context"},
        {"id": "c", "prompt": "x", "slice": "code2"},
        {"id": "d", "prompt": "x", "slice": "long-context"},
    ])
    ps = load_prompt_set(path)
    assert [c.slice for c in ps.cases] == [None, "long-context", "code2", "long-context"]
    assert ps.slices == ["long-context", "code2"]


@pytest.mark.parametrize("name", ["Long-Context", "long context", "long_context", "-long", "long-", "9lives",
                                  "x" * 33, ""])
def test_a_slice_name_that_is_not_a_short_lowercase_name_is_refused_with_its_line(tmp_path: Path, name: str):
    path = _write(tmp_path, [{"id": "a", "prompt": "x"}, {"id": "b", "prompt": "x", "slice": name}])
    with pytest.raises(InputError, match=r"line 2: slice: slice .* is not a short lowercase name"):
        load_prompt_set(path)


def test_the_slice_does_not_move_the_reference_key():
    """The slice groups prompts for the gate; it is no input to the model. Sets without slices keep the key
    their published reference answers were stored under."""
    plain = PromptCase(id="a", prompt="q", expected="x", match="contains")
    sliced = plain.model_copy(update={"slice": "long-context"})
    assert sliced.slice == "long-context"
    assert "slice" not in plain.model_dump(mode="json")
    assert prompts_digest([sliced]) == prompts_digest([plain])


def test_the_gate_prompt_set_keeps_its_first_48_lines_and_has_a_graded_long_context_slice():
    ps = load_prompt_set(REPO / "benchmarks" / "gate_prompts.jsonl")
    head = ps.cases[:48]
    assert all(c.slice is None for c in head)  # CI's reduced run takes the first 48 lines
    long = [c for c in ps.cases if c.slice == "long-context"]
    assert ps.slices == ["long-context"]
    assert len(long) >= first_n_count_needed(policy_for("fp32").min_first_n_agreement)
    assert all(c.expected and c.match.value == "contains" for c in long)
    assert all(len(c.chat()[-1]["content"]) > 1500 for c in long)  # a few hundred tokens, not a short question


# ------------------------------------------------------------------------------------------------ judging


def test_a_set_without_slices_gets_exactly_the_rules_it_had():
    v = _judge([_case(i, REF) for i in range(60)])
    assert v.passed, v.reason
    assert [r.name for r in v.rules] == [
        "truncation", "tokenizer and chat template", "EOS handling", "degenerate answers", "sample size",
        "task accuracy", "first-4-token agreement", "matched prefix", "full-answer agreement"]
    first = next(r for r in v.rules if r.name == "first-4-token agreement")
    assert first.detail == "60/60, 95% lower bound 0.940 ≥ 0.6"


def test_a_slice_that_fails_fails_the_verdict_although_the_whole_set_passes():
    """64 short prompts agree; half of 16 long ones diverge from the first token (a rope breakage's pattern)."""
    short = [_case(i, REF) for i in range(64)]
    long = [_case(100 + i, WRONG if i % 2 else REF, slice_name="long-context") for i in range(16)]
    v = _judge(short + long)
    whole = next(r for r in v.rules if r.name == "first-4-token agreement")
    assert whole.ok and whole.detail.startswith("72/80")
    assert not v.passed
    assert [r.name for r in v.failed] == ["first-4-token agreement [long-context]"]
    failed = v.failed[0]
    assert failed.kind == "divergence"
    assert failed.detail == "slice 'long-context': 8/16, 95% lower bound 0.280 < 0.6"
    assert "first-4-token agreement [long-context]: slice 'long-context': 8/16" in v.reason
    prefix = next(r for r in v.rules if r.name == "matched prefix [long-context]")
    assert prefix.ok and "0.50 of the reference answer ≥ 0.4" in prefix.detail


def test_each_slice_is_judged_with_the_family_bounds():
    short = [_case(i, REF) for i in range(50)]
    long = [_case(100 + i, WRONG if i < 2 else REF, slice_name="long-context") for i in range(16)]
    assert _judge(short + long, "bf16").passed  # 14/16: lower bound 0.64 ≥ 0.6
    fp32 = _judge(short + long, "fp32")  # the full-precision family wants 0.8: 14/16 is not enough there
    assert [r.name for r in fp32.failed] == ["first-4-token agreement [long-context]"]
    names = [r.name for r in fp32.rules]
    assert names.index("matched prefix") < names.index("first-4-token agreement [long-context]")


def test_a_slice_too_small_to_reach_the_bound_says_how_many_it_needs():
    assert [first_n_count_needed(b) for b in (0.8, 0.6, 0.5, 0.4)] == [16, 6, 4, 3]
    v = _judge([_case(i, REF) for i in range(50)] + [_case(100 + i, REF, slice_name="tiny") for i in range(3)])
    assert [r.name for r in v.failed] == ["first-4-token agreement [tiny]"]
    assert "too few prompts: even 3/3 stays below the bound; it needs at least 6" in v.failed[0].detail


# ------------------------------------------------------------------------------------------------ report


def test_the_report_carries_per_slice_numbers_next_to_the_top_level_ones():
    short = [_case(i, REF) for i in range(64)]
    long = [_case(100 + i, WRONG if i % 2 else REF, slice_name="long-context") for i in range(16)]
    cases = short + long
    verdict = _judge(cases)
    sl = SliceSummary.of("long-context", long, 4, 0.95)
    assert (sl.n, sl.first_n_agree, sl.agree, sl.mean_prefix_share) == (16, 8, 8, 0.5)
    assert sl.first_n_lower_bound == pytest.approx(0.280, abs=1e-3)
    report = SmokeReport(
        n=len(cases), agree=72, agreement=0.9, agreement_lower_bound=0.8, first_n_agreement=0.9,
        mean_prefix_share=0.94, served_accuracy=1.0, reference_accuracy=1.0, tokenizer_match=None,
        served_tokenizer_digest=None, reference_tokenizer_digest="t" * 64, precision="bf16",
        reference=ReferenceOutcome(key="k" * 64, source="computed", dtype="fp32", model_dir="/m"),
        verdict=verdict, duration_s=1.0, cases=[], slices=[sl])
    summary = report.summary()
    assert summary["smoke_first_n_agreement"] == 0.9  # the whole set's numbers stay where they were
    assert summary["smoke_slice_long_context_n"] == 16
    assert summary["smoke_slice_long_context_first_n_agreement"] == 0.5
    assert summary["smoke_slice_long_context_prefix_share"] == 0.5
    # what outcomes.unit_metrics logs to MLflow: numbers under plain metric names (letters, digits, underscores)
    assert all(re.fullmatch(r"[a-z0-9_]+", k) and float(v) == float(v) for k, v in summary.items())
    dumped = report.model_dump(mode="json")
    assert {"first_n_agreement", "mean_prefix_share", "agree", "n", "served_accuracy"} <= set(dumped)
    assert dumped["slices"][0]["name"] == "long-context"
    md = report.markdown()
    assert "| slice long-context | 16 prompts; first-N 8/16 (0.500, lower bound 0.280)" in md
    assert "| first-4-token agreement [long-context] | divergence | NO |" in md
