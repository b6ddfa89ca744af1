"""Issue 37, item 4: `search` for any model. The config.json lookup (the spec's own model-configs/ folder before the
package's; a Hub source's config.json from the Hugging Face cache, or fetched alone by `search`), and the MoE
parallel columns the predictor returns (AIConfigurator 0.12.0 ColumnsAgg: tp, pp, dp, moe_tp, moe_ep)."""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from enginefoundry.inputs.model_config import MAX_CONFIG_BYTES, expert_count, lookup, read_config
from enginefoundry.search.plan import materialise, rows
from enginefoundry.search.predictor import Coverage, Predicted, Prediction, read_experiment, requests_for
from enginefoundry.spec import Precision, load_spec
from tests.support.paths import CONFIGS, FIXTURES

QWEN_MOE = FIXTURES / "model-configs" / "qwen3-30b-a3b" / "config.json"


def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No hub: huggingface_hub reads HF_HUB_OFFLINE once, at import, so an earlier test's import would leave the
    variable unread and a lookup would wait on the network (no internet here: ~20 s of retries)."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def write_spec(folder: Path, source: str = "hf://Qwen/Qwen3-30B-A3B@main", name: str = "qwen3-30b-a3b") -> Path:
    data = yaml.safe_load((CONFIGS / "llama-3.1-8b-search.yaml").read_text())
    data["model"] = {"source": source, "name": name}
    data["targets"] = [{"name": "h200", "arch": "sm90", "sku": ["H200"], "gpu_count": 8, "memory_gib": 141}]
    data["search"]["precisions"] = ["bf16"]
    shutil.copytree(CONFIGS / "prompts", folder / "prompts", dirs_exist_ok=True)
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_model_configs_folder_beside_the_spec_comes_before_the_packaged_one(tmp_path, monkeypatch):
    offline(monkeypatch)
    spec = load_spec(write_spec(tmp_path, "hf://meta-llama/Llama-3.1-8B-Instruct@main", "llama-3.1-8b-instruct"))
    packaged = lookup(spec)
    assert packaged.config and packaged.source.endswith("configs/model-configs/llama-3.1-8b-instruct.json")
    (tmp_path / "model-configs").mkdir()
    mine = {**packaged.config, "num_hidden_layers": 2}
    (tmp_path / "model-configs" / "llama-3.1-8b-instruct.json").write_text(json.dumps(mine))
    found = lookup(spec)
    assert found.config == mine and found.source == str(tmp_path / "model-configs" / "llama-3.1-8b-instruct.json")


def test_a_hub_model_without_a_cached_config_is_not_downloaded_by_plan(tmp_path, monkeypatch):
    offline(monkeypatch)
    spec = load_spec(write_spec(tmp_path))
    found = lookup(spec, fetch=False)
    assert found.config is None and "Qwen/Qwen3-30B-A3B@main" in found.why and "enginefoundry search" in found.why
    assert "model-configs/<model.name>.json beside the spec" in found.why


def test_config_files_are_read_bounded_and_as_objects(tmp_path):
    assert read_config(QWEN_MOE)["num_experts"] == 128
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "big.json").write_text(json.dumps({"pad": "x" * MAX_CONFIG_BYTES}))
    os.mkfifo(tmp_path / "fifo.json")  # would hang an unbounded read
    for name in ("list.json", "big.json", "fifo.json", "missing.json"):
        assert read_config(tmp_path / name) is None, name
    assert expert_count(json.loads(QWEN_MOE.read_text())) == 128
    assert expert_count({"num_local_experts": 8}) == 8 and expert_count({"n_routed_experts": 256}) == 256
    assert expert_count({"num_hidden_layers": 32}) == 0 and expert_count({"num_experts": True}) == 0


def test_an_unsafe_model_name_is_not_a_path(tmp_path, monkeypatch):
    offline(monkeypatch)
    spec = load_spec(write_spec(tmp_path))
    (tmp_path / "secret.json").write_text(json.dumps({"num_experts": 4}))
    hostile = spec.model_copy(update={"model": spec.model.model_copy(update={"name": "../secret"})})
    assert lookup(hostile).config is None


ROW = {"concurrency": "64", "bs": "64", "ttft": "420.5", "tpot": "18.2", "tokens/s/gpu": "3100.0",
       "tokens/s/user": "55.0", "tp": "1", "pp": "1", "dp": "8", "moe_tp": "1", "moe_ep": "8", "power_w": "0.0"}


