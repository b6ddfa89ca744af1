"""The reference lane's scoring server (enginefoundry/smoke/serve.py) as a real process, judged by the real gate:
greedy answers with log-probs, prompt log-probs for teacher forcing, bounds from the measured spread (issue 24).
The tiny fixture model; a few seconds."""

from __future__ import annotations

import json
import re
import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from enginefoundry.lanes.base import Command, ServeCommand
from enginefoundry.model_server import free_port, serving
from enginefoundry.smoke import SmokeInputs, load_prompt_set, run_smoke
from enginefoundry.spec import SmokeSpec
from tests.support.paths import REPO, TINY_MODEL, TINY_PROMPTS


def _serve(model: Path, tmp: Path, *extra: str):
    port = free_port()
    argv = [sys.executable, "-m", "enginefoundry.smoke.serve", str(model), "--port", str(port), "--name", "tiny",
            *extra]
    cmd = ServeCommand(command=Command(argv=argv, env={"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)},
                                       description="enginefoundry scoring server"),
                       model_name="tiny", tokenizer_dir=str(model))
    return serving(cmd, tmp / f"server{'-'.join(extra)}.log", timeout_s=120)


def _smoke(ep, tmp: Path, precision: str = "fp32"):
    spec = SmokeSpec(prompts=str(TINY_PROMPTS), max_new_tokens=6, reference_precision="unit")
    return run_smoke(SmokeInputs(spec, load_prompt_set(TINY_PROMPTS), reference_dir=TINY_MODEL, base_url=ep.base_url,
                     model_name=ep.model_name, served_tokenizer_dir=None, precision=precision,
                     progress=lambda _: None, server_log=Path(ep.log_path)))


def test_healthy_unit_passes_every_logprob_check_and_a_scaled_final_norm_fails(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("EF_REFERENCE_CACHE", str(tmp_path / "refs"))
    with _serve(TINY_MODEL, tmp_path) as ep:
        report = _smoke(ep, tmp_path)
        req = urllib.request.Request(ep.base_url + "/v1/completions", data=json.dumps(
            {"model": "other", "prompt": [1, 2]}).encode(), headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as wrong_model:
            urllib.request.urlopen(req, timeout=30)
    assert wrong_model.value.code == 404
    assert report.passed, report.verdict.reason
    assert report.teacher_forced.available and report.teacher_forced.mean_abs_diff < 1e-3
    assert report.teacher_forced.top1_agreement == 1.0 and report.logprobs.available
    assert report.spread is not None and report.spread.precision == "fp32"
    assert (tmp_path / "refs" / f"{report.reference.key}.spread.v2.json").is_file()  # stored beside the reference
    judged = {r.name: r for r in report.verdict.rules}
    assert judged["teacher-forced log-prob distance"].ok and judged["teacher-forced top-1 agreement"].ok
    assert "like with like" in report.verdict.reference_why

    broken = tmp_path / "norm-scaled"
    shutil.copytree(TINY_MODEL, broken)
    from safetensors.torch import load_file, save_file

    tensors = load_file(broken / "model.safetensors")
    (key,) = [k for k in tensors if k.endswith("model.norm.weight")]
    tensors[key] = tensors[key] * 0.25  # flatter logits: the tiny model is very sure of its tokens
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    with _serve(broken, tmp_path) as ep:
        bad = _smoke(ep, tmp_path)
    assert not bad.passed
    assert "teacher-forced log-prob distance" in {r.name for r in bad.verdict.failed}, bad.verdict.reason


def _post(base: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(base + path, data=json.dumps({"model": "tiny", **body}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def _ask_all(base: str) -> list[dict]:
    """Requests of different lengths in flight together (a batch with padding), answered in any order."""
    from concurrent.futures import ThreadPoolExecutor

    words = ["What is 2 plus 3?", "What is 4 plus 1? Answer with the number alone, and nothing else at all.",
             "What is 1 plus 1?", "Say: 0 plus 5 is what? Think, then answer with one number only, please."]
    asks = [("/v1/chat/completions", {"messages": [{"role": "user", "content": w}], "max_tokens": 5,
                                      "logprobs": True, "top_logprobs": 2}) for w in words]
    asks += [("/v1/completions", {"prompt": list(range(3, 3 + n)), "max_tokens": 1, "echo": True, "logprobs": 1})
             for n in (4, 9, 17)]
    asks += [("/v1/completions", {"prompt": "What is", "max_tokens": 0})]  # nothing to generate
    with ThreadPoolExecutor(len(asks)) as pool:
        return list(pool.map(lambda a: _post(base, *a), asks))


def test_requests_answered_together_equal_the_same_requests_one_at_a_time(tmp_path: Path):
    with _serve(TINY_MODEL, tmp_path) as ep:
        together = _ask_all(ep.base_url)
    with _serve(TINY_MODEL, tmp_path, "--max-batch", "1") as ep:
        alone = _ask_all(ep.base_url)
    log = (tmp_path / "server.log").read_text()
    assert re.search(r"batch of [2-9] generation requests", log) and re.search(r"batch of [2-9] echo requests", log)
    assert "batch of 2" not in (tmp_path / "server--max-batch-1.log").read_text()

    def text(choice: dict) -> str:
        return choice["message"]["content"] if "message" in choice else choice["text"]

    for a, b in zip(together, alone, strict=True):
        ca, cb = a["choices"][0], b["choices"][0]
        assert text(ca) == text(cb)
        assert ca["finish_reason"] == cb["finish_reason"] and a["usage"] == b["usage"]
        if "message" in ca:
            la = [t["logprob"] for t in ca["logprobs"]["content"]]
            lb = [t["logprob"] for t in cb["logprobs"]["content"]]
            assert [t["token"] for t in ca["logprobs"]["content"]] == [t["token"] for t in cb["logprobs"]["content"]]
            assert len(ca["logprobs"]["content"][0]["top_logprobs"]) == 2
        elif ca["logprobs"] is None:
            assert ca["text"] == "" and a["usage"]["completion_tokens"] == 0
            continue
        else:
            la, lb = ca["logprobs"]["token_logprobs"][1:], cb["logprobs"]["token_logprobs"][1:]
            assert ca["logprobs"]["token_logprobs"][0] is None and len(la) == a["usage"]["prompt_tokens"]
        assert la == pytest.approx(lb, abs=1e-4)  # padding changes the arithmetic's order, not the numbers
