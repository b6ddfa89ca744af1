"""Issue 37 item 3, the search part: `search.disaggregated` asks the predictor's disaggregated search (AIConfigurator
0.12.0 `serving_mode: disagg`) beside the aggregated one, its rows (prefill and decode workers and their parallelism,
ColumnsDisagg) are read from a real output (tests/fixtures/aiconfigurator-disagg, SOURCE.md says how it was made) and
ranked beside the aggregated configurations per target; a disaggregated configuration is listed, never built as some
other shape."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from enginefoundry.search.plan import SearchReport, _choose, disagg_lines, rows, searched_units
from enginefoundry.search.predictor import (
    Coverage,
    Predicted,
    Prediction,
    Request,
    disagg_experiment,
    experiment,
    read_experiment,
    requests_for,
)
from enginefoundry.spec import BuildSpec, Precision, parse_spec
from tests.support.paths import CONFIGS, FIXTURES

DISAGG = FIXTURES / "aiconfigurator-disagg"
COV = Coverage(True, system="h100_sxm", backend="trtllm", db_version="1.3.0rc20")


def _spec(disaggregated: bool | None = True) -> BuildSpec:
    data = yaml.safe_load((CONFIGS / "llama-3.1-8b-search.yaml").read_text())
    data["search"]["precisions"] = ["bf16"]
    if disaggregated is not None:
        data["search"]["disaggregated"] = disaggregated
    return parse_spec(data, base_dir=CONFIGS)


def _request(spec: BuildSpec, disagg: bool) -> Request:
    assert spec.search is not None
    return next(r for r in requests_for(spec.search, spec.targets[0], COV, "digest") if r.disagg is disagg)


def _read(name: str, r: Request, tmp_path: Path) -> Prediction:
    run = tmp_path / "out" / "run"
    run.mkdir(parents=True, exist_ok=True)
    shutil.copytree(DISAGG / name, run / name)
    return read_experiment(tmp_path / "out", name, r, "k", 1.0, 0, "")


def test_disaggregated_search_is_off_by_default_and_asked_beside_the_aggregated_one(tmp_path: Path) -> None:
    off = _spec(None)
    assert off.search is not None and off.search.disaggregated is False
    (agg,) = requests_for(off.search, off.targets[0], COV, "digest")
    on = _spec(True)
    assert on.search is not None
    both = requests_for(on.search, on.targets[0], COV, "digest")
    assert [r.disagg for r in both] == [False, True]
    # The aggregated request keeps its cache key; the disaggregated one has its own.
    assert both[0].key("v") == agg.key("v") != both[1].key("v")
    exp = disagg_experiment(both[1], tmp_path)
    assert exp["serving_mode"] == "disagg" and exp["total_gpus"] == 8
    for role in ("prefill", "decode"):
        assert exp[f"{role}_model_path"] == str(tmp_path)  # type: ignore[literal-required]
        assert exp[f"{role}_system_name"] == "h100_sxm"  # type: ignore[literal-required]
        assert exp[f"{role}_backend_version"] == "1.3.0rc20"  # type: ignore[literal-required]
        assert exp[f"{role}_gemm_quant_mode"] == "bfloat16"  # type: ignore[literal-required]
    # The aggregated experiment is unchanged (the same keys as before the field).
    assert set(experiment(both[0], tmp_path)) == {
        "serving_mode", "model_path", "system_name", "backend_name", "backend_version", "isl", "osl", "ttft",
        "tpot", "total_gpus", "gemm_quant_mode", "agg_tp_candidates", "agg_pp_candidates"}


def test_a_real_disaggregated_output_is_read_into_prefill_and_decode_workers(tmp_path: Path) -> None:
    spec = _spec()
    r = _request(spec, True)
    qwen = _read("qwen_disagg", r, tmp_path)
    assert qwen.disagg and not qwen.problem and len(qwen.ranked) == 11 and len(qwen.pareto) == 29
    top = qwen.ranked[0]
    assert top.disagg is not None
    p, d = top.disagg.prefill, top.disagg.decode
    assert (p.workers, p.tp, p.dp, p.moe_tp, p.moe_ep, p.batch_size) == (2, 1, 2, 1, 2, 1)
    assert (d.workers, d.tp, d.dp, d.moe_tp, d.moe_ep, d.batch_size) == (1, 1, 4, 2, 2, 176)
    assert top.gpus == top.disagg.total_gpus == 8 == p.gpus + d.gpus
    assert (top.tokens_per_s_gpu, top.tokens_per_s_user, top.ttft_ms, top.concurrency) == (
        3802.982, 52.889, 54.526, 704)
    assert top.label() == "bf16 disagg P 2×tp1pp1dp2 etp1ep2 bs1 + D 1×tp1pp1dp4 etp2ep2 bs176"
    llama = _read("llama_disagg", r, tmp_path)
    assert [(c.disagg.prefill.workers, c.disagg.decode.workers, c.disagg.decode.tp, c.gpus)
            for c in llama.ranked if c.disagg] == [(2, 1, 2, 4), (1, 1, 1, 2), (4, 1, 4, 8)]


def test_a_replica_larger_than_the_target_is_dropped_and_no_rows_is_a_problem_of_its_own(tmp_path: Path) -> None:
    spec = _spec()
    r = _request(spec, True)
    small = Request(**{**r.__dict__, "max_gpus_per_replica": 4})
    llama = _read("llama_disagg", small, tmp_path)
    assert [c.gpus for c in llama.ranked] == [4, 2]
    none = read_experiment(tmp_path / "empty", "e1_bf16_disagg", r, "k", 1.0, 0, "")
    assert none.disagg and none.problem.startswith("no configuration meets TTFT ≤ 300 ms")
    ts = _choose(spec, spec.targets[0], COV, [none], "aiconfigurator")
    assert ts.problems == {"bf16 disagg": none.problem}


def test_disaggregated_configurations_rank_beside_aggregated_ones_and_the_best_become_units(tmp_path: Path) -> None:
    spec = _spec()
    agg = [Predicted(precision=Precision.BF16, tp=tp, pp=1, batch_size=bs, concurrency=bs, tokens_per_s_gpu=tok,
                     tokens_per_s_user=50.0, ttft_ms=200.0, tpot_ms=19.0)
           for tp, bs, tok in ((1, 96, 4969.0), (2, 128, 4100.0))]
    disagg = _read("llama_disagg", _request(spec, True), tmp_path)
    ts = _choose(spec, spec.targets[0], COV, [Prediction(key="a", precision=Precision.BF16, ranked=agg, pareto=[]),
                                               disagg], "aiconfigurator")
    by_rank = [(c.rank, c.predicted.disagg is not None, round(c.predicted.tokens_per_s_gpu)) for c in ts.candidates]
    assert by_rank == [(1, False, 4969), (2, True, 4455), (3, True, 4455), (4, True, 4136), (5, False, 4100)]
    # top_k 2 by the objective, whatever the serving: the best aggregated and the best disaggregated configuration.
    unit = "bf16-disagg-p2xtp1b1-d1xtp2b304.search-b304.h100"
    assert ts.units == ["bf16-tp1.search-b96.h100", unit]
    assert [c.verdict for c in ts.candidates] == ["unit", "unit", "below top_k", "below top_k", "below top_k"]
    (_, searched) = searched_units(spec, SearchReport(objective=spec.search.objective, targets=[ts], seconds=0.0))
    assert searched.variant.disaggregated == ts.candidates[1].predicted.disagg and searched.variant.gpus == 4
    assert "bf16 disagg" in ts.pareto and "bf16" not in ts.pareto
    report = SearchReport(objective=spec.search.objective, targets=[ts], seconds=0.0)  # type: ignore[union-attr]
    table = rows(report)
    assert table[1]["config"] == "bf16 disagg P 2×tp1pp1 bs1 + D 1×tp2pp1 bs304"
    assert table[1]["tok/s/GPU"] == "4455" and table[1]["unit"] == unit
    assert disagg_lines(report) == [
        "h100: 3 disaggregated configuration(s) ranked, best rank 2 4455 tok/s/GPU on 4 GPUs (bf16 disagg P "
        "2×tp1pp1 bs1 + D 1×tp2pp1 bs304); 1 chosen as units (each needs the GPUs of both roles: its workers and "
        "the router start on the target's worker)"]
    # --json carries each role's workers and parallelism.
    dumped = report.model_dump(mode="json")["targets"][0]["candidates"][1]["predicted"]["disagg"]
    assert dumped["prefill"]["workers"] == 2 and dumped["decode"]["tp"] == 2 and dumped["total_gpus"] == 4


def test_a_moe_table_shows_a_disaggregated_replicas_gpus_and_each_roles_parallelism_in_its_label(
        tmp_path: Path) -> None:
    spec = _spec()
    qwen = _read("qwen_disagg", _request(spec, True), tmp_path)
    ts = _choose(spec, spec.targets[0], COV, [qwen], "aiconfigurator")
    table = rows(SearchReport(objective=spec.search.objective, targets=[ts], seconds=0.0,  # type: ignore[union-attr]
                              experts=128))
    first = table[0]
    assert (first["dp"], first["moe_tp"], first["moe_ep"], first["GPUs"]) == ("-", "-", "-", "8")
    assert "D 1×tp1pp1dp4 etp2ep2 bs176" in first["config"]
    # Distinct rows stay distinct (same throughput, different decode expert split).
    assert len({c.predicted.label() for c in ts.candidates}) == len(ts.candidates) == 11


@pytest.mark.parametrize("value", ["yes please", 3])
def test_the_field_is_a_boolean(value: object) -> None:
    from enginefoundry.errors import SpecError

    data = yaml.safe_load((CONFIGS / "llama-3.1-8b-search.yaml").read_text())
    data["search"]["disaggregated"] = value
    with pytest.raises(SpecError, match="disaggregated"):
        parse_spec(data, base_dir=CONFIGS)


def test_on_lane_trtllm_a_disaggregated_row_carries_its_serving_files_or_the_releases_refusal(tmp_path: Path) -> None:
    spec = _spec()  # lane trtllm, toolchain 1.2.1
    disagg = _read("llama_disagg", _request(spec, True), tmp_path)
    ts = _choose(spec, spec.targets[0], COV, [disagg], "aiconfigurator")
    serving = ts.candidates[0].serving
    assert serving is not None and serving["release"] == "1.2.1"
    assert serving["disagg_config.yaml"]["context_servers"]["num_instances"] == 2
    assert serving["context.yaml"]["disable_overlap_scheduler"] is True
    assert serving["generation.yaml"]["tensor_parallel_size"] == 2
    assert serving["commands"][-1] == ["trtllm-serve", "disaggregated", "--config_file", "disagg_config.yaml"]
    old = spec.model_copy(update={"toolchain": spec.toolchain.model_copy(update={"trtllm_version": "1.0.0rc3"})})
    refused = _choose(old, old.targets[0], COV, [disagg], "aiconfigurator").candidates[0]
    assert refused.serving is None and refused.unit == "-"
    assert refused.verdict.startswith("not a unit: toolchain.trtllm_version: TensorRT-LLM 1.0.0rc3 has no "
                                      "cache_transceiver_config")
    assert "pin toolchain.trtllm_version ≥ 1.0.0rc4" in refused.verdict


@pytest.mark.parametrize(("change", "verdict"), [
    ({"lane": "reference"}, "not a unit: lane reference serves a unit as one server (lane trtllm serves "
                            "disaggregated)"),
    ({"toolchain": {}}, "unit"),  # unpinned: a unit whose keys the worker's probe decides
])
def test_without_lane_trtllm_or_a_pinned_release_a_disaggregated_row_has_no_serving_files(
        tmp_path: Path, change: dict[str, object], verdict: str) -> None:
    data = yaml.safe_load((CONFIGS / "llama-3.1-8b-search.yaml").read_text())
    data["search"].update(precisions=["bf16"], disaggregated=True)
    data.update(change)
    spec = parse_spec(data, base_dir=CONFIGS)
    disagg = _read("llama_disagg", _request(spec, True), tmp_path)
    (first, *_) = _choose(spec, spec.targets[0], COV, [disagg], "aiconfigurator").candidates
    assert first.serving is None and first.verdict == verdict
