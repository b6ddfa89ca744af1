"""GPU telemetry: parsing real nvidia-smi output, summaries, tokens/s per watt, and an explicit "no GPU".

The live test samples a real GPU under load where one exists (`-m gpu`) and is skipped elsewhere.
"""

from __future__ import annotations

import json
import time

import pytest

from enginefoundry.bench import parse_aiperf
from enginefoundry.bench.telemetry import (
    Backend,
    GpuSampler,
    TelemetrySummary,
    aiperf_window,
    detect_backend,
    no_gpu,
    parse_query_gpu,
    summarize,
)
from tests.support.paths import REPO

GPU = REPO / "tests" / "fixtures" / "gpu"
H200_QUERY = (GPU / "telemetry-h200-query-gpu.csv").read_text()
AIPERF = json.loads((REPO / "tests" / "fixtures" / "benchmarks" / "aiperf-0.13.0" / "transformers-serve-c4"
                     / "profile_export_aiperf.json").read_text())


def test_h200_query_with_header_and_units_is_parsed_by_column_name():
    (s,) = parse_query_gpu(H200_QUERY)  # 15 columns, units in header and values ("127.08 W", "0 MiB")
    assert (s.index, s.power_w, s.util_pct, s.memory_used_mib) == (0, 127.08, 0.0, 0.0)


def test_noheader_nounits_lines_in_query_order_form_rounds():
    # What the sampler's own query prints: index, power.draw, utilization.gpu, memory.used, one line per GPU.
    text = "0, 127.08, 0, 0\n1, 131.50, 5, 812\n0, 402.11, 97, 70123\n1, 395.00, 95, 70001\n"
    samples = parse_query_gpu(text, t0=100.0, dt=0.2)
    assert [(s.index, s.round) for s in samples] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert samples[2].t == pytest.approx(100.2)
    summary = summarize(samples, source="nvidia-smi")
    # Power is summed over GPUs within a round, then averaged over rounds.
    assert summary.avg_power_w == pytest.approx(((127.08 + 131.50) + (402.11 + 395.00)) / 2, abs=0.01)
    assert summary.max_power_w == pytest.approx(797.11)
    assert summary.avg_util_pct == pytest.approx((0 + 5 + 97 + 95) / 4)
    assert summary.max_memory_used_mib == 70123 and summary.gpus == [0, 1] and summary.samples == 4


def test_real_h200_capture_under_load():
    # `nvidia-smi --query-gpu=index,power.draw,utilization.gpu,memory.used --format=csv,noheader,nounits -lms 200`
    # captured on an H200 around 3 s of bf16 8192² matmuls: idle, load, idle.
    text = (GPU / "telemetry-h200-lms-under-load.csv").read_text()
    samples = parse_query_gpu(text, t0=0.0, dt=0.2)
    assert len(samples) == 55 and samples[-1].round == 54  # one GPU: every line is a round
    busy = [s for s in samples if (s.util_pct or 0) > 50]
    whole = summarize(samples, source="nvidia-smi")
    load = summarize(samples, source="nvidia-smi", start=busy[0].t, end=busy[-1].t)
    assert whole.max_power_w == load.max_power_w == 700.73  # at the H200's 700 W limit
    assert load.avg_power_w == pytest.approx(615.94) and load.avg_util_pct == pytest.approx(98.07)
    assert whole.avg_power_w == pytest.approx(245.17)  # idle rounds dilute it: why the window matters
    assert load.max_memory_used_mib == 975.0


def test_not_supported_and_na_values_are_missing_not_zero():
    text = "0, [N/A], 50, 1000\n0, [Not Supported], 60, 2000\n"
    summary = summarize(parse_query_gpu(text), source="nvidia-smi")
    assert summary.available and summary.avg_power_w is None and summary.max_power_w is None
    assert summary.avg_util_pct == 55 and summary.max_memory_used_mib == 2000


def test_the_measured_window_excludes_start_up_idle():
    text = "0, 70, 0, 0\n0, 700, 100, 9000\n0, 690, 99, 9000\n0, 75, 0, 0\n"
    samples = parse_query_gpu(text, t0=10.0, dt=1.0)  # t = 10, 11, 12, 13
    inside = summarize(samples, source="nvml", start=10.5, end=12.5)
    assert inside.avg_power_w == pytest.approx(695.0) and "inside the measured window" in inside.detail
    empty = summarize(samples, source="nvml", start=20.0, end=20.1)
    assert empty.samples == 4 and "no sample inside" in empty.detail


def test_aiperf_window_comes_from_the_export():
    start, end = aiperf_window(AIPERF)
    assert end - start == pytest.approx(56.518, abs=0.01)  # 01:41:19.419 → 01:42:15.937 in the fixture
    assert aiperf_window({"start_time": "garbage"}) is None


def test_tokens_per_watt_and_metrics():
    point = parse_aiperf(AIPERF, scenario="s", concurrency=4, requested=50)
    summary = summarize(parse_query_gpu(H200_QUERY), source="nvidia-smi")
    with_gpu = point.with_telemetry(summary)
    assert with_gpu.output_tokens_per_s_per_watt == pytest.approx(point.output_tokens_per_s / 127.08, rel=1e-3)
    assert with_gpu.metrics()["gpu_avg_power_w"] == 127.08
    assert "output_tokens_per_s_per_watt" in with_gpu.metrics()


def test_no_gpu_is_explicit():
    point = parse_aiperf(AIPERF, scenario="s", concurrency=4, requested=50)
    none = point.with_telemetry(no_gpu("nvidia-smi is not on PATH"))
    assert none.telemetry is not None and not none.telemetry.available
    assert none.telemetry.detail == "no GPU: nvidia-smi is not on PATH"
    assert none.output_tokens_per_s_per_watt is None and "gpu_avg_power_w" not in none.metrics()
    sampler = GpuSampler(Backend(source="none", detail="nvidia-smi is not on PATH"))
    sampler.start()
    assert sampler.stop() == [] and sampler.summary().detail.startswith("no GPU")


def test_this_host_reports_what_it_has():
    backend = detect_backend()
    if backend.source == "none":
        assert "nvidia-smi" in backend.detail  # says why: no NVML library and no nvidia-smi
    else:
        assert backend.gpus


def _load_gpu(seconds: float) -> None:
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        (a @ a).sum().item()


@pytest.mark.gpu
@pytest.mark.parametrize("source", ["nvml", "nvidia-smi"])
def test_live_sampling_under_load(source):
    torch = pytest.importorskip("torch")
    backend = detect_backend()
    if backend.source == "none" or not torch.cuda.is_available():
        pytest.skip(f"needs an NVIDIA GPU: {backend.detail}")
    if source == "nvidia-smi":
        backend = Backend(source="nvidia-smi", detail="forced", gpus=backend.gpus[:1])
    else:
        backend = backend.model_copy(update={"gpus": backend.gpus[:1]})
    sampler = GpuSampler(backend, interval_ms=100)
    sampler.start()
    time.sleep(0.5)
    t0 = time.time()
    _load_gpu(3.0)
    t1 = time.time()
    sampler.stop()
    summary: TelemetrySummary = sampler.summary((t0, t1))
    assert summary.available and summary.source == source, summary
    assert summary.samples >= 10 and "inside the measured window" in summary.detail, summary  # live, not buffered
    assert summary.avg_power_w and summary.avg_power_w > 50, summary
    assert summary.avg_util_pct and summary.avg_util_pct > 50, summary
    assert summary.max_memory_used_mib and summary.max_memory_used_mib > 100, summary
