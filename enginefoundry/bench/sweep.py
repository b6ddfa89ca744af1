"""A sweep of scenarios × concurrency against one endpoint, judged point by point and against the SLOs."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from enginefoundry.bench.aiperf import ToolMissingError, run_point
from enginefoundry.bench.plots import plot_sweep, series_by_scenario
from enginefoundry.bench.report import SLOResult, SweepReport
from enginefoundry.bench.result import BenchPoint, SpeculationPoint, short_output_warning
from enginefoundry.bench.telemetry import Backend, detect_backend, no_gpu
from enginefoundry.errors import ToolError
from enginefoundry.runner import exited_after_error
from enginefoundry.spec import BenchmarkSpec


def meets_slo(point: BenchPoint, spec: BenchmarkSpec) -> bool:
    if not point.valid:
        return False
    if spec.slo.ttft_p95_ms is not None and (point.ttft_ms.p95 or float("inf")) > spec.slo.ttft_p95_ms:
        return False
    return not (spec.slo.itl_p95_ms is not None and (point.itl_ms.p95 or float("inf")) > spec.slo.itl_p95_ms)


def _slo_text(spec: BenchmarkSpec) -> str:
    parts = []
    if spec.slo.ttft_p95_ms is not None:
        parts.append(f"TTFT p95 ≤ {spec.slo.ttft_p95_ms:g} ms")
    if spec.slo.itl_p95_ms is not None:
        parts.append(f"ITL p95 ≤ {spec.slo.itl_p95_ms:g} ms")
    return " and ".join(parts) or "no SLO set (validity only)"


def evaluate_slos(points: list[BenchPoint], spec: BenchmarkSpec) -> list[SLOResult]:
    """Per scenario, the highest concurrency whose point is valid and meets every SLO."""
    out = []
    for scenario in spec.scenarios:
        mine = [p for p in points if p.scenario == scenario.name]
        ok = [p for p in mine if meets_slo(p, spec)]
        if ok:
            best = max(ok, key=lambda p: p.concurrency)
            out.append(SLOResult(scenario=scenario.name, best_concurrency=best.concurrency,
                                 output_tokens_per_s=best.output_tokens_per_s,
                                 detail=f"c={best.concurrency} meets {_slo_text(spec)} at "
                                        f"{best.output_tokens_per_s or 0:.1f} output tok/s"))
            continue
        # Say why, with the closest miss, so "no" comes with a number a platform team can act on.
        valid = [p for p in mine if p.valid]
        if not mine:
            why = "no point was measured"
        elif not valid:
            why = f"none of the {len(mine)} measured point(s) is valid"
        else:
            best_ttft = min(valid, key=lambda p: p.ttft_ms.p95 or float("inf"))
            why = (f"lowest TTFT p95 {best_ttft.ttft_ms.p95 or 0:.0f} ms at c={best_ttft.concurrency}, "
                   f"ITL p95 {best_ttft.itl_ms.p95 or 0:.1f} ms")
        out.append(SLOResult(scenario=scenario.name, best_concurrency=None, output_tokens_per_s=None,
                             detail=f"no valid point meets {_slo_text(spec)}: {why}"))
    return out


def run_sweep(
    spec: BenchmarkSpec, *, url: str, model: str, tokenizer: str, out: Path,
    progress: Callable[[str], None] = print, server_alive: Callable[[], bool] | None = None,
    telemetry: bool | Backend = True, plot_title: str | None = None, extra_inputs: dict[str, str] | None = None,
    draft_counters: Callable[[], tuple[int, int] | None] | None = None, datasets: Mapping[str, Path] | None = None,
) -> SweepReport:
    """Every scenario × concurrency point, in order; never raises for a failed point.

    A failed point is recorded and the sweep goes on while the server lives. A dead server or a missing
    benchmark tool ends it: the remaining points are listed as skipped, with the reason. The same seed
    and scenario give every endpoint the same dataset, which is what makes baselines comparable.
    `telemetry`: True detects the GPU sampler (NVML, nvidia-smi, or an explicit "no GPU"); False skips it.
    `extra_inputs`: fields added to every request (e.g. {"ignore_eos": "true"} for servers that have it).
    `draft_counters`: a speculative server's (drafted, accepted) draft tokens so far, read before and after each
    point: the point records the difference (`BenchPoint.speculation`).
    `datasets`: a scenario's requests as a custom dataset file, by scenario name (AIPerf; bench/mix.py).
    """
    t0 = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    backend = (detect_backend() if telemetry is True else telemetry) if telemetry else None
    sample_with = backend if backend is not None and backend.source != "none" else None
    labels = [(scenario, c) for scenario in spec.scenarios for c in spec.concurrency]
    points: list[BenchPoint] = []
    exports: list[str] = []
    failures: list[str] = []
    for i, (scenario, c) in enumerate(labels):
        label = f"{scenario.name}-c{c}"
        rest = [f"{s.name}-c{cc}" for s, cc in labels[i:]]
        if server_alive is not None and not server_alive():
            failures.append(f"the server died before {label}; remaining points skipped: {', '.join(rest)}")
            break
        progress(f"bench: {label} ({spec.request_count} requests, {spec.tool.value})")
        before = draft_counters() if draft_counters is not None else None
        try:
            point, export = run_point(spec, scenario, c, url=url, model=model, tokenizer=tokenizer,
                                      out=out / label, progress=progress, telemetry=sample_with,
                                      extra_inputs=extra_inputs, input_file=(datasets or {}).get(scenario.name))
        except ToolMissingError as err:
            failures.append(f"{label}: {err}; remaining points skipped: {', '.join(rest[1:]) or 'none'}")
            break
        except ToolError as err:
            failures.append(f"{label}: {str(err).splitlines()[0]}")
            if server_alive is not None and exited_after_error(server_alive):
                failures.append(f"the server died during {label}; remaining points skipped: "
                                f"{', '.join(rest[1:]) or 'none'}")
                break
            continue
        if backend is not None and sample_with is None:
            point = point.with_telemetry(no_gpu(backend.detail))
        after = draft_counters() if draft_counters is not None else None
        if before is not None and after is not None:
            point = point.model_copy(update={"speculation": SpeculationPoint(
                drafted=after[0] - before[0], accepted=after[1] - before[1])})
        points.append(point)
        exports.append(str(export))
        verdict = "valid" if point.valid else "INVALID: " + "; ".join(point.problems)
        verdict += "".join(f" (warning: {w})" for w in point.warnings)
        progress(f"bench: {label}: {point.output_tokens_per_s or 0:.1f} out tok/s, "
                 f"TTFT p95 {point.ttft_ms.p95 or 0:.0f} ms, {verdict}")
    warnings = [w for w in [short_output_warning(points, {s.name: s.output_tokens_mean for s in spec.scenarios})] if w]
    for w in warnings:
        progress(f"bench: warning: {w}")
    plots = []
    if plot_title is not None and any(p.valid for p in points):
        plots.append(str(plot_sweep(series_by_scenario(points), out / "sweep.png", plot_title)))
    report = SweepReport(points=points, slo=evaluate_slos(points, spec), exports=exports,
                         duration_s=round(time.monotonic() - t0, 2), failures=failures,
                         telemetry=_telemetry_note(backend), plots=plots, warnings=warnings)
    (out / "sweep.json").write_text(json.dumps(report.model_dump(mode="json"), indent=2))
    return report


def _telemetry_note(backend: Backend | None) -> str:
    if backend is None:
        return ""  # not sampled (a cpu target): nothing to say about GPUs
    if backend.source == "none":
        return f"no GPU: {backend.detail}"
    return f"{backend.detail}, GPUs {backend.gpus}"
