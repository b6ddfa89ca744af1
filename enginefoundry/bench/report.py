"""What a benchmark stage hands back: the sweep, its SLO verdicts and the optional baseline comparison."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from enginefoundry.bench.result import BenchPoint, SpeculationPoint


class ServedFigures(BaseModel):
    """One served model name's part of a sweep against a unit serving the base and its adapters (adapter_mode serve),
    from the server's own counters (the scoring server's GET /v1/adapters) read before and after the sweep, or, where
    the lane's server selects adapters by a request field (lane trtllm), from AIPerf's per-request records
    (bench/mix.py `served_from_records`)."""

    requests: int
    completion_tokens: int
    share: float  # of the sweep's requests
    mean_latency_ms: float | None  # request latency, mean over the sweep: at the server, or as the client saw it
    traffic_share: float | None = None  # the share the spec asked (model.adapters[].traffic_share; bench/mix.py)
    measured_by: Literal["server", "client"] = "server"  # the server's counters, or AIPerf's per-request records


class SLOResult(BaseModel):
    scenario: str
    best_concurrency: int | None  # highest concurrency meeting the SLOs; None when no point meets them
    output_tokens_per_s: float | None
    detail: str

    @property
    def met(self) -> bool:
        return self.best_concurrency is not None


class BestThroughput(BaseModel):
    """THE headline benchmark figure, the one definition used everywhere (summary table, best-profile table,
    MLflow metric `bench_best_output_tokens_per_s`, model-version tag): the most output tokens/s at a concurrency
    that meets the SLOs (per scenario, its highest SLO-meeting concurrency); when the sweep has no SLO results,
    the most output tokens/s over its valid points."""

    output_tokens_per_s: float
    scenario: str | None = None
    concurrency: int | None = None
    within_slo: bool

    def label(self) -> str:
        where = f"{self.scenario} c={self.concurrency}" if self.scenario else f"c={self.concurrency}"
        return f"{self.output_tokens_per_s:.1f} ({where}{', within SLOs' if self.within_slo else ''})"


def best_throughput(bench: dict[str, Any]) -> BestThroughput | None:  # JSON edge: bench summary in manifests
    """From a benchmark summary as manifests and outcomes carry it ({"slo": [...], "points": [...]}). None when
    nothing qualifies: no valid point, or SLOs were checked and no concurrency met them."""
    slo = bench.get("slo") or []
    if slo:
        met = [s for s in slo if s.get("best_concurrency") is not None and s.get("output_tokens_per_s") is not None]
        if not met:
            return None
        top = max(met, key=lambda s: float(s["output_tokens_per_s"]))
        return BestThroughput(output_tokens_per_s=float(top["output_tokens_per_s"]), scenario=top.get("scenario"),
                              concurrency=int(top["best_concurrency"]), within_slo=True)
    valid = [p for p in bench.get("points") or [] if p.get("valid", True) and p.get("output_tokens_per_s") is not None]
    if not valid:
        return None
    top = max(valid, key=lambda p: float(p["output_tokens_per_s"]))
    return BestThroughput(output_tokens_per_s=float(top["output_tokens_per_s"]), scenario=top.get("scenario"),
                          concurrency=int(top["concurrency"]) if top.get("concurrency") is not None else None,
                          within_slo=False)


class ComparisonRow(BaseModel):
    """One sweep point of the unit next to the same point of one baseline endpoint."""

    scenario: str
    concurrency: int
    baseline: str
    unit_output_tokens_per_s: float | None
    baseline_output_tokens_per_s: float | None
    output_tokens_per_s_ratio: float | None  # unit / baseline: > 1 means the unit is faster
    unit_ttft_p95_ms: float | None
    baseline_ttft_p95_ms: float | None
    ttft_p95_ratio: float | None  # unit / baseline: < 1 means the unit answers sooner
    unit_itl_p95_ms: float | None
    baseline_itl_p95_ms: float | None
    itl_p95_ratio: float | None
    note: str = ""  # why a ratio is missing (a point invalid or not measured)


class EndpointSweep(BaseModel):
    label: str
    url: str
    model: str | None
    points: list[BenchPoint] = Field(default_factory=list)
    failures: list[str] = Field(default_factory=list)


TableRow = dict[str, str | int | float | bool | None]
"""A row of a Prefect table artifact or of MLflow: plain values under column names."""


class ComparisonReport(BaseModel):
    unit: str
    endpoints: list[EndpointSweep]  # the unit first, then each baseline
    rows: list[ComparisonRow]
    plot: str | None = None

    def table(self) -> list[TableRow]:
        """Rows for a Prefect table artifact or MLflow: plain values, numbers rounded for reading."""
        return [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.model_dump().items()}
                for r in self.rows]

    def markdown(self) -> str:
        head = ("| scenario | c | baseline | out tok/s unit / base (ratio) | TTFT p95 ms unit / base (ratio) "
                "| ITL p95 ms unit / base (ratio) | note |")
        lines = [head, "|---|---|---|---|---|---|---|"]
        for r in self.rows:
            lines.append(
                f"| {r.scenario} | {r.concurrency} | {r.baseline} "
                f"| {_f(r.unit_output_tokens_per_s)} / {_f(r.baseline_output_tokens_per_s)} "
                f"({_r(r.output_tokens_per_s_ratio)}) "
                f"| {_f(r.unit_ttft_p95_ms)} / {_f(r.baseline_ttft_p95_ms)} ({_r(r.ttft_p95_ratio)}) "
                f"| {_f(r.unit_itl_p95_ms)} / {_f(r.baseline_itl_p95_ms)} ({_r(r.itl_p95_ratio)}) | {r.note} |")
        failures = [f"- {e.label}: {f}" for e in self.endpoints for f in e.failures]
        if failures:
            lines += ["", "Failures:", *failures]
        return "\n".join(lines) + "\n"


class SweepReport(BaseModel):
    points: list[BenchPoint]
    slo: list[SLOResult]
    exports: list[str]
    duration_s: float
    failures: list[str] = Field(default_factory=list)
    telemetry: str = ""  # how GPUs were sampled, or why not ("no GPU: …")
    warnings: list[str] = Field(default_factory=list)  # about the whole run (e.g. answers shorter than asked)
    plots: list[str] = Field(default_factory=list)
    comparison: ComparisonReport | None = None
    # A searched unit's verification (enginefoundry.bench.goodput.SearchVerdict as JSON): goodput at the SLO,
    # predicted_* beside measured_*, prediction_error, $/1M output tokens, tokens/joule.
    search: dict[str, Any] | None = None  # JSON edge: SearchVerdict as JSON
    search_metrics: dict[str, float] = Field(default_factory=dict)
    # A unit serving the base and its adapters: the sweep's requests sent round-robin to the base and every adapter
    # (by the OpenAI `model` name), and each name's figures over the whole sweep; empty for any other unit.
    served: dict[str, ServedFigures] = Field(default_factory=dict)

    @property
    def valid(self) -> bool:
        return bool(self.points) and all(p.valid for p in self.points) and not self.failures

    def summary(self) -> dict[str, float]:
        best = best_throughput({"slo": [s.model_dump() for s in self.slo],
                                "points": [{"scenario": p.scenario, "concurrency": p.concurrency, "valid": p.valid,
                                            "output_tokens_per_s": p.output_tokens_per_s} for p in self.points]})
        return {"bench_points": len(self.points), "bench_valid": float(self.valid),
                "bench_best_output_tokens_per_s": best.output_tokens_per_s if best else 0.0, **self.search_metrics,
                **self.speculation_summary(), **self.served_summary()}

    def served_summary(self) -> dict[str, float]:
        """Each served name's share of the sweep's requests and mean server latency: `bench_served_<name>_share`,
        `bench_served_<name>_latency_ms`; empty for a unit that serves no adapters."""
        out: dict[str, float] = {}
        for name, f in self.served.items():
            out[f"bench_served_{name}_share"] = f.share
            if f.mean_latency_ms is not None:
                out[f"bench_served_{name}_latency_ms"] = f.mean_latency_ms
        return out

    def speculation_summary(self) -> dict[str, float]:
        """A speculative unit's acceptance rate over the sweep and its speed-up over the non-speculative twin at
        each concurrency (the lowest over the scenarios: `spec_speedup_c<N>`); empty for any other unit."""
        spec = [p for p in self.points if p.speculation is not None]
        if not spec:
            return {}
        drafted = sum(p.speculation.drafted for p in spec if p.speculation)
        accepted = sum(p.speculation.accepted for p in spec if p.speculation)
        out: dict[str, float] = {"spec_acceptance_rate": round(accepted / drafted, 6)} if drafted else {}
        for c in sorted({p.concurrency for p in spec}):
            ups = [u for p in spec if p.concurrency == c and p.speculation is not None
                   and (u := p.speculation.speedup(p.output_tokens_per_s)) is not None]
            if ups:
                out[f"spec_speedup_c{c}"] = min(ups)
        return out

    def with_twin(self, twin: SweepReport) -> SweepReport:
        """Each point's speculation with the twin's output tokens/s at the same scenario and concurrency."""
        theirs = {(p.scenario, p.concurrency): p.output_tokens_per_s for p in twin.points if p.valid}
        points = []
        for p in self.points:
            sp = p.speculation or SpeculationPoint()
            sp = sp.model_copy(update={"twin_output_tokens_per_s": theirs.get((p.scenario, p.concurrency))})
            points.append(p.model_copy(update={"speculation": sp}))
        missing = [f"{p.scenario}-c{p.concurrency}" for p in points
                   if p.speculation is not None and p.speculation.twin_output_tokens_per_s is None]
        warnings = self.warnings + ([f"speculation: no valid twin point for {', '.join(missing)}: no speed-up there"]
                                    if missing else [])
        return self.model_copy(update={"points": points, "warnings": warnings})

    def table(self) -> list[TableRow]:
        """One row per point: what a platform team reads first, invalid points with their reasons."""
        rows = []
        for p in self.points:
            row: TableRow = {
                "scenario": p.scenario, "concurrency": p.concurrency, "valid": p.valid,
                "completed": f"{p.completed}/{p.requested}",
                "output_tok_s": _round(p.output_tokens_per_s), "requests_s": _round(p.requests_per_s),
                "ttft_p50_ms": _round(p.ttft_ms.p50), "ttft_p95_ms": _round(p.ttft_ms.p95),
                "itl_p95_ms": _round(p.itl_ms.p95), "latency_p95_ms": _round(p.latency_ms.p95),
            }
            if p.telemetry is not None and p.telemetry.available:
                row.update({"gpu_avg_power_w": p.telemetry.avg_power_w, "gpu_avg_util_pct": p.telemetry.avg_util_pct,
                            "gpu_max_mem_mib": p.telemetry.max_memory_used_mib,
                            "tok_s_per_w": p.output_tokens_per_s_per_watt})
            if p.speculation is not None:
                row.update({"acceptance": p.speculation.acceptance_rate,
                            "speedup": p.speculation.speedup(p.output_tokens_per_s),
                            "twin_output_tok_s": _round(p.speculation.twin_output_tokens_per_s)})
            row["problems"] = "; ".join(p.problems)
            row["warnings"] = "; ".join(p.warnings)
            rows.append(row)
        return rows

    def slo_markdown(self) -> str:
        lines = ["| scenario | SLOs met | best concurrency | output tok/s | detail |", "|---|---|---|---|---|"]
        for s in self.slo:
            lines.append(f"| {s.scenario} | {'yes' if s.met else 'NO'} | {s.best_concurrency or '-'} "
                         f"| {_f(s.output_tokens_per_s)} | {s.detail} |")
        if self.failures:
            lines += ["", "Sweep failures:", *[f"- {f}" for f in self.failures]]
        spec = self.speculation_summary()
        if spec:
            ups = ", ".join(f"×{v:.2f} at c{k.removeprefix('spec_speedup_c')}" for k, v in spec.items()
                            if k.startswith("spec_speedup_c"))
            rate = spec.get("spec_acceptance_rate")
            acc = f"draft acceptance {rate:.3f}" if rate is not None else "draft acceptance not measured"
            lines += ["", f"Speculation: {acc}; speed-up over the non-speculative twin (output tok/s): "
                          f"{ups or 'not measured'}"]
        if self.served:
            by_client = any(f.measured_by == "client" for f in self.served.values())
            how = ("the mix by each request's adapter field; AIPerf's per-request records, latency as the client saw it"
                   if by_client else "the mix by `model` name; the server's counters over the sweep")
            lines += ["", f"Served adapters ({how}):", "",
                      "| model | requests | share (asked) | completion tokens | mean latency ms |",
                      "|---|---|---|---|---|",
                      *[f"| {n} | {f.requests} | {f.share:.3f} ({_share(f.traffic_share)}) | {f.completion_tokens} "
                        f"| {_f(f.mean_latency_ms)} |" for n, f in self.served.items()]]
        if self.telemetry:
            lines += ["", f"GPU telemetry: {self.telemetry}"]
        if self.warnings:
            lines += ["", "Warnings:", *[f"- {w}" for w in self.warnings]]
        return "\n".join(lines) + "\n"


def _round(x: float | None, digits: int = 2) -> float | None:
    return None if x is None else round(x, digits)


def _share(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _r(x: float | None) -> str:
    return "-" if x is None else f"×{x:.2f}"
