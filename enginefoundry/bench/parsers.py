"""Parsers of the tools' JSON exports into BenchPoint. Parse the JSON, never the CSV."""

from __future__ import annotations

from pathlib import Path

from enginefoundry.bench.result import BenchPoint, avg, pct, validate
from enginefoundry.errors import ToolError
from enginefoundry.schemas.base import DocumentError, parse_json
from enginefoundry.schemas.loose import AiperfExport

MAX_EXPORT_BYTES = 64 << 20  # a profile export is a summary of a few KiB; its per-request records are elsewhere


def read_export(path: Path) -> AiperfExport:
    """A tool's JSON export, parsed within bounds; ToolError naming the file when it is not a JSON object."""
    try:
        data = parse_json(path.read_bytes(), what=str(path), max_bytes=MAX_EXPORT_BYTES)
    except DocumentError as err:
        raise ToolError(str(err)) from None
    if not isinstance(data, dict):
        raise ToolError(f"{path}: not a JSON object")
    return data


def parse_aiperf(
    export: Path | AiperfExport, *, scenario: str, concurrency: int, requested: int,
    expected_output_len: int | None = None,
) -> BenchPoint:
    """AIPerf 0.13 `profile_export_aiperf.json` (schema 1.4)."""
    data = export if isinstance(export, dict) else read_export(Path(export))
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
    export: Path | AiperfExport, *, scenario: str, concurrency: int, requested: int,
    expected_output_len: int | None = None,
) -> BenchPoint:
    """genai-perf 0.0.16 `profile_export_genai_perf.json`. It has no error or completion fields, so the
    request count is the only completeness signal (facts §6: a broken run reported request_count 1)."""
    data = export if isinstance(export, dict) else read_export(Path(export))
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
