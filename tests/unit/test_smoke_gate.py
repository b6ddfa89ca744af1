"""The smoke gate's statistics and prompt-set parsing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from enginefoundry.errors import InputError
from enginefoundry.smoke import load_prompt_set, wilson_lower_bound
from enginefoundry.smoke.prompts import PromptCase
from tests.support.paths import TINY_PROMPTS


def test_wilson_lower_bound_known_values():
    assert wilson_lower_bound(20, 20) == pytest.approx(0.8389, abs=1e-3)  # 20/20 is weak evidence
    assert wilson_lower_bound(108, 108) == pytest.approx(0.9657, abs=1e-3)
    assert wilson_lower_bound(0, 10) == pytest.approx(0.0, abs=1e-12)
    assert wilson_lower_bound(50, 100) == pytest.approx(0.4038, abs=1e-3)


# The gate's rules themselves are tested in tests/unit/test_gate_policy.py.


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


# ------------------------------------------------------------------------------------- log-prob differences


def _ref(texts: list[str], lps: list[float]):
    from enginefoundry.smoke.reference import ReferenceAnswer

    return ReferenceAnswer(id="a", text="".join(texts), token_ids=list(range(len(texts))), token_texts=texts,
                           token_logprobs=lps)


def test_served_logprobs_in_the_openai_chat_shape_are_parsed():
    from enginefoundry.smoke.client import parse_logprobs

    block = {"content": [{"token": "4", "logprob": -0.0123, "bytes": [52],
                          "top_logprobs": [{"token": "4", "logprob": -0.0123, "bytes": [52]}]},
                         {"token": "<|im_end|>", "logprob": -0.5, "bytes": None, "top_logprobs": []}]}
    parsed = parse_logprobs(block)
    assert [(t.token, t.logprob) for t in parsed] == [("4", -0.0123), ("<|im_end|>", -0.5)]
    assert parse_logprobs(None) is None and parse_logprobs({"content": None}) is None
    assert parse_logprobs({"tokens": ["4"], "token_logprobs": [-0.1]}) is None  # legacy completions shape


def test_logprob_differences_cover_the_agreeing_prefix_only():
    from enginefoundry.smoke.client import TokenLogprob
    from enginefoundry.smoke.logprobs import compare_logprobs

    ref = _ref(["1", "2", "3"], [-0.10, -0.20, -0.30])
    served = [TokenLogprob(token="1", logprob=-0.11), TokenLogprob(token="2", logprob=-0.25),
              TokenLogprob(token="X", logprob=-9.0)]  # diverged: later positions condition on other text
    cmp = compare_logprobs({"a": served}, {"a": ref})
    assert cmp.available and cmp.tokens_compared == 2
    assert cmp.mean_abs_diff == pytest.approx(0.03) and cmp.max_abs_diff == pytest.approx(0.05)
    assert cmp.worst_case == "a" and "over 2 tokens" in cmp.detail


def test_logprobs_not_available_is_recorded_with_the_reason():
    from enginefoundry.smoke.logprobs import compare_logprobs

    ref = _ref(["1"], [-0.1])
    ignored = compare_logprobs({"a": None, "b": None}, {"a": ref, "b": ref})
    assert not ignored.available and ignored.mean_abs_diff is None
    assert ignored.detail.startswith("not available: the endpoint returned no log-probs in 2 answers")
    refused = compare_logprobs({"a": None}, {"a": ref}, refused="HTTP 422: logprobs is not supported")
    assert refused.detail == "not available: the endpoint refused log-probs (HTTP 422: logprobs is not supported)"


def test_reference_reports_token_logprobs_of_its_greedy_answers():
    from enginefoundry.smoke.reference import reference_answers
    from tests.support.paths import TINY_MODEL

    cases = load_prompt_set(TINY_PROMPTS).cases[:3]
    answers = reference_answers(TINY_MODEL, cases, dtype="fp32", max_new_tokens=6)
    for case, ans in zip(cases, answers, strict=True):
        assert ans.text == case.expected
        assert len(ans.token_texts) == len(ans.token_logprobs) == len(ans.token_ids) >= 1
        assert "".join(ans.token_texts).strip() == ans.text
        assert all(-20 < lp <= 0 for lp in ans.token_logprobs)  # a trained greedy answer: confident, not certain
        assert ans.finish == "stop" and ans.prompt_tokens == 21  # ended by EOS; the templated prompt's length


# ------------------------------------------------------------------------------------- lm-eval


def test_the_spec_lm_eval_section_is_the_runs_config_resolved_against_the_specs_folder(tmp_path: Path):
    # smoke_test (tasks/smoke.py) runs lm-eval from spec.smoke.lm_eval through this mapping: no section, no run
    from enginefoundry.smoke.lm_eval import spec_lm_eval
    from enginefoundry.spec.checks import LmEvalSpec

    assert spec_lm_eval(None, tmp_path) is None
    section = LmEvalSpec(tasks=["tiny_arith"], limit=12, include_path="tasks", datasets_cache="/data/hf-datasets")
    cfg = spec_lm_eval(section, tmp_path)
    assert cfg is not None and cfg.tasks == ["tiny_arith"] and cfg.limit == 12
    assert cfg.include_path == str((tmp_path / "tasks").resolve())  # relative: the spec's folder
    assert cfg.datasets_cache == "/data/hf-datasets"  # absolute: as given
    assert section.include_path == "tasks"  # the spec itself is left as written


def test_lm_eval_command_is_offline_chat_completions(tmp_path: Path):
    from enginefoundry.smoke.lm_eval import LmEvalConfig, lm_eval_argv, lm_eval_env

    cfg = LmEvalConfig(tasks=["gsm8k", "tiny_arith"], limit=50, num_fewshot=0, include_path="/data/tasks",
                       datasets_cache="/data/hf-datasets")
    argv = lm_eval_argv(cfg, base_url="http://127.0.0.1:8000/", model="/srv/bundle/model",
                        tokenizer="/srv/bundle/model", out=tmp_path)
    head = argv[:argv.index("--model")]  # the lm_eval script beside the interpreter, or python -m lm_eval
    assert head[-1].endswith("lm_eval")
    assert argv[len(head):] == [
        "--model", "local-chat-completions", "--model_args",
        "base_url=http://127.0.0.1:8000/v1/chat/completions,model=/srv/bundle/model,tokenizer=/srv/bundle/model,"
        "num_concurrent=1,max_retries=1,tokenized_requests=False",
        "--tasks", "gsm8k,tiny_arith", "--apply_chat_template", "--batch_size", "1", "--output_path", str(tmp_path),
        "--limit", "50", "--num_fewshot", "0", "--include_path", "/data/tasks"]
    env = lm_eval_env(cfg)
    assert env["HF_DATASETS_OFFLINE"] == env["HF_HUB_OFFLINE"] == "1"
    assert env["HF_DATASETS_CACHE"] == "/data/hf-datasets"
    with pytest.raises(InputError, match="contains ',' or '='"):
        lm_eval_argv(cfg, base_url="http://h:1", model="a,b", tokenizer="t", out=tmp_path)


def test_lm_eval_results_of_a_real_run_are_parsed():
    from enginefoundry.smoke.lm_eval import parse_lm_eval_results
    from tests.support.paths import REPO

    # lm-eval 0.4.13 against `transformers serve` on the tiny bundle (paths and host details removed).
    path = REPO / "tests" / "fixtures" / "lm-eval-0.4.13" / "results_tiny_arith.json"
    scores, samples = parse_lm_eval_results(path)
    assert [(s.task, s.metric, s.filter, s.value, s.stderr) for s in scores] == [
        ("tiny_arith", "exact_match", "none", 1.0, 0.0)]
    assert samples == {"tiny_arith": 12}


def test_lm_eval_filters_groups_and_na_stderr():
    from enginefoundry.smoke.lm_eval import parse_lm_eval_results

    data = {"results": {
        "gsm8k": {"alias": "gsm8k", "exact_match,strict-match": 0.42, "exact_match_stderr,strict-match": 0.0136,
                  "exact_match,flexible-extract": 0.44, "exact_match_stderr,flexible-extract": "N/A"},
        "arc_easy": {"alias": "arc_easy", "acc,none": 0.7, "acc_stderr,none": 0.01, "acc_norm,none": 0.65}},
        "n-samples": {"gsm8k": {"original": 1319, "effective": 100}}}
    scores, samples = parse_lm_eval_results(data)
    got = {(s.task, s.metric, s.filter): (s.value, s.stderr) for s in scores}
    assert got == {("arc_easy", "acc", "none"): (0.7, 0.01), ("arc_easy", "acc_norm", "none"): (0.65, None),
                   ("gsm8k", "exact_match", "strict-match"): (0.42, 0.0136),
                   ("gsm8k", "exact_match", "flexible-extract"): (0.44, None)}
    assert samples == {"gsm8k": 100}


def test_lm_eval_missing_is_a_clear_verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from enginefoundry.smoke import lm_eval

    monkeypatch.setattr(lm_eval, "lm_eval_version", lambda: None)
    result = lm_eval.run_lm_eval(lm_eval.LmEvalConfig(tasks=["gsm8k"]), base_url="http://127.0.0.1:9",
                                 model="m", tokenizer="t", out=tmp_path, progress=lambda _: None)
    assert result.status == "not installed" and "pip install 'lm-eval[api]'" in result.detail