def test_the_moe_columns_are_read_from_the_predictor_output(tmp_path):
    """The predictor's best_config_topn.csv carries dp, moe_tp, moe_ep (ColumnsAgg, aiconfigurator_core 0.12.0)."""
    out = tmp_path / "out" / "run" / "e0_bf16"
    out.mkdir(parents=True)
    dense = {k: v for k, v in ROW.items() if k not in ("dp", "moe_tp", "moe_ep")} | {"tp": "2"}
    with (out / "best_config_topn.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(ROW))
        writer.writeheader()
        writer.writerows([ROW, {**dense, "dp": "", "moe_tp": "", "moe_ep": ""}])
    cov = Coverage(True, system="h200_sxm", backend="trtllm", db_version="1.3.0rc23")
    spec = load_spec(CONFIGS / "llama-3.1-8b-search.yaml")
    [request] = [r for r in requests_for(spec.search, spec.targets[1], cov, "d") if r.precision is Precision.BF16]
    pred = read_experiment(tmp_path / "out", "e0_bf16", request, "k", 1.0, 0, "")
    ep, plain = pred.ranked
    assert (ep.tp, ep.pp, ep.dp, ep.moe_tp, ep.moe_ep, ep.gpus) == (1, 1, 8, 1, 8, 8) and not ep.tp_pp_only
    assert (plain.dp, plain.moe_tp, plain.moe_ep, plain.gpus) == (1, 1, 1, 2) and plain.tp_pp_only


class FakePredictor:
    """Error paths and table shape only: the real predictor's MoE answer is tests/integration/test_search_moe.py."""

    name = "fake"

    def __init__(self, ranked: list[Predicted]) -> None:
        self.ranked = ranked
        self.configs: list[dict] = []

    def coverage(self, spec, target, model_config):
        if model_config is None:
            return Coverage(False, "no config.json without a download")
        return Coverage(True, system="h200_sxm", backend="trtllm", db_version="1.3.0rc23")

    def predict(self, model_config, requests, progress=print):
        self.configs.append(model_config)
        return [Prediction(key="k", precision=r.precision, ranked=self.ranked, pareto=[]) for r in requests]


def predicted(**kw) -> Predicted:
    base = {"precision": Precision.BF16, "tp": 1, "pp": 1, "batch_size": 64, "concurrency": 64,
            "tokens_per_s_gpu": 3000.0, "tokens_per_s_user": 50.0, "ttft_ms": 200.0, "tpot_ms": 18.0}
    return Predicted(**{**base, **kw})


def test_a_moe_search_shows_the_parallel_columns_and_builds_expert_and_attention_dp_units(tmp_path, monkeypatch):
    """Issue 37 item 1: a predicted expert-parallel / attention-DP configuration becomes a unit of lane trtllm, with
    the shape AIConfigurator's own TensorRT-LLM generator writes (tensor_parallel_size = moe_tp × moe_ep,
    enable_attention_dp = dp > 1: generator/rule_plugin/trtllm.rule); one TensorRT-LLM cannot run is listed only."""
    offline(monkeypatch)
    (tmp_path / "model-configs").mkdir()
    shutil.copy(QWEN_MOE, tmp_path / "model-configs" / "qwen3-30b-a3b.json")
    spec = load_spec(write_spec(tmp_path))
    fake = FakePredictor([predicted(dp=8, moe_ep=8, tokens_per_s_gpu=3100.0),
                          predicted(tp=2, dp=2, moe_ep=4, tokens_per_s_gpu=3050.0),
                          predicted(tp=4, moe_tp=4)])
    searched, report = materialise(spec, predictor=fake, progress=lambda _: None)
    assert fake.configs[0]["num_experts"] == 128 and report.experts == 128
    assert report.config_source.endswith("model-configs/qwen3-30b-a3b.json")
    table = rows(report)
    assert {"dp", "moe_tp", "moe_ep", "GPUs"} <= set(table[0])
    first, second, third = table[0], table[1], table[2]
    assert (first["dp"], first["moe_tp"], first["moe_ep"], first["GPUs"]) == ("8", "1", "8", "8")
    assert first["unit"] == "bf16-tp8-ep8-adp.search-b64.h200", first["why"]
    assert second["unit"] == "-" and "attention tp 2 inside attention DP 2" in second["why"]
    assert third["unit"] != "-" and (third["moe_tp"], third["moe_ep"]) == ("4", "1"), third["why"]
    shapes = [(u.variant.tp, u.variant.pp, u.variant.moe_ep, u.variant.attention_dp) for u in searched.searched]
    assert shapes == [(8, 1, 8, True), (4, 1, 1, False)]
    # the chosen unit's LLM API YAML has the predicted shape
    from enginefoundry.inputs.units import expand_units
    from enginefoundry.lanes.trtllm import runtime_config

    unit = next(u for u in expand_units(searched) if u.variant.attention_dp)
    cfg = runtime_config(searched, unit)
    assert (cfg["tensor_parallel_size"], cfg["moe_expert_parallel_size"], cfg["moe_tensor_parallel_size"],
            cfg["enable_attention_dp"]) == (8, 8, 1, True)


def test_a_moe_configuration_is_not_a_unit_on_a_lane_without_moe_parallelism():
    from enginefoundry.search.plan import searched_variant

    variant, why = searched_variant(predicted(dp=8, moe_ep=8), "reference", moe_lane=False)
    assert (variant.tp, variant.moe_ep) == (1, 1) and "lane reference has no expert/attention-DP" in why
    variant, why = searched_variant(predicted(tp=2, moe_ep=4), "trtllm", moe_lane=True)
    assert "moe_tp × moe_ep = 4 is not its 2 attention ranks" in why
    variant, why = searched_variant(predicted(tp=4, moe_ep=4), "trtllm", moe_lane=True)
    assert why is None and (variant.tp, variant.moe_ep, variant.moe_tp_size, variant.attention_dp) == (4, 4, 1, False)


def test_a_dense_search_keeps_its_columns(tmp_path, monkeypatch):
    offline(monkeypatch)
    spec = load_spec(CONFIGS / "llama-3.1-8b-search.yaml")
    _, report = materialise(spec, predictor=FakePredictor([predicted()]), progress=lambda _: None)
    assert report.experts == 0 and "moe_ep" not in rows(report)[0]


def test_without_any_config_the_reason_names_where_it_looked(tmp_path, monkeypatch):
    offline(monkeypatch)
    spec = load_spec(write_spec(tmp_path))
    _, report = materialise(spec, predictor=FakePredictor([]), progress=lambda _: None)
    [ts] = report.targets
    assert not ts.covered and "Qwen/Qwen3-30B-A3B@main" in ts.reason and "model-configs" in ts.reason
