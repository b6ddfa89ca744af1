"""Parsers of the tools' JSON exports into BenchPoint. Parse the JSON, never the CSV."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from enginefoundry.bench.result import BenchPoint, avg, pct, validate


def parse_aiperf(
    export: Path | dict[str, Any], *, scenario: str, concurrency: int, requested: int,  # JSON edge: the export
    expected_output_len: int | None = None,
) -> BenchPoint:
    """AIPerf 0.13 `profile_export_aiperf.json` (schema 1.4)."""
    data = export if isinstance(export, dict) else json.loads(Path(export).read_text())
    completed = int(avg(data, "completed_request_count") or avg(data, "request_count") or 0)
    errors = int(avg(data, "error_request_count") or 0) + len(data.get("error_summary") or [])
    error_rate = (avg(data, "request_error_rate") or 0.0) / 100.0
    point = BenchPoint(
        tool="aiperf", tool_version=data.get("aiperf_version"), scenario=scenario, concurrency=concurrency,
        requested=requested, completed=completed, errors=errors, error_rate=error_rate,
        complete=bool(data.get("is_complete", False)) and not data.get("was_cancelled", False),
        output_tokens_per_s=avg(data, "output_token_throughput"), requests_per_s=avg(data, "request_throughput"),
        ttft_ms=pct(data, "time_to_first_token"), itl_ms=pct(data, "inter_token_latency"),
        latency_ms=pct(data, "request_latency"), input_len_avg=avg(data, "input_sequence_length"),
        output_len_avg=avg(data, "output_sequence_length"), duration_s=avg(data, "benchmark_duration"),
    )
    return validate(point, expected_output_len)


def parse_genai_perf(
    export: Path | dict[str, Any], *, scenario: str, concurrency: int, requested: int,  # JSON edge: the export
    expected_output_len: int | None = None,
) -> BenchPoint:
    """genai-perf 0.0.16 `profile_export_genai_perf.json`. It has no error or completion fields, so the
    request count is the only completeness signal (facts §6: a broken run reported request_count 1)."""
    data = export if isinstance(export, dict) else json.loads(Path(export).read_text())
    completed = int(avg(data, "request_count") or 0)
    point = BenchPoint(
        tool="genai-perf", tool_version=None, scenario=scenario, concurrency=concurrency, requested=requested,
        completed=completed, errors=0, error_rate=0.0, complete=completed >= requested,
        output_tokens_per_s=avg(data, "output_token_throughput"), requests_per_s=avg(data, "request_throughput"),
        ttft_ms=pct(data, "time_to_first_token"), itl_ms=pct(data, "inter_token_latency"),
        latency_ms=pct(data, "request_latency"), input_len_avg=avg(data, "input_sequence_length"),
        output_len_avg=avg(data, "output_sequence_length"),
    )
    return validate(point, expected_output_len)
