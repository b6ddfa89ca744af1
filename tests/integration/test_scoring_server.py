"""The reference lane's scoring server (enginefoundry/smoke/serve.py) as a real process, judged by the real gate:
greedy answers with log-probs, prompt log-probs for teacher forcing, bounds from the measured spread (issue 24).
The tiny fixture model; a few seconds."""

from __future__ import annotations

import json
import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from enginefoundry.lanes.base import Command, ServeCommand
from enginefoundry.model_server import free_port, serving
from enginefoundry.smoke import load_prompt_set, run_smoke
from enginefoundry.spec import SmokeSpec
from tests.support.paths import REPO, TINY_MODEL, TINY_PROMPTS


def _serve(model: Path, tmp: Path):
    port = free_port()
    argv = [sys.executable, "-m", "enginefoundry.smoke.serve", str(model), "--port", str(port), "--name", "tiny"]
    cmd = ServeCommand(command=Command(argv=argv, env={"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)},
                                       description="enginefoundry scoring server"),
                       model_name="tiny", tokenizer_dir=str(model))
    return serving(cmd, tmp / "server.log", timeout_s=120)


def _smoke(ep, tmp: Path, precision: str = "fp32"):
    spec = SmokeSpec(prompts=str(TINY_PROMPTS), max_new_tokens=6, reference_precision="unit")
    return run_smoke(spec, load_prompt_set(TINY_PROMPTS), reference_dir=TINY_MODEL, base_url=ep.base_url,
                     model_name=ep.model_name, served_tokenizer_dir=None, precision=precision,
                     progress=lambda _: None, server_log=Path(ep.log_path))


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
    assert (tmp_path / "refs" / f"{report.reference.key}.spread.json").is_file()  # stored beside the reference
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
