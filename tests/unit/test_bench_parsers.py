"""AIPerf and genai-perf exports → one normalized result; a bad run is invalid whatever the exit code."""

from __future__ import annotations

import copy
import json

import pytest

from enginefoundry.bench import evaluate_slos, parse_aiperf, parse_genai_perf
from enginefoundry.bench.report import SweepReport
from enginefoundry.bench.result import short_output_warning
from enginefoundry.spec import BenchmarkSpec
from tests.support.paths import REPO

FIX = REPO / "tests" / "fixtures" / "benchmarks"
AIPERF = json.loads((FIX / "aiperf-0.13.0" / "transformers-serve-c4" / "profile_export_aiperf.json").read_text())


def test_aiperf_export_is_normalized():
    p = parse_aiperf(AIPERF, scenario="s", concurrency=4, requested=50, expected_output_len=32)
    assert p.valid, p.problems
    assert p.tool == "aiperf" and p.tool_version == "0.13.0"
    assert p.completed == 50 and p.errors == 0 and p.error_rate == 0
    assert p.output_tokens_per_s == pytest.approx(28.309, rel=1e-3)
    assert p.ttft_ms.p95 == AIPERF["time_to_first_token"]["p95"]
    assert p.itl_ms.p50 == AIPERF["inter_token_latency"]["p50"]
    assert p.output_len_avg == 32.0 and p.input_len_avg == pytest.approx(63.48)


@pytest.mark.parametrize("folder", ["transformers-serve-c4", "llama-cpp-server-c4"])
def test_genai_perf_exports_are_normalized(folder):
    data = json.loads((FIX / "genai-perf-0.0.16" / folder / "profile_export_genai_perf.json").read_text())
    p = parse_genai_perf(data, scenario="s", concurrency=4, requested=int(data["request_count"]["avg"]))
    assert p.tool == "genai-perf"
    assert p.output_tokens_per_s == data["output_token_throughput"]["avg"]
    assert p.ttft_ms.p99 == data["time_to_first_token"]["p99"]
    assert p.valid, p.problems


def test_genai_perf_reporting_fewer_requests_is_invalid():
    data = json.loads((FIX / "genai-perf-0.0.16" / "transformers-serve-c4" / "profile_export_genai_perf.json")
                      .read_text())
    data["request_count"]["avg"] = 1  # what genai-perf reported after a run full of aborted streams
    p = parse_genai_perf(data, scenario="s", concurrency=4, requested=50)
    assert not p.valid and "only 1 of 50 requests completed" in p.problems


@pytest.mark.parametrize(("patch", "problem"), [
    ({"error_request_count": {"avg": 3.0}, "request_error_rate": {"avg": 6.0}}, "3 request(s) failed"),
    ({"is_complete": False}, "the run did not complete"),
    ({"was_cancelled": True}, "the run did not complete"),
    ({"completed_request_count": {"avg": 49.0}}, "only 49 of 50 requests completed"),
    ({"output_sequence_length": {"avg": 4105.0}}, "server ignored the max-tokens field"),
])
def test_bad_aiperf_runs_are_invalid(patch, problem):
    data = copy.deepcopy(AIPERF)
    data.update(patch)
    p = parse_aiperf(data, scenario="s", concurrency=4, requested=50, expected_output_len=32)
    assert not p.valid
    assert any(problem in msg for msg in p.problems), p.problems


def test_slo_picks_highest_concurrency_that_meets_it():
    spec = BenchmarkSpec(scenarios=[{"name": "s", "input_tokens_mean": 64, "output_tokens_mean": 32}],
                         concurrency=[1, 4], slo={"ttft_p95_ms": 60_000})
    low = parse_aiperf(AIPERF, scenario="s", concurrency=1, requested=50)
    high = parse_aiperf(AIPERF, scenario="s", concurrency=4, requested=50)
    (res,) = evaluate_slos([low, high], spec)
    assert res.best_concurrency == 4
    strict = spec.model_copy(update={"slo": spec.slo.model_copy(update={"ttft_p95_ms": 1.0})})
    (none,) = evaluate_slos([low, high], strict)
    assert none.best_concurrency is None and "no valid point" in none.detail


