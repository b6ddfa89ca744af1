"""Issue 37 item 3 for real: `enginefoundry search --json` with `search.disaggregated` on a Llama-3.1-8B-shaped
config.json (no weights, no hub) for H100 × 8 asks AIConfigurator 0.12.0 (.venv-predict) for both its aggregated
and its disaggregated search in one process, and ranks them together: the disaggregated rows are the ones of the
committed real output (tests/fixtures/aiconfigurator-disagg/llama_disagg), each a candidate unit of its own (a variant
with `disaggregated`), ranked by the same objective: with top_k 1 the unit is the best configuration, aggregated
here."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from enginefoundry.cli import main
from enginefoundry.search.predictor import find_tool

REPO = Path(__file__).resolve().parents[2]
LLAMA = REPO / "configs" / "model-configs" / "llama-3.1-8b-instruct.json"
FIXTURE = REPO / "tests" / "fixtures" / "aiconfigurator-disagg" / "llama_disagg" / "best_config_topn.csv"

pytestmark = pytest.mark.skipif(find_tool() is None, reason="the predictor is not installed: make predict-venv")


def test_search_ranks_disaggregated_configurations_beside_aggregated_ones(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EF_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "llama"
    model.mkdir()
    (model / "config.json").write_text(LLAMA.read_text())
    spec = yaml.safe_load((REPO / "configs" / "llama-3.1-8b-search.yaml").read_text())
    spec["model"] = {"source": str(model), "name": "llama-shaped"}
    spec["toolchain"] = {"trtllm_version": "1.3.0rc20"}
    spec["targets"] = [t for t in spec["targets"] if t["name"] == "h100"]
    spec["search"].update(precisions=["bf16"], top_k=1, disaggregated=True)
    spec["smoke"]["prompts"] = str(REPO / "configs" / "prompts" / "tiny-chat.jsonl")
    path = tmp_path / "search.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["search", str(path), "--json"]) == 0
    (ts,) = json.loads(capsys.readouterr().out)["targets"]
    assert ts["covered"] and ts["problems"] == {}
    disagg = [c for c in ts["candidates"] if c["predicted"]["disagg"]]
    agg = [c for c in ts["candidates"] if not c["predicted"]["disagg"]]
    with FIXTURE.open() as f:
        expected = [(int(r["(p)workers"]), int(r["(p)tp"]), int(r["(d)workers"]), int(r["(d)tp"]),
                     int(r["(d)bs"]), float(r["tokens/s/gpu"])) for r in csv.DictReader(f)]
    assert [(c["predicted"]["disagg"]["prefill"]["workers"], c["predicted"]["disagg"]["prefill"]["tp"],
             c["predicted"]["disagg"]["decode"]["workers"], c["predicted"]["disagg"]["decode"]["tp"],
             c["predicted"]["disagg"]["decode"]["batch_size"], c["predicted"]["tokens_per_s_gpu"])
            for c in disagg] == expected
    # Each is a unit of its own, below the one the top_k keeps (the aggregated best, 4969 tok/s/GPU).
    assert all(c["verdict"] == "below top_k" and "-disagg-p" in c["unit"] for c in disagg), disagg
    # Lane trtllm, 1.3.0rc20: each disaggregated row carries its trtllm-serve disaggregated files.
    top = disagg[0]["serving"]
    assert top["release"] == "1.3.0rc20" and top["disagg_config.yaml"]["context_servers"]["num_instances"] == 2
    assert top["generation.yaml"]["tensor_parallel_size"] == 2 and top["context.yaml"]["disable_overlap_scheduler"]
    # One ranking: ranks are by tokens/s/GPU over both kinds, and the unit is the best configuration.
    values = [c["predicted"]["tokens_per_s_gpu"] for c in ts["candidates"]]
    assert values == sorted(values, reverse=True) and agg and ts["units"] == [agg[0]["unit"]]
    assert "bf16" in ts["pareto"] and "bf16 disagg" in ts["pareto"]
