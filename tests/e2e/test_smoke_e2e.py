"""The smoke gate against real servers: `transformers serve` on the tiny model's reference bundle.

One good bundle is built and served for the session (tests/e2e/conftest.py). Broken variants are copies
of it with one thing wrong (noisy weights, a permuted tokenizer), each served for real; a server killed
mid-run must end the smoke test with a one-line ToolError.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from enginefoundry.errors import ToolError
from enginefoundry.lanes.reference import BUNDLE_MODEL_DIR, ReferenceLane
from enginefoundry.model_server import Endpoint, free_port, is_alive, serving
from enginefoundry.smoke import SmokeInputs, SmokeReport, load_prompt_set, run_smoke, write_report
from enginefoundry.smoke.lm_eval import LmEvalConfig, lm_eval_version, run_lm_eval
from enginefoundry.spec import load_spec
from tests.support.paths import REPO, TINY_MODEL, TINY_PROMPTS

SPEC = load_spec(REPO / "configs" / "tiny-cpu.yaml")


def _smoke(endpoint: Endpoint, progress: Callable[[str], None] = lambda _: None) -> SmokeReport:
    return run_smoke(SmokeInputs(SPEC.smoke, load_prompt_set(TINY_PROMPTS), reference_dir=TINY_MODEL,
                     base_url=endpoint.base_url, model_name=endpoint.model_name,
                     served_tokenizer_dir=Path(endpoint.tokenizer_dir), progress=progress,
                     server_alive=lambda: is_alive(endpoint.pid)))


def _copy(bundle: Path, dest: Path) -> Path:
    shutil.copytree(bundle, dest)
    return dest


def test_correct_bundle_passes_the_gate(tiny_served: Endpoint, tmp_path: Path):
    report = _smoke(tiny_served)
    assert report.passed, report.verdict.reason
    assert (report.n, report.agree) == (108, 108)
    assert report.agreement_lower_bound == pytest.approx(0.9657, abs=1e-3)
    assert report.served_accuracy == report.reference_accuracy == 1.0
    assert report.tokenizer_match and report.first_n_agreement == 1.0 and report.mean_prefix_share == 1.0
    assert [r.name for r in report.verdict.rules] == [
        "truncation", "tokenizer and chat template", "EOS handling", "degenerate answers", "sample size",
        "task accuracy", "first-4-token agreement", "matched prefix", "log-prob distance", "teacher-forced log-probs",
        "full-answer agreement"]
    # Issue 24: the log-prob check that could not run is named in the verdict (an info rule), not left out.
    (lp,) = [r for r in report.verdict.rules if r.name == "log-prob distance"]
    assert lp.kind == "info" and lp.ok and lp.detail.startswith("not run: the endpoint returned no log-probs")
    # transformers serve 5.24 refuses a prompt of token ids ("prompt must be a string.") and ignores echo/logprobs:
    # teacher forcing cannot run there, and the verdict says so.
    (tf,) = [r for r in report.verdict.rules if r.name == "teacher-forced log-probs"]
    assert tf.kind == "info" and tf.ok and tf.detail.startswith("not run: the endpoint answered HTTP 400")
    assert report.verdict.policy is not None and report.verdict.policy.family.value == "full"
    assert report.verdict.reference.startswith(f"fp32 reference {report.reference.key[:12]} of {TINY_MODEL}")
    # transformers serve 5.24 accepts `logprobs`/`top_logprobs` and ignores them: recorded, not guessed.
    assert report.logprobs is not None and not report.logprobs.available
    assert report.logprobs.detail.startswith("not available: the endpoint returned no log-probs in 108 answers")
    js, md = write_report(report, tmp_path)
    assert json.loads(js.read_text())["verdict"]["passed"] is True
    # Issue 39: never "all rules passed" while checks did not run.
    assert report.verdict.reason == "passed; 2 checks not run: the server returns no log-probs"
    assert "| verdict | PASS: passed; 2 checks not run: the server returns no log-probs |" in md.read_text()
    assert report.tags()["enginefoundry.smoke_not_run"] == "2 checks not run: the server returns no log-probs"
    assert "| log-probs vs reference | not available" in md.read_text()


def test_corrupted_weights_are_rejected_with_numbers(tiny_bundle: Path, tmp_path: Path):
    import torch
    from safetensors.torch import load_file, save_file

    broken = _copy(tiny_bundle, tmp_path / "bundle")
    weights = broken / BUNDLE_MODEL_DIR / "model.safetensors"
    tensors = load_file(weights)
    gen = torch.Generator().manual_seed(0)
    for name, t in tensors.items():  # what a bad quantization does: every layer matrix a little off
        if t.dim() == 2 and "embed" not in name:
            tensors[name] = t + torch.randn(t.shape, generator=gen) * 0.8 * t.std()
    save_file(tensors, weights, metadata={"format": "pt"})
    with serving(ReferenceLane().serve_command(broken, "127.0.0.1", free_port()), tmp_path / "log") as ep:
        report = _smoke(ep)
    assert not report.passed
    failed = {r.name: r.detail for r in report.verdict.rules if not r.ok}
    assert "task accuracy" in failed, report.verdict.reason
    assert report.served_accuracy is not None and report.served_accuracy < 0.95
    served = round(report.served_accuracy * 108)
    assert failed["task accuracy"].startswith(f"{served}/108 vs reference 108/108 (paired: {108 - served} only")
    assert "≥ α 0.05" in failed["task accuracy"]
    assert report.tokenizer_match  # only the weights were touched
    assert not {"truncation", "tokenizer and chat template", "EOS handling"} & set(failed)


def test_wrong_tokenizer_is_caught(tiny_bundle: Path, tmp_path: Path):
    broken = _copy(tiny_bundle, tmp_path / "bundle")
    path = broken / BUNDLE_MODEL_DIR / "tokenizer.json"
    tok = json.loads(path.read_text())
    vocab: dict[str, int] = tok["model"]["vocab"]
    special = {a["id"] for a in tok["added_tokens"]}
    movable = sorted(i for i in vocab.values() if i not in special)
    shuffled = movable[:]
    random.Random(0).shuffle(shuffled)
    remap = dict(zip(movable, shuffled, strict=True))
    # A valid BPE tokenizer (merges name strings, not ids) whose ids do not match the model's embeddings.
    tok["model"]["vocab"] = {t: remap.get(i, i) for t, i in vocab.items()}
    path.write_text(json.dumps(tok, ensure_ascii=False))
    with serving(ReferenceLane().serve_command(broken, "127.0.0.1", free_port()), tmp_path / "log") as ep:
        report = _smoke(ep)
    assert not report.passed and not report.tokenizer_match
    (rule,) = [r for r in report.verdict.rules if r.name == "tokenizer and chat template"]
    assert not rule.ok
    assert rule.detail == (f"served tokenizer digest {report.served_tokenizer_digest[:12]} ≠ reference "
                           f"{report.reference_tokenizer_digest[:12]}")
    assert report.agree < 20  # the model reads shuffled ids: its answers are garbage too


def test_server_dying_mid_run_is_a_clear_error(tiny_bundle: Path, tmp_path: Path):
    with serving(ReferenceLane().serve_command(tiny_bundle, "127.0.0.1", free_port()), tmp_path / "log") as ep:

        def kill_at_25(message: str) -> None:
            if message.startswith("smoke: 25/"):
                os.killpg(ep.pid, signal.SIGKILL)  # the server and every process of its group

        with pytest.raises(ToolError) as caught:
            _smoke(ep, progress=kill_at_25)
    message = str(caught.value)
    # Prompts are asked `smoke.concurrency` at a time (issue 24): the answers counted and the prompt named are the
    # first in-flight request that found the server gone, at or after the 25th answer.
    found = re.fullmatch(r"smoke: the server died during the smoke test: (\d+)/108 prompts answered, "
                         r"no answer for '([\w-]+)'", message)
    assert found and 25 <= int(found[1]) < 108, message
    assert found[2] in {c.id for c in load_prompt_set(TINY_PROMPTS).cases}
    assert "Traceback" not in message and caught.value.__cause__ is None


@pytest.mark.skipif(lm_eval_version() is None, reason="lm-eval is not installed (pip install 'lm-eval[api]')")
def test_lm_eval_runs_offline_against_the_served_bundle(tiny_served: Endpoint, tmp_path: Path):
    # A local task: the tiny model's own questions as a generate_until task over a JSONL file.
    data = tmp_path / "tiny_arith.jsonl"
    rows = [json.loads(line) for line in TINY_PROMPTS.read_text().splitlines()[:12]]
    data.write_text("".join(json.dumps({"question": r["messages"][0]["content"], "answer": r["expected"]}) + "\n"
                            for r in rows))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "tiny_arith.yaml").write_text(
        "task: tiny_arith\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\noutput_type: generate_until\n"
        'doc_to_text: "{{question}}"\ndoc_to_target: "{{answer}}"\n'
        "generation_kwargs:\n  until: [\"\\n\"]\n  max_gen_toks: 6\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n"
        "metadata:\n  version: 1.0\n")
    cfg = LmEvalConfig(tasks=["tiny_arith"], include_path=str(tasks), limit=12)
    result = run_lm_eval(cfg, base_url=tiny_served.base_url, model=tiny_served.model_name,
                         tokenizer=tiny_served.tokenizer_dir,
                         out=tmp_path / "out", progress=lambda _: None)
    assert result.status == "ok", result.detail
    (score,) = result.scores
    assert (score.task, score.metric, score.value) == ("tiny_arith", "exact_match", 1.0)
    assert result.samples == {"tiny_arith": 12}