def test_answers_that_stop_at_eos_give_one_warning_for_the_run_not_one_per_point():
    """Issue 25: the default spec warned on every point; now the run says once what was measured vs asked."""
    data = copy.deepcopy(AIPERF)
    data["output_sequence_length"] = {"avg": 6.1}
    points = [parse_aiperf(data, scenario="s", concurrency=c, requested=50, expected_output_len=32) for c in (1, 4, 8)]
    assert all(p.valid and p.warnings == [] for p in points)
    points[1] = points[1].model_copy(update={"output_len_avg": 9.5})
    full = parse_aiperf(AIPERF, scenario="long", concurrency=1, requested=50, expected_output_len=32)
    warning = short_output_warning([*points, full], {"s": 32, "long": 32})
    assert warning is not None
    assert "s: 6.1–9.5 tokens (mean per point) vs 32 requested, 3 point(s)" in warning
    assert "long" not in warning.split("):")[0]  # a scenario at full length is not named
    assert "throughput and latency are for shorter answers than the scenario" in warning
    assert short_output_warning([full], {"long": 32}) is None
    report = SweepReport(points=[*points, full], slo=[], exports=[], duration_s=1.0, warnings=[warning])
    assert report.slo_markdown().count("shorter than requested") == 1


def test_aiperf_command_carries_extra_inputs_and_the_same_seed(tmp_path):
    from enginefoundry.bench.aiperf import aiperf_argv

    spec = BenchmarkSpec(scenarios=[{"name": "s", "input_tokens_mean": 64, "output_tokens_mean": 32}],
                         concurrency=[4], seed=7)
    argv = aiperf_argv(spec, spec.scenarios[0], 4, url="http://127.0.0.1:1", model="m", tokenizer="t",
                       out=tmp_path, extra_inputs={"ignore_eos": "true", "min_tokens": "32"})
    assert argv[argv.index("--random-seed") + 1] == "7"
    assert argv[-4:] == ["--extra-inputs", "ignore_eos:true", "--extra-inputs", "min_tokens:32"]
    assert "--ui" in argv and "--no-gpu-telemetry" in argv


def test_missing_genai_perf_names_the_install(tmp_path, monkeypatch):
    from enginefoundry.bench import ToolMissingError
    from enginefoundry.bench import aiperf as tool

    monkeypatch.setattr(tool.shutil, "which", lambda name: None)
    spec = BenchmarkSpec(tool="genai-perf", scenarios=[{"name": "s", "input_tokens_mean": 8, "output_tokens_mean": 8}],
                         concurrency=[1])
    with pytest.raises(ToolMissingError, match=r"benchmark tool 'genai-perf' is not installed: pip install genai-perf"):
        tool.run_point(spec, spec.scenarios[0], 1, url="http://127.0.0.1:1", model="m", tokenizer="t", out=tmp_path)


def test_aiperf_mmap_leftovers_of_this_run_only_are_removed(tmp_path):
    import shutil
    import tempfile
    import uuid
    from pathlib import Path

    from enginefoundry.bench.aiperf import remove_aiperf_leftovers

    mine, other = uuid.uuid4().hex[:12], uuid.uuid4().hex[:12]
    root = Path(tempfile.gettempdir())
    for bid in (mine, other):
        (root / f"aiperf_mmap_{bid}").mkdir()
    try:
        # A run that died before its export: the id is only in its own log (what AIPerf 0.13 writes).
        (tmp_path / "logs").mkdir()
        (tmp_path / "logs" / "aiperf.log").write_text(
            f"INFO  mmap data_file_path=PosixPath('{root}/aiperf_mmap_{mine}/dataset.dat')\n")
        removed = remove_aiperf_leftovers(tmp_path)
        assert removed == [root / f"aiperf_mmap_{mine}"]
        assert not (root / f"aiperf_mmap_{mine}").exists() and (root / f"aiperf_mmap_{other}").exists()
    finally:
        for bid in (mine, other):
            shutil.rmtree(root / f"aiperf_mmap_{bid}", ignore_errors=True)


def test_sweep_table_and_slo_markdown_read_well():
    from enginefoundry.bench import SweepReport

    spec = BenchmarkSpec(scenarios=[{"name": "s", "input_tokens_mean": 64, "output_tokens_mean": 32}],
                         concurrency=[4], slo={"ttft_p95_ms": 1.0, "itl_p95_ms": 50})
    point = parse_aiperf(AIPERF, scenario="s", concurrency=4, requested=50, expected_output_len=32)
    report = SweepReport(points=[point], slo=evaluate_slos([point], spec), exports=[], duration_s=1.0,
                         telemetry="no GPU: nvidia-smi is not on PATH")
    (row,) = report.table()
    assert row["concurrency"] == 4 and row["valid"] is True and row["completed"] == "50/50"
    assert row["output_tok_s"] == pytest.approx(28.31, abs=0.01) and row["problems"] == ""
    md = report.slo_markdown()
    assert "| s | NO | - | - | no valid point meets TTFT p95 ≤ 1 ms and ITL p95 ≤ 50 ms: lowest TTFT p95 " in md
    assert md.rstrip().endswith("GPU telemetry: no GPU: nvidia-smi is not on PATH")
