"""Issue 37, item 1: the tiny mixture-of-experts model (tests/fixtures/tiny-moe, scripts/make_tiny_moe_model.py) built,
gated and benchmarked end to end on this CPU by the reference lane, with the shipped spec configs/tiny-moe.yaml (its
benchmark cut to one concurrency here, to keep the test short), a file:// store and a local MLflow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from enginefoundry.inputs.model_config import expert_count, read_config
from tests.support.paths import CONFIGS, FIXTURES, REPO

TINY_MOE = FIXTURES / "tiny-moe" / "model"


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "enginefoundry.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_reference_lane_builds_gates_and_benchmarks_the_tiny_moe_model(tmp_path: Path):
    config = read_config(TINY_MOE / "config.json")
    assert config and config["architectures"] == ["Qwen3MoeForCausalLM"] and expert_count(config) == 4
    assert config["num_experts_per_tok"] == 2 and (TINY_MOE / "model.safetensors").stat().st_size < 500_000

    data = yaml.safe_load((CONFIGS / "tiny-moe.yaml").read_text())
    data["model"]["source"] = str(TINY_MOE)
    data["smoke"]["prompts"] = str(CONFIGS / "prompts" / "tiny-chat.jsonl")
    data["benchmark"].update(concurrency=[2], request_count=8, warmup_request_count=1)
    spec = tmp_path / "tiny-moe.yaml"
    spec.write_text(yaml.safe_dump(data))
    env = {**os.environ, "EF_STORE": f"file://{tmp_path / 'store'}", "MLFLOW_TRACKING_URI":
           f"sqlite:///{tmp_path / 'mlflow.db'}", "EF_CACHE_DIR": str(tmp_path / "cache"),
           "EF_WORK_DIR": str(tmp_path / "work"), "PREFECT_HOME": str(tmp_path / "prefect"),
           "HF_HOME": str(tmp_path / "hf"), "OMP_NUM_THREADS": "1"}

    started = time.monotonic()
    run = _cli(["run", str(spec)], env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert time.monotonic() - started < 120
    docs = [json.loads(p.read_text()) for p in (tmp_path / "store" / "manifests" / "tiny-moe").glob("*/2*.json")]
    (manifest,) = [d for d in docs if "unit" in d]  # beside it: the converted checkpoint's manifest
    assert manifest["status"] == "candidate" and manifest["lane"] == "reference"
    # the gate: every one of the 108 prompts answered as the fp32 reference answers it
    smoke = manifest["smoke"]
    assert smoke["smoke_passed"] is True and smoke["smoke_n"] == 108 and smoke["smoke_agreement"] == 1.0
    # the benchmark: one point, every request completed
    (point,) = manifest["benchmark"]["points"]
    assert point["concurrency"] == 2 and point["completed"] == 8 and point["error_rate"] == 0.0
    assert point["output_tokens_per_s"] > 0
    assert any(f["path"] == "bundle/model/model.safetensors" for f in manifest["files"])

    # the same model with expert parallelism is refused by the reference lane, naming the field and the fix
    data["variants"] = [{"precision": "fp32", "moe_ep": 2}]
    spec.write_text(yaml.safe_dump(data))
    refused = _cli(["validate", str(spec)], env)
    assert refused.returncode == 2 and "variants.0.moe_ep" in refused.stderr and "lane trtllm" in refused.stderr
