"""Issue 37 item 3, the lane part: the `trtllm-serve disaggregated` router config, the per-role LLM-API YAMLs and the
worker commands for a predicted disaggregated configuration (the rows of the real AIConfigurator output in
tests/fixtures/aiconfigurator-disagg), each key checked against the release it is emitted for, and every refusal
(a release without the KV-cache transceiver, a shape TensorRT-LLM does not run, an unknown transceiver backend)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from enginefoundry.errors import SpecError
from enginefoundry.lanes.trtllm_disagg import KEYS, ROUTER, TRANSCEIVER_SINCE, disaggregated_serving, key_status
from enginefoundry.lanes.trtllm_flags import ABSENT, LLM_API, PRESENT, TO_BE_PROBED
from enginefoundry.search.predictor import _disagg_row
from enginefoundry.spec import Precision
from enginefoundry.spec.search import Disagg, Worker

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
DISAGG = FIXTURES / "aiconfigurator-disagg"


def _top(name: str) -> Disagg:
    with (DISAGG / name / "best_config_topn.csv").open() as f:
        row = next(csv.DictReader(f))
    d = _disagg_row(row, Precision.BF16).disagg
    assert d is not None
    return d


def test_a_dense_row_becomes_the_router_config_two_role_yamls_and_the_worker_commands() -> None:
    d = _top("llama_disagg")  # 2 prefill workers tp1 bs1 + 1 decode worker tp2 bs304 (H100, real output)
    s = disaggregated_serving(d, "1.2.1", "/models/llama", isl=1024, osl=256)
    assert s.config == {"hostname": "localhost", "port": 8000,
                        "context_servers": {"num_instances": 2, "urls": ["localhost:8001", "localhost:8002"]},
                        "generation_servers": {"num_instances": 1, "urls": ["localhost:8003"]}}
    transceiver = {"backend": "DEFAULT", "max_tokens_in_buffer": 1792}  # ceil((1024 + 256 + 500) / 32) × 32
    assert s.roles["context"] == {"tensor_parallel_size": 1, "pipeline_parallel_size": 1, "max_batch_size": 1,
                         "disable_overlap_scheduler": True, "cache_transceiver_config": transceiver}
    assert s.roles["generation"] == {"tensor_parallel_size": 2, "pipeline_parallel_size": 1, "max_batch_size": 304,
                            "disable_overlap_scheduler": False, "cache_transceiver_config": transceiver}
    # Each worker on its own GPUs, TP*PP of them, as NVIDIA's example starts them: the decode worker (tp 2) on 2 and 3.
    assert s.commands == [
        ["env", "CUDA_VISIBLE_DEVICES=0", "trtllm-serve", "/models/llama", "--host", "localhost", "--port", "8001",
         "--extra_llm_api_options", "context.yaml"],
        ["env", "CUDA_VISIBLE_DEVICES=1", "trtllm-serve", "/models/llama", "--host", "localhost", "--port", "8002",
         "--extra_llm_api_options", "context.yaml"],
        ["env", "CUDA_VISIBLE_DEVICES=2,3", "trtllm-serve", "/models/llama", "--host", "localhost", "--port", "8003",
         "--extra_llm_api_options", "generation.yaml"],
        ["trtllm-serve", "disaggregated", "--config_file", "disagg_config.yaml"]]
    assert s.to_be_probed == []


def test_a_moe_row_maps_each_roles_expert_and_attention_dp_like_the_aggregated_search() -> None:
    d = _top("qwen_disagg")  # P 2 × tp1 dp2 etp1 ep2 bs1; D 1 × tp1 dp4 etp2 ep2 bs176 (H200, real output)
    s = disaggregated_serving(d, "1.3.0rc23", "/models/qwen", isl=1024, osl=256, moe=True, backend="UCX")
    assert {k: s.roles["context"][k] for k in ("tensor_parallel_size", "moe_expert_parallel_size",
                                      "moe_tensor_parallel_size", "enable_attention_dp")} == {
        "tensor_parallel_size": 2, "moe_expert_parallel_size": 2, "moe_tensor_parallel_size": 1,
        "enable_attention_dp": True}
    assert {k: s.roles["generation"][k] for k in ("tensor_parallel_size", "moe_expert_parallel_size",
                                         "moe_tensor_parallel_size", "enable_attention_dp", "max_batch_size")} == {
        "tensor_parallel_size": 4, "moe_expert_parallel_size": 2, "moe_tensor_parallel_size": 2,
        "enable_attention_dp": True, "max_batch_size": 176}
    assert s.roles["context"]["cache_transceiver_config"]["backend"] == "UCX"
    assert s.config["context_servers"]["num_instances"] == 2 and s.config["generation_servers"]["num_instances"] == 1


def test_a_release_without_the_kv_cache_transceiver_is_refused_with_the_field_and_the_fix() -> None:
    d = _top("llama_disagg")
    with pytest.raises(SpecError) as err:
        disaggregated_serving(d, "1.0.0rc3", "m", isl=1024, osl=256)
    problems = err.value.problems
    assert {p for p, _ in problems} == {"toolchain.trtllm_version"}
    keys = sorted(m.split(" has no ", 1)[1].split(" ", 1)[0] for _, m in problems)
    assert keys == ["cache_transceiver_config", "cache_transceiver_config.backend",
                    "cache_transceiver_config.max_tokens_in_buffer"]
    assert all(f"pin toolchain.trtllm_version ≥ {TRANSCEIVER_SINCE}" in m and "search.disaggregated: false" in m
               for _, m in problems)
    # The first release with it, and the lane's own releases, are fine.
    for release in ("1.0.0rc4", "1.0.0", "1.1.0", "1.2.1", "1.3.0rc24"):
        assert disaggregated_serving(d, release, "m", isl=1024, osl=256).to_be_probed == []


def test_a_release_past_the_evidence_is_served_with_its_keys_listed_to_be_probed() -> None:
    s = disaggregated_serving(_top("llama_disagg"), "1.4.0rc4", "m", isl=1024, osl=256)
    assert f"{ROUTER} context_servers.num_instances" in s.to_be_probed
    assert f"{LLM_API} cache_transceiver_config.backend" in s.to_be_probed
    assert f"{LLM_API} tensor_parallel_size" not in s.to_be_probed  # its evidence reaches 1.4.0rc4 (trtllm_flags)


def test_shapes_tensorrt_llm_does_not_run_and_an_unknown_backend_are_refused() -> None:
    bad = Disagg(prefill=Worker(workers=1, tp=2, dp=2, moe_tp=1, moe_ep=4, batch_size=1),
                 decode=Worker(workers=1, tp=1, dp=2, moe_tp=1, moe_ep=4, batch_size=8), total_gpus=6)
    with pytest.raises(SpecError) as err:
        disaggregated_serving(bad, "1.2.1", "m", isl=1024, osl=256, moe=True, backend="TCP")
    got = dict(err.value.problems)
    assert "attention tp 2 inside attention DP 2" in got["context.dp"]
    assert "moe_tp × moe_ep = 4 is not its 2 attention ranks" in got["generation.moe_ep"]
    assert "'TCP' is not one of DEFAULT, UCX, NIXL, MPI" in got["cache_transceiver_config.backend"]


def test_every_key_has_evidence_and_the_transceiver_range_matches_nvidias_templates() -> None:
    assert all(f.refs for f in KEYS)
    releases = json.loads((FIXTURES / "aiconfigurator-templates" / "keys.json").read_text())["releases"]
    for release, keys in releases.items():
        if release.startswith("0."):
            continue  # below the lane's floor (1.0)
        for name in ("cache_transceiver_config", "cache_transceiver_config.backend",
                     "cache_transceiver_config.max_tokens_in_buffer", "disable_overlap_scheduler"):
            _, status = key_status(LLM_API, name, release)
            assert (status == PRESENT) == (name in keys), (release, name)
            assert status in (PRESENT, ABSENT) and status != TO_BE_PROBED


def test_every_key_cites_an_upstream_reference_and_the_compat_page_is_current() -> None:
    from enginefoundry.lanes.compat import DOC, entry_problems, render

    assert [p for f in KEYS for p in entry_problems(f)] == []
    assert "## Disaggregated serving (`search.disaggregated`, lane trtllm)" in render()
    assert DOC.read_text() == render()


def _gpus(command: list[str]) -> list[int]:
    assert command[0] == "env" and command[1].startswith("CUDA_VISIBLE_DEVICES=")
    return [int(i) for i in command[1].removeprefix("CUDA_VISIBLE_DEVICES=").split(",")]


@pytest.mark.parametrize("name", ["llama_disagg", "qwen_disagg"])
def test_every_predicted_row_places_its_workers_on_distinct_gpus_adding_up_to_its_count(name: str) -> None:
    with (DISAGG / name / "best_config_topn.csv").open() as f:
        rows = [r for r in (_disagg_row(row, Precision.BF16).disagg for row in csv.DictReader(f)) if r is not None]
    assert rows
    for d in rows:
        s = disaggregated_serving(d, "1.3.0rc23", "m", isl=1024, osl=256, moe=name == "qwen_disagg")
        placed = [_gpus(c) for c in s.commands[:-1]]
        flat = [g for ids in placed for g in ids]
        assert flat == list(range(d.total_gpus))  # each GPU once, consecutive per worker
        sizes = [len(ids) for ids in placed]
        ranks = {r: y["tensor_parallel_size"] * y["pipeline_parallel_size"] for r, y in s.roles.items()}
        per_worker = [ranks["context"]] * d.prefill.workers + [ranks["generation"]] * d.decode.workers
        assert sizes == per_worker


def test_a_row_whose_gpu_count_is_not_its_workers_sum_is_refused() -> None:
    d = _top("llama_disagg")
    with pytest.raises(SpecError, match=r"search.disaggregated.*counts 5 GPUs, its workers 4"):
        disaggregated_serving(d.model_copy(update={"total_gpus": 5}), "1.2.1", "m", isl=1024, osl=256)
