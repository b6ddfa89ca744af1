"""The predictor for real (AIConfigurator 0.12.0 from .venv-predict, `make predict-venv`; `make test` installs it):
`enginefoundry search` on a Llama-3.1-8B-shaped config.json (no weights, no hub) for H100 and H200 ranks first
what the package's own CLI (`aiconfigurator cli default`) ranks first for the same inputs, and a second search
is answered from the cache."""

from __future__ import annotations

import csv
import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from enginefoundry.cli import main
from enginefoundry.search.predictor import find_tool

REPO = Path(__file__).resolve().parents[2]
LLAMA = REPO / "configs" / "model-configs" / "llama-3.1-8b-instruct.json"
INPUTS = {"isl": 1024, "osl": 256, "ttft": 300, "tpot": 20, "gpus": 8}

pytestmark = pytest.mark.skipif(find_tool() is None, reason="the predictor is not installed: make predict-venv")


def _spec(tmp_path: Path) -> Path:
    model = tmp_path / "llama"
    model.mkdir()
    (model / "config.json").write_text(LLAMA.read_text())  # a local source: its config.json, no weights
    spec = yaml.safe_load((REPO / "configs" / "llama-3.1-8b-search.yaml").read_text())
    spec["model"] = {"source": str(model), "name": "llama-shaped"}
    spec["search"].update(precisions=["bf16"], top_k=1)
    spec["smoke"]["prompts"] = str(REPO / "configs" / "prompts" / "tiny-chat.jsonl")
    path = tmp_path / "search.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _cli_top(system: str, model_dir: Path, out: Path) -> dict[str, str]:
    """Rank 1 of the package's own `cli default` (aggregated) for the same inputs."""
    tool = find_tool()
    assert tool is not None
    done = subprocess.run(
        [str(tool), "cli", "default", "--model-path", str(model_dir), "--system", system, "--backend", "trtllm",
         "--total-gpus", str(INPUTS["gpus"]), "--isl", str(INPUTS["isl"]), "--osl", str(INPUTS["osl"]),
         "--ttft", str(INPUTS["ttft"]), "--tpot", str(INPUTS["tpot"]), "--serving-mode", "agg",
         "--save-dir", str(out)], capture_output=True, text=True, timeout=900,
        env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "HOME": str(out)})
    assert done.returncode == 0, done.stderr[-2000:]
    with next(out.glob("*/agg/best_config_topn.csv")).open() as f:
        return next(csv.DictReader(f))


def test_search_ranks_first_what_the_package_cli_ranks_first(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EF_CACHE_DIR", str(tmp_path / "cache"))
    spec = _spec(tmp_path)
    assert main(["search", str(spec), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    by_target = {t["target"]: t for t in report["targets"]}
    assert set(by_target) == {"h100", "h200"}
    for target, system in (("h100", "h100_sxm"), ("h200", "h200_sxm")):
        ours = by_target[target]
        assert ours["covered"] and system in ours["predictor"]
        assert "toolchain pins TensorRT-LLM 1.2.1" in ours["note"]  # the disagreement is shown
        top = ours["candidates"][0]
        assert top["chosen"] and top["unit"] == f"bf16-tp{top['predicted']['tp']}." \
                                                f"search-b{top['predicted']['batch_size']}.{target}"
        theirs = _cli_top(system, tmp_path / "llama", tmp_path / f"cli-{target}")
        assert (top["predicted"]["tp"], top["predicted"]["pp"], top["predicted"]["batch_size"]) == (
            int(theirs["tp"]), int(theirs["pp"]), int(theirs["bs"]))
        assert top["predicted"]["tokens_per_s_gpu"] == pytest.approx(float(theirs["tokens/s/gpu"]), rel=1e-6)
        assert top["predicted"]["ttft_ms"] == pytest.approx(float(theirs["ttft"]), rel=1e-6)
    # The searched units are ordinary units: they carry the prediction into the plan.
    assert [u["target"] for u in report["units"]] == ["h100", "h200"]

    t0 = time.monotonic()
    assert main(["search", str(spec), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert time.monotonic() - t0 < 60
    assert all(t["cached"] == 1 for t in again["targets"])
    assert [t["candidates"][0] for t in again["targets"]] == [t["candidates"][0] for t in report["targets"]]
