"""The smoke gate's statistics and prompt-set parsing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from enginefoundry.errors import InputError
from enginefoundry.smoke import load_prompt_set, wilson_lower_bound
from enginefoundry.smoke.gate import judge
from enginefoundry.smoke.prompts import PromptCase
from tests.conftest import TINY_PROMPTS


def test_wilson_lower_bound_known_values():
    assert wilson_lower_bound(20, 20) == pytest.approx(0.8389, abs=1e-3)  # 20/20 is weak evidence
    assert wilson_lower_bound(108, 108) == pytest.approx(0.9657, abs=1e-3)
    assert wilson_lower_bound(0, 10) == pytest.approx(0.0, abs=1e-12)
    assert wilson_lower_bound(50, 100) == pytest.approx(0.4038, abs=1e-3)


def _judge(agree, n, **kw):
    args = {"min_agreement": 0.95, "confidence": 0.95, "min_samples": 20, "served_accuracy": None,
            "reference_accuracy": None, "max_accuracy_drop": 0.02}
    args.update(kw)
    return judge(agree=agree, n=n, **args)


def test_twenty_perfect_samples_do_not_clear_a_095_bar():
    verdict = _judge(20, 20)
    assert not verdict.passed
    assert "lower bound 0.839 < threshold 0.95" in verdict.reason


def test_too_few_samples_cannot_pass_even_with_a_low_bar():
    verdict = _judge(5, 5, min_agreement=0.1)
    assert not verdict.passed and "5 prompts < minimum 20" in verdict.reason


def test_accuracy_drop_beyond_the_limit_fails_with_numbers():
    verdict = _judge(108, 108, served_accuracy=0.90, reference_accuracy=1.0)
    assert not verdict.passed and "drop +0.100, limit 0.02" in verdict.reason
    assert _judge(108, 108, served_accuracy=0.99, reference_accuracy=1.0).passed


def test_tiny_prompt_set_loads():
    ps = load_prompt_set(TINY_PROMPTS)
    assert len(ps.cases) == 108
    assert all(c.expected is not None for c in ps.cases)


def test_match_rules():
    assert PromptCase(id="a", prompt="q", expected="Paris", match="contains").is_correct("It is paris.")
    assert PromptCase(id="b", prompt="q", expected=r"^\d+$", match="regex").is_correct("42")
    assert not PromptCase(id="c", prompt="q", expected="7").is_correct("7.")
    assert PromptCase(id="d", prompt="q").is_correct("anything") is None


@pytest.mark.parametrize(("lines", "fragment"), [
    (["{not json"], "line 1: not JSON"),
    ([json.dumps({"id": "a"})], "line 1: give exactly one of 'prompt' or 'messages'"),
    ([json.dumps({"id": "a", "prompt": "x"}), json.dumps({"id": "a", "prompt": "y"})], "line 2: duplicate id"),
    ([json.dumps({"id": "a", "prompt": "x", "colour": 1})], "line 1: colour"),
    ([""], "has no prompts"),
])
def test_malformed_prompt_sets_name_the_line(tmp_path: Path, lines, fragment):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=fragment):
        load_prompt_set(path)
