"""Prompt sets that fit real chat models (issue 39): the `word` matcher grades an answer in a sentence, `validate`
warns about a set whose matcher cannot (exact), and every shipped spec names a set that grades its model's answers."""

from __future__ import annotations

import json

import yaml

from tests.support.paths import CONFIGS


def test_the_word_matcher_grades_chat_answers_and_exact_sets_are_warned_about():
    from enginefoundry.smoke.prompts import PromptCase, PromptSet, prompt_set_warnings

    four = PromptCase(id="a", prompt="What is 2 + 2?", expected="4", match="word")
    assert four.is_correct("4") and four.is_correct("The answer is 4.") and four.is_correct("2 + 2 = 4")
    assert not four.is_correct("The answer is 14.")
    assert not four.is_correct("14") and not four.is_correct("40")
    city = PromptCase(id="b", prompt="Capital of Mexico?", expected="Mexico City", match="word")
    assert city.is_correct("It is mexico city.") and not city.is_correct("Mexico")
    exact = PromptCase(id="c", prompt="What is 2 + 2?", expected="4", match="exact")
    assert not exact.is_correct("The answer is 4.")
    (warning,) = prompt_set_warnings(PromptSet(path="p.jsonl", cases=[four, exact]))
    assert warning.startswith("smoke.prompts: 1 of 2 graded prompts of p.jsonl use match: exact (e.g. 'c')")
    assert prompt_set_warnings(PromptSet(path="p.jsonl", cases=[four, city])) == []


def test_every_shipped_spec_names_a_prompt_set_that_grades_chat_answers():
    """configs/prompts/tiny-chat.jsonl graded 0 of 108 of SmolLM2's answers right with exact matching, and the
    Llama 3.1 8B search spec named it. The tiny fixture model answers with the expected text alone: graded right
    by the word matcher too, as a chat model's sentence is."""
    from enginefoundry.smoke.prompts import load_prompt_set, prompt_set_warnings

    for config in sorted(CONFIGS.glob("*.yaml")):
        data = yaml.safe_load(config.read_text())
        if not isinstance(data, dict) or "smoke" not in data:
            continue
        prompts = load_prompt_set((config.parent / data["smoke"]["prompts"]).resolve())
        assert prompt_set_warnings(prompts) == [], config.name
    tiny = load_prompt_set(CONFIGS / "prompts" / "tiny-chat.jsonl")
    for case in tiny.cases:
        assert case.is_correct(case.expected or "") and case.is_correct(f"The answer is {case.expected}.")
    assert json.loads((CONFIGS / "prompts" / "tiny-chat.jsonl").read_text().splitlines()[0])["match"] == "word"
    search = yaml.safe_load((CONFIGS / "llama-3.1-8b-search.yaml").read_text())
    assert search["smoke"]["prompts"] == "prompts/general.jsonl"


def test_validate_warns_about_a_prompt_set_that_cannot_grade_free_form_answers(tmp_path, capsys):
    from enginefoundry.cli import main
    from tests.support.paths import TINY_MODEL, TINY_PROMPTS

    exact = tmp_path / "exact.jsonl"
    exact.write_text(TINY_PROMPTS.read_text().replace('"match": "word"', '"match": "exact"'))
    data = yaml.safe_load((CONFIGS / "tiny-cpu.yaml").read_text())
    data["variants"] = [{"precision": "fp32"}]
    data["smoke"]["prompts"], data["model"]["source"] = str(exact), str(TINY_MODEL)
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(data))
    assert main(["validate", str(tmp_path / "spec.yaml")]) == 0  # a warning, not a refusal
    out = " ".join(capsys.readouterr().out.split())
    assert "warning: smoke.prompts: 108 of 108 graded prompts of" in out and "use match: exact" in out
    assert main(["validate", str(tmp_path / "spec.yaml"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["warnings"][0].startswith("smoke.prompts: 108 of 108 graded prompts")
    data["smoke"]["prompts"] = str(TINY_PROMPTS)  # the shipped set: word matching, no warning
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(data))
    assert main(["validate", str(tmp_path / "spec.yaml"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["warnings"] == []
