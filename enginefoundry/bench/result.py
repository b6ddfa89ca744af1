"""One normalized benchmark result, whatever tool produced it, and the validity rules.

Both AIPerf and genai-perf exit 0 after runs full of errors (facts/benchmark-tools.md §6), so a
point is valid only when its own numbers say the run was complete and clean.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from enginefoundry.bench.telemetry import TelemetrySummary
from enginefoundry.schemas.loose import AiperfExport


class Percentiles(BaseModel):
    avg: float | None = None
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None


class SpeculationPoint(BaseModel):
    """A speculative unit's point: the draft tokens its server proposed and accepted during the point (warm-up
    requests included), and the speed-up over the same unit without speculation at the same scenario and
    concurrency (its twin's output tokens/s)."""

    drafted: int = 0
    accepted: int = 0
    twin_output_tokens_per_s: float | None = None

    @property
    def acceptance_rate(self) -> float | None:
        return round(self.accepted / self.drafted, 6) if self.drafted else None

    def speedup(self, output_tokens_per_s: float | None) -> float | None:
        if not output_tokens_per_s or not self.twin_output_tokens_per_s:
            return None
        return round(output_tokens_per_s / self.twin_output_tokens_per_s, 4)


class BenchPoint(BaseModel):
    tool: str
    command: str = ""  # the benchmark client's exact command line
    tool_version: str | None = None
    scenario: str
    concurrency: int
    requested: int
    completed: int
    errors: int
    error_rate: float  # fraction 0..1
    complete: bool
    output_tokens_per_s: float | None
    requests_per_s: float | None
    ttft_ms: Percentiles
    itl_ms: Percentiles
    latency_ms: Percentiles
    input_len_avg: float | None
    output_len_avg: float | None
    duration_s: float | None = None
    problems: list[str] = Field(default_factory=list)  # any problem makes the point invalid
    warnings: list[str] = Field(default_factory=list)  # trustworthy numbers, but not for the asked workload
    # GPU power and use during the point's measured window; None when no sampling was asked for,
    # a summary with available=False ("no GPU") when it was and there is none.
    telemetry: TelemetrySummary | None = None
    output_tokens_per_s_per_watt: float | None = None
    speculation: SpeculationPoint | None = None  # a speculative unit's acceptance and speed-up

    @property
    def valid(self) -> bool:
        return not self.problems

    def metrics(self) -> dict[str, float]:
        """Flat numbers for MLflow (step = concurrency)."""
        out: dict[str, float] = {
            "completed": self.completed, "error_rate": self.error_rate, "valid": float(self.valid),
        }
        for name, value in (("output_tokens_per_s", self.output_tokens_per_s),
                            ("requests_per_s", self.requests_per_s)):
            if value is not None:
                out[name] = value
        for prefix, pct in (("ttft_ms", self.ttft_ms), ("itl_ms", self.itl_ms), ("latency_ms", self.latency_ms)):
            for q in ("p50", "p95", "p99"):
                v = getattr(pct, q)
                if v is not None:
                    out[f"{prefix}_{q}"] = v
        if self.telemetry is not None:
            out.update(self.telemetry.metrics())
        if self.output_tokens_per_s_per_watt is not None:
            out["output_tokens_per_s_per_watt"] = self.output_tokens_per_s_per_watt
        if self.speculation is not None:
            sp = self.speculation
            out.update({"spec_drafted_tokens": sp.drafted, "spec_accepted_tokens": sp.accepted})
            for name, value in (("spec_acceptance_rate", sp.acceptance_rate),
                                ("spec_twin_output_tokens_per_s", sp.twin_output_tokens_per_s),
                                ("spec_speedup", sp.speedup(self.output_tokens_per_s))):
                if value is not None:
                    out[name] = value
        return out

    def with_telemetry(self, summary: TelemetrySummary) -> BenchPoint:
        """Attach the GPU summary and the efficiency figure that needs both halves."""
        per_watt = None
        if summary.avg_power_w and self.output_tokens_per_s is not None:
            per_watt = round(self.output_tokens_per_s / summary.avg_power_w, 4)
        return self.model_copy(update={"telemetry": summary, "output_tokens_per_s_per_watt": per_watt})


def validate(point: BenchPoint, expected_output_len: int | None = None) -> BenchPoint:
    """Fill `problems` with every reason the point cannot be trusted."""
    problems = []
    if point.errors > 0 or point.error_rate > 0:
        problems.append(f"{point.errors} request(s) failed (error rate {point.error_rate:.1%})")
    if not point.complete:
        problems.append("the run did not complete")
    if point.completed < point.requested:
        problems.append(f"only {point.completed} of {point.requested} requests completed")
    if point.output_tokens_per_s is None or point.ttft_ms.p95 is None:
        problems.append("throughput or TTFT missing from the export")
    if expected_output_len and point.output_len_avg and point.output_len_avg > 4 * expected_output_len:
        problems.append(
            f"output length {point.output_len_avg:.0f} ≫ requested {expected_output_len}: "
            "the server ignored the max-tokens field"
        )
    # Answers shorter than asked for are not a problem of one point but of the run: short_output_warning.
    return point.model_copy(update={"problems": problems})


def short_output_warning(points: list[BenchPoint], requested: dict[str, int]) -> str | None:
    """One warning for the run when the answers are under half the scenarios' output length (a chat model
    that stops at end-of-sequence; transformers serve has no ignore_eos): the measured and requested
    lengths per scenario, and what that means for the figures. `requested`: scenario → output_tokens_mean."""
    short: dict[str, list[float]] = {}
    for p in points:
        want = requested.get(p.scenario)
        if want and p.output_len_avg is not None and p.output_len_avg < want / 2:
            short.setdefault(p.scenario, []).append(p.output_len_avg)
    if not short:
        return None
    lengths = "; ".join(f"{name}: {min(got):.1f}–{max(got):.1f} tokens (mean per point) vs {requested[name]} "
                        f"requested, {len(got)} point(s)" for name, got in short.items())
    return (f"answers shorter than requested ({lengths}): the server stopped at end-of-sequence, so throughput "
            "and latency are for shorter answers than the scenario and compare only with runs of the same "
            "server and model, not with runs that generate the full length (send ignore_eos through "
            "benchmark.extra_inputs where the server supports it)")


def pct(data: AiperfExport, key: str) -> Percentiles:
    m = data.get(key) or {}
    return Percentiles(avg=m.get("avg"), p50=m.get("p50"), p95=m.get("p95"), p99=m.get("p99"))


def avg(data: AiperfExport, key: str) -> float | None:
    m = data.get(key)
    return None if not m else m.get("avg")
