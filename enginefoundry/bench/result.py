"""One normalized benchmark result, whatever tool produced it, and the validity rules.

Both AIPerf and genai-perf exit 0 after runs full of errors (facts/benchmark-tools.md §6), so a
point is valid only when its own numbers say the run was complete and clean.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class Percentiles(BaseModel):
    avg: float | None = None
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None


class BenchPoint(BaseModel):
    tool: str
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
    problems: list[str] = Field(default_factory=list)

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
        return out


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
    return point.model_copy(update={"problems": problems})


def pct(data: dict[str, Any], key: str) -> Percentiles:
    m = data.get(key) or {}
    return Percentiles(avg=m.get("avg"), p50=m.get("p50"), p95=m.get("p95"), p99=m.get("p99"))


def avg(data: dict[str, Any], key: str) -> float | None:
    m = data.get(key)
    return None if not m else m.get("avg")
