"""The benchmark stage: a sweep of scenarios × concurrency against one endpoint, SLOs, GPU telemetry,
baseline comparison and plots. Modules: aiperf (one point), sweep, compare, telemetry, report, plots."""

from __future__ import annotations

from enginefoundry.bench.aiperf import ToolMissingError, run_point
from enginefoundry.bench.compare import compare_with_baselines, discover_model
from enginefoundry.bench.parsers import parse_aiperf, parse_genai_perf
from enginefoundry.bench.report import ComparisonReport, ComparisonRow, SLOResult, SweepReport
from enginefoundry.bench.result import BenchPoint
from enginefoundry.bench.sweep import evaluate_slos, meets_slo, run_sweep
from enginefoundry.bench.telemetry import TelemetrySummary

__all__ = [
    "BenchPoint", "ComparisonReport", "ComparisonRow", "SLOResult", "SweepReport", "TelemetrySummary",
    "ToolMissingError", "compare_with_baselines", "discover_model", "evaluate_slos", "meets_slo",
    "parse_aiperf", "parse_genai_perf", "run_point", "run_sweep",
]
