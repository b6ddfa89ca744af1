"""AIPerf (default) and genai-perf behind one interface: a command per sweep point, one normalized result."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from enginefoundry.bench.parsers import parse_aiperf, parse_genai_perf
from enginefoundry.bench.result import BenchPoint
from enginefoundry.errors import ToolError
from enginefoundry.runner import run_tool
from enginefoundry.spec import BenchmarkSpec, BenchTool, Scenario


def _tool_path(name: str) -> str:
    local = Path(sys.executable).with_name(name)
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if not found:
        hint = "pip install -e '.[bench]'" if name == "aiperf" else "pip install genai-perf (needs perf_analyzer)"
        raise ToolError(f"benchmark tool '{name}' is not installed: {hint}, or set benchmark.tool")
    return found


def aiperf_argv(
    spec: BenchmarkSpec, scenario: Scenario, concurrency: int, *, url: str, model: str, tokenizer: str, out: Path,
) -> list[str]:
    return [
        _tool_path("aiperf"), "profile", "--model", model, "--tokenizer", tokenizer,
        "--endpoint-type", "chat", "--url", url, "--streaming",
        "--concurrency", str(concurrency), "--request-count", str(spec.request_count),
        "--warmup-request-count", str(spec.warmup_request_count),
        "--synthetic-input-tokens-mean", str(scenario.input_tokens_mean),
        "--synthetic-input-tokens-stddev", str(scenario.input_tokens_stddev),
        "--output-tokens-mean", str(scenario.output_tokens_mean),
        "--output-tokens-stddev", str(scenario.output_tokens_stddev),
        "--random-seed", str(spec.seed), "--artifact-dir", str(out),
        "--ui", "none", "--no-gpu-telemetry", "--no-server-metrics",
    ]


def genai_perf_argv(
    spec: BenchmarkSpec, scenario: Scenario, concurrency: int, *, url: str, model: str, tokenizer: str, out: Path,
) -> list[str]:
    return [
        _tool_path("genai-perf"), "profile", "-m", model, "--tokenizer", tokenizer,
        "--endpoint-type", "chat", "--url", url, "--streaming",
        "--concurrency", str(concurrency), "--request-count", str(spec.request_count),
        "--warmup-request-count", str(spec.warmup_request_count),
        "--synthetic-input-tokens-mean", str(scenario.input_tokens_mean),
        "--synthetic-input-tokens-stddev", str(scenario.input_tokens_stddev),
        "--output-tokens-mean", str(scenario.output_tokens_mean),
        "--random-seed", str(spec.seed), "--artifact-dir", str(out),
    ]


def run_point(
    spec: BenchmarkSpec, scenario: Scenario, concurrency: int, *, url: str, model: str, tokenizer: str,
    out: Path, progress=print,
) -> tuple[BenchPoint, Path]:
    """Run one sweep point; return the validated point and the path of the tool's JSON export."""
    out.mkdir(parents=True, exist_ok=True)
    env = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    if spec.tool is BenchTool.AIPERF:
        argv = aiperf_argv(spec, scenario, concurrency, url=url, model=model, tokenizer=tokenizer, out=out)
    else:
        argv = genai_perf_argv(spec, scenario, concurrency, url=url, model=model, tokenizer=tokenizer, out=out)
    # AIPerf's offline-tokenizer bug: HF_HUB_OFFLINE with a local tokenizer path fails (facts §4), and a
    # local path makes no network call anyway, so the variables are unset for the tool.
    run_tool(argv, out / "tool.log", env=env, unset_env=("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"),
             timeout_s=spec.timeout_s, what=f"{spec.tool.value} c={concurrency}", progress=progress)
    if spec.tool is BenchTool.AIPERF:
        export = out / "profile_export_aiperf.json"
        parse = parse_aiperf
    else:
        found = sorted(out.glob("*/profile_export_genai_perf.json"))
        export = found[0] if found else out / "profile_export_genai_perf.json"
        parse = parse_genai_perf
    if not export.is_file():
        raise ToolError(f"{spec.tool.value} exited 0 but wrote no {export.name} in {out}")
    point = parse(export, scenario=scenario.name, concurrency=concurrency, requested=spec.request_count,
                  expected_output_len=scenario.output_tokens_mean)
    _remove_aiperf_leftovers(export)
    return point, export


def _remove_aiperf_leftovers(export: Path) -> None:
    """AIPerf leaves /tmp/aiperf_mmap_<benchmark_id> after every run (facts §10); remove this run's only."""
    try:
        bid = json.loads(export.read_text()).get("benchmark_id")
    except (OSError, json.JSONDecodeError):
        return
    if bid:
        shutil.rmtree(Path("/tmp") / f"aiperf_mmap_{bid}", ignore_errors=True)
