"""The benchmark stage: a sweep of scenarios × concurrency against one endpoint, SLOs, plots."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from enginefoundry.bench.aiperf import run_point
from enginefoundry.bench.parsers import parse_aiperf, parse_genai_perf
from enginefoundry.bench.result import BenchPoint
from enginefoundry.errors import ToolError
from enginefoundry.spec import BenchmarkSpec

__all__ = ["BenchPoint", "SweepReport", "parse_aiperf", "parse_genai_perf", "run_sweep"]


class SLOResult(BaseModel):
    scenario: str
    best_concurrency: int | None  # highest concurrency meeting the SLOs; None when no point meets them
    output_tokens_per_s: float | None
    detail: str


class SweepReport(BaseModel):
    points: list[BenchPoint]
    slo: list[SLOResult]
    exports: list[str]
    duration_s: float
    failures: list[str] = []

    @property
    def valid(self) -> bool:
        return bool(self.points) and all(p.valid for p in self.points) and not self.failures

    def summary(self) -> dict[str, float]:
        best = max((p.output_tokens_per_s or 0.0 for p in self.points if p.valid), default=0.0)
        return {"bench_points": len(self.points), "bench_valid": float(self.valid),
                "bench_best_output_tokens_per_s": best}


def meets_slo(point: BenchPoint, spec: BenchmarkSpec) -> bool:
    if not point.valid:
        return False
    if spec.slo.ttft_p95_ms is not None and (point.ttft_ms.p95 or float("inf")) > spec.slo.ttft_p95_ms:
        return False
    return not (spec.slo.itl_p95_ms is not None and (point.itl_ms.p95 or float("inf")) > spec.slo.itl_p95_ms)


def evaluate_slos(points: list[BenchPoint], spec: BenchmarkSpec) -> list[SLOResult]:
    out = []
    for scenario in spec.scenarios:
        ok = [p for p in points if p.scenario == scenario.name and meets_slo(p, spec)]
        if ok:
            best = max(ok, key=lambda p: p.concurrency)
            out.append(SLOResult(scenario=scenario.name, best_concurrency=best.concurrency,
                                 output_tokens_per_s=best.output_tokens_per_s,
                                 detail=f"c={best.concurrency} meets the SLOs at "
                                        f"{best.output_tokens_per_s or 0:.1f} output tok/s"))
        else:
            out.append(SLOResult(scenario=scenario.name, best_concurrency=None, output_tokens_per_s=None,
                                 detail="no valid point meets the SLOs"))
    return out


def run_sweep(
    spec: BenchmarkSpec, *, url: str, model: str, tokenizer: str, out: Path,
    progress: Callable[[str], None] = print, server_alive: Callable[[], bool] | None = None,
) -> SweepReport:
    """Every scenario × concurrency point, in order. A failed point is recorded, the sweep goes on while
    the server lives; the same seed and scenario give every endpoint the same dataset."""
    t0 = time.monotonic()
    points: list[BenchPoint] = []
    exports: list[str] = []
    failures: list[str] = []
    for scenario in spec.scenarios:
        for c in spec.concurrency:
            label = f"{scenario.name}-c{c}"
            progress(f"bench: {label} ({spec.request_count} requests, {spec.tool.value})")
            try:
                point, export = run_point(spec, scenario, c, url=url, model=model, tokenizer=tokenizer,
                                          out=out / label, progress=progress)
            except ToolError as err:
                failures.append(f"{label}: {str(err).splitlines()[0]}")
                if server_alive is not None and not server_alive():
                    failures.append("the server died; remaining points skipped")
                    break
                continue
            points.append(point)
            exports.append(str(export))
            verdict = "valid" if point.valid else "INVALID: " + "; ".join(point.problems)
            progress(f"bench: {label}: {point.output_tokens_per_s or 0:.1f} out tok/s, "
                     f"TTFT p95 {point.ttft_ms.p95 or 0:.0f} ms, {verdict}")
        else:
            continue
        break
    report = SweepReport(points=points, slo=evaluate_slos(points, spec), exports=exports,
                         duration_s=round(time.monotonic() - t0, 2), failures=failures)
    (out / "sweep.json").write_text(json.dumps(report.model_dump(mode="json"), indent=2))
    return report
