"""Issue 36 item 5, end to end: a tiny ModelOpt export (made here with the `simulate` extra) as `model.source`
is built, gated, benchmarked, published and recorded by `enginefoundry run` on the reference lane, without a
second quantization; its unquantized original (`model.unquantized`) judges the quantization's own cost; a precision
that contradicts the export is refused by `run` before any work, with the field and the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.paths import CONFIGS, REPO, TINY_PROMPTS

pytest.importorskip("modelopt", reason="the `simulate` extra (nvidia-modelopt) is not installed")


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "enginefoundry.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


def test_a_modelopt_export_runs_end_to_end_without_a_second_quantization(tmp_path: Path):
    from enginefoundry.smoke import load_prompt_set
    from tests.support.modelopt_export import make_int4_awq_export

    cases = load_prompt_set(TINY_PROMPTS).cases[:4]
    original, exported = make_int4_awq_export(tmp_path, [c.chat() for c in cases])
    data = yaml.safe_load((CONFIGS / "tiny-cpu.yaml").read_text())
    data["name"] = "tiny-prequant"
    data["model"] = {"source": str(exported), "name": "tiny-prequant", "unquantized": str(original)}
    data["variants"] = [{"precision": "int4_awq"}]
    data["smoke"].update(prompts=str(TINY_PROMPTS), small_sample="warn")
    data["benchmark"].update(concurrency=[1], request_count=6, warmup_request_count=1)
    spec = tmp_path / "prequant.yaml"
    spec.write_text(yaml.safe_dump(data))
    env = {**os.environ, "EF_STORE": f"file://{tmp_path / 'store'}", "MLFLOW_TRACKING_URI":
           f"sqlite:///{tmp_path / 'mlflow.db'}", "EF_CACHE_DIR": str(tmp_path / "cache"),
           "EF_REFERENCE_CACHE": str(tmp_path / "refs"), "EF_WORK_DIR": str(tmp_path / "work"),
           "PREFECT_HOME": str(tmp_path / "prefect"), "HF_HOME": str(tmp_path / "hf"), "OMP_NUM_THREADS": "1"}

    run = _cli(["run", str(spec), "--wait-for-tracking"], env)
    said = run.stdout + run.stderr
    assert run.returncode == 0, said[-4000:]
    assert "is pre-quantized: W4A16_AWQ (int4_awq" in said
    # no second quantization: neither the lane's quantizer nor a simulation of one ran
    assert "ModelOpt quantization" not in said and "hf_ptq" not in said and "smoke: simulating" not in said
    assert "the lane's own quantized checkpoint" not in said
    docs = [json.loads(p.read_text()) for p in (tmp_path / "store" / "manifests" / "tiny-prequant").glob("*/2*.json")]
    (unit,) = [d for d in docs if "unit" in d]
    (checkpoint,) = [d for d in docs if "unit" not in d]
    assert unit["status"] == "candidate" and unit["lane"] == "reference"
    # the key records the checkpoint's own quantization, as does the converted checkpoint's
    for doc in (unit, checkpoint):
        assert doc["key_components"]["source_quantization"]["quant_algo"] == "W4A16_AWQ"
    assert checkpoint["params"]["dtype"] == "float16" and checkpoint["params"]["dequantized"].startswith("W4A16_AWQ")
    assert unit["smoke"]["smoke_passed"] is True and unit["smoke"]["smoke_n"] == 108
    # judged against its dequantized self; its quantization cost against the unquantized original
    report = next((tmp_path / "work").rglob("smoke.md"))
    text = report.read_text()
    assert "the pre-quantized source's own checkpoint (ModelOpt's unified export), dequantized" in text
    assert "the pre-quantized source (W4A16_AWQ), dequantized," in text
    (point,) = unit["benchmark"]["points"]
    assert point["completed"] == 6 and point["error_rate"] == 0.0

    # `explain`: a hit now; a contradicting precision: refused by `run` before any download or build
    explained = _cli(["explain", str(spec), "--json"], env)
    assert explained.returncode == 0, explained.stderr[-2000:]
    assert [u["hit"] for u in json.loads(explained.stdout)["units"]] == [True]
    data["variants"] = [{"precision": "bf16"}]
    spec.write_text(yaml.safe_dump(data))
    refused = _cli(["run", str(spec)], env)
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
    assert "variants.0.precision: bf16 contradicts the source's quantization" in refused.stderr
    assert "set variants.0.precision: int4_awq" in refused.stderr and "Traceback" not in refused.stderr
    assert len(list((tmp_path / "store" / "manifests" / "tiny-prequant").glob("*/2*.json"))) == 2  # nothing new
