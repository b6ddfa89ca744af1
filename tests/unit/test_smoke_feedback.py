"""Issue 24, speed and honest messages: prompts asked concurrently, the endpoint checked before any reference
work, a prompt set too small for a precision's policy refused up front with the number needed, a server's own
failure (HTTP 5xx) reported as such with its own words, progress while the reference is computed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from enginefoundry.errors import InputError, ToolError
from enginefoundry.model_server import free_port
from enginefoundry.planning.validate import _prompt_problems
from enginefoundry.smoke import SmokeInputs, check_prompt_count, last_error_line, load_prompt_set, run_smoke
from enginefoundry.smoke import reference as reference_mod
from enginefoundry.smoke.gate import CaseEvidence, JudgeInputs, judge
from enginefoundry.smoke.policy import policy_for
from enginefoundry.smoke.prompts import PromptSet
from enginefoundry.spec import SmokeSpec, load_spec
from tests.support.paths import CONFIGS, TINY_MODEL, TINY_PROMPTS


def test_dead_endpoint_is_found_before_any_reference_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("EF_REFERENCE_CACHE", str(tmp_path / "refs"))
    before = reference_mod.COMPUTE_COUNT["n"]
    spec = SmokeSpec(prompts=str(TINY_PROMPTS), max_new_tokens=6)
    with pytest.raises(ToolError) as caught:
        run_smoke(SmokeInputs(spec, load_prompt_set(TINY_PROMPTS), reference_dir=TINY_MODEL,
                  base_url=f"http://127.0.0.1:{free_port()}", model_name="m", served_tokenizer_dir=None,
                  precision="bf16", progress=lambda _: None))
    assert "(0/108 prompts answered; checked before any reference work)" in str(caught.value)
    assert reference_mod.COMPUTE_COUNT["n"] == before and not (tmp_path / "refs").exists()


def _small_set(tmp_path: Path) -> PromptSet:
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"{i} + 1?", "expected": str(i + 1),
                                        "match": "contains"}) + "\n" for i in range(12)))
    return load_prompt_set(path)


def test_a_prompt_set_too_small_for_the_policy_is_refused_with_the_number_needed(tmp_path: Path):
    prompts = _small_set(tmp_path)
    with pytest.raises(InputError) as caught:
        check_prompt_count(prompts, policy_for("bf16"), "refuse", "bf16")
    assert "has 12 graded prompts" in str(caught.value) and "16-bit policy of precision bf16 needs at least 47" \
        in str(caught.value) and "add 35 graded prompts" in str(caught.value)
    check_prompt_count(prompts, policy_for("bf16"), "warn", "bf16")  # judged with a warning on request


def test_run_smoke_refuses_a_small_set_before_the_endpoint_or_the_reference(tmp_path: Path):
    before = reference_mod.COMPUTE_COUNT["n"]
    with pytest.raises(InputError, match="needs at least 47"):
        run_smoke(SmokeInputs(SmokeSpec(prompts="p.jsonl"), _small_set(tmp_path), reference_dir=TINY_MODEL,
                  base_url=f"http://127.0.0.1:{free_port()}", model_name="m", served_tokenizer_dir=None,
                  precision="fp16", progress=lambda _: None))
    assert reference_mod.COMPUTE_COUNT["n"] == before


@pytest.mark.parametrize("config", ["llama-3.1-8b-multiarch.yaml", "llama-3-70b-tp2-a100.yaml"])
def test_shipped_general_prompt_set_is_large_enough_for_every_precision_it_is_used_with(config: str):
    spec = load_spec(CONFIGS / config)
    assert spec.smoke.prompts.endswith("general.jsonl") and spec.smoke.small_sample == "refuse"
    assert _prompt_problems(spec) == []


def test_a_spec_whose_prompts_are_too_few_for_a_variant_is_refused_by_validation(tmp_path: Path):
    spec = load_spec(CONFIGS / "llama-3.1-8b-multiarch.yaml")
    small = _small_set(tmp_path)
    spec = spec.model_copy(update={"smoke": spec.smoke.model_copy(update={"prompts": small.path})})
    problems = _prompt_problems(spec)
    assert [f for f, _ in problems] == ["smoke.prompts", "smoke.prompts"]  # bf16 and fp8, each with its number
    assert "needs at least 47" in problems[0][1] and "needs at least 54" in problems[1][1]


def _case(i: int, **kw: object) -> CaseEvidence:
    base = {"id": f"c{i}", "served": "x y", "reference": "x y", "served_ids": [1, 2], "reference_ids": [1, 2]}
    return CaseEvidence(**{**base, **kw})


def test_server_failure_is_its_own_rule_with_the_servers_words(tmp_path: Path):
    log = tmp_path / "server.log"
    log.write_text("INFO: started\nTraceback (most recent call last):\n  File x\nValueError: Cannot use chat "
                   "template functions because tokenizer.chat_template is not set\nINFO: 500\n")
    message = last_error_line(log)
    assert message == ("ValueError: Cannot use chat template functions because tokenizer.chat_template is not set")
    cases = [_case(i, served="", served_ids=[], refused="HTTP 500: Internal Server Error", server_error=True)
             for i in range(3)]
    verdict = judge(cases, policy_for("fp32"), JudgeInputs(max_new_tokens=8, reference_tokenizer_digest="d",
                    server_message=message, small_sample="warn"))
    (rule,) = [r for r in verdict.rules if r.name == "server errors"]
    assert not rule.ok and rule.kind == "hard"
    assert rule.detail == ("the server failed on 3/3 prompts (e.g. 'c0': HTTP 500: Internal Server Error); the "
                           "server's log says: " + message)
    (trunc,) = [r for r in verdict.rules if r.name == "truncation"]
    assert trunc.ok  # not reported as a truncation any more


def test_reference_computation_reports_progress():
    from enginefoundry.smoke.reference import reference_answers

    said: list[str] = []
    reference_answers(TINY_MODEL, load_prompt_set(TINY_PROMPTS).cases[:3], dtype="fp32", max_new_tokens=6,
                      progress=said.append)
    assert said and said[-1].startswith("smoke: reference 3/3 answers (")


def test_a_log_prob_check_that_could_not_run_is_named_in_the_verdict():
    cases = [_case(i) for i in range(3)]
    why = "the endpoint returned no log-probs in 3 answers (it ignores `logprobs: true, top_logprobs: 1`)"
    verdict = judge(cases, policy_for("fp32"), JudgeInputs(max_new_tokens=8, reference_tokenizer_digest="d",
                    small_sample="warn", logprob_unavailable=why))
    (rule,) = [r for r in verdict.rules if r.name == "log-prob distance"]
    assert rule.ok and rule.warning and rule.kind == "info" and rule.detail.startswith(f"not run: {why}; ")
