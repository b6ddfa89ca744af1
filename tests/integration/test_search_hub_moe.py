"""Issue 37, item 4, for real: `enginefoundry search` on a Hub-sourced mixture-of-experts spec fetches config.json
from the loopback hub (tests/services/hub_server.py) at the pinned revision and nothing else, and the real predictor
(AIConfigurator 0.12.0, .venv-predict) returns MoE parallel configurations the table shows. A fresh process sees only
the environment a user would set (HF_ENDPOINT, HF_HOME, EF_CACHE_DIR)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from enginefoundry.search.predictor import find_tool
from tests.services.hub_server import seed_repo, serving
from tests.support.paths import CONFIGS, FIXTURES

REPO = Path(__file__).resolve().parents[2]
QWEN_MOE = FIXTURES / "model-configs" / "qwen3-30b-a3b" / "config.json"
REPO_ID = "Qwen/Qwen3-30B-A3B"


def _spec(folder: Path) -> Path:
    data = yaml.safe_load((CONFIGS / "llama-3.1-8b-search.yaml").read_text())
    data.update(name="qwen3-moe-search", model={"source": f"hf://{REPO_ID}@main", "name": "qwen3-30b-a3b"},
                toolchain={"trtllm_version": "1.3.0rc23"})
    data["targets"] = [{"name": "h200", "arch": "sm90", "sku": ["H200"], "gpu_count": 8, "memory_gib": 141}]
    data["search"].update(precisions=["bf16"], top_k=1, slo={"ttft_p95_ms": 1000, "itl_p95_ms": 30})
    shutil.copytree(CONFIGS / "prompts", folder / "prompts")
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _search(spec: Path, env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, "-m", "enginefoundry.cli", "search", str(spec), "--json"], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.skipif(find_tool() is None, reason="the predictor is not installed: make predict-venv")
def test_search_fetches_only_config_json_and_shows_moe_columns(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(QWEN_MOE, src / "config.json")
    (src / "model-00001-of-00016.safetensors").write_bytes(b"\0" * 4096)  # stands for 61 GB of weights
    (src / "tokenizer.json").write_text("{}")
    sha = seed_repo(tmp_path / "hub", REPO_ID, src)
    hf_home = tmp_path / "hf-home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "EF_CACHE", "EF_PREDICTOR"))}
    env.update(HF_HOME=str(hf_home), HF_HUB_DISABLE_XET="1", EF_CACHE_DIR=str(tmp_path / "ef-cache"),
               PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    spec = _spec(tmp_path)
    with serving(tmp_path / "hub") as url:
        report = _search(spec, {**env, "HF_ENDPOINT": url})
    assert report["experts"] == 128 and f"{REPO_ID}@main config.json (fetched from {url})" in report["config_source"]
    files = sorted(p.name for p in (hf_home / "hub").rglob("*") if p.is_file() and "snapshots" in p.parts)
    assert files == ["config.json"], files  # nothing but config.json: no weights, no tokenizer
    assert (hf_home / "hub" / "models--Qwen--Qwen3-30B-A3B" / "snapshots" / sha / "config.json").is_file()
    [target] = report["targets"]
    ranked = [c["predicted"] for c in target["candidates"]]
    assert target["covered"] and ranked, target.get("reason")
    # The predictor searched expert and attention-DP parallelism for this MoE model, and said so per row.
    assert any(p["moe_ep"] > 1 or p["dp"] > 1 for p in ranked), ranked[:3]
    for c in target["candidates"]:
        p = c["predicted"]
        assert p["tp"] * p["pp"] * p["dp"] <= 8
        # Issue 37 item 1: an expert-parallel / attention-DP configuration is a unit of lane trtllm (tp = moe_tp ×
        # moe_ep, attention_dp = dp > 1), unless TensorRT-LLM cannot run it (attention tp inside attention DP).
        if p["dp"] > 1 and p["tp"] > 1:
            assert not c["chosen"] and "inside attention DP" in c["verdict"], c
        elif p["moe_ep"] > 1 or p["dp"] > 1:
            assert "-ep" in c["unit"] or "-adp" in c["unit"], c  # a unit name with its MoE shape
    # the best-ranked configuration the lane runs is the unit: here an expert-parallel one
    [chosen] = [c for c in target["candidates"] if c["chosen"]]
    assert chosen["predicted"]["moe_ep"] > 1 or chosen["predicted"]["dp"] > 1, chosen
    # Offline, from the cache alone: the same config, no request to the hub (it is gone).
    again = _search(spec, {**env, "HF_HUB_OFFLINE": "1"})
    assert again["experts"] == 128 and "Hugging Face cache" in again["config_source"]
