"""AIPerf (default) and genai-perf behind one interface: a command per sweep point, one normalized result."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from enginefoundry.bench.parsers import parse_aiperf, parse_genai_perf, read_export
from enginefoundry.bench.result import BenchPoint
from enginefoundry.bench.telemetry import Backend, aiperf_window, sampling
from enginefoundry.errors import ToolError
from enginefoundry.runner import run_tool, tail
from enginefoundry.spec import BenchmarkSpec, BenchTool, Scenario

INSTALL_HINTS = {
    "aiperf": "make bench-venv (aiperf==0.13.0 in its own .venv-bench), or pip install -e '.[bench]'",
    "genai-perf": "pip install genai-perf, plus perf_analyzer 2.58+ on PATH",
    # perf_analyzer's only real wheels need glibc 2.38+; pip falls back to an empty 0.1.0 placeholder.
    "perf_analyzer": "pip install 'perf-analyzer>=2.58' (its wheels need glibc 2.38+; on older distros put a "
                     "perf_analyzer binary on PATH)",
}


class ToolMissingError(ToolError):
    """The benchmark client is not installed: every point would fail the same way, so a sweep stops."""


# The benchmark clients run as separate processes, so they can live in their own environment: AIPerf pins
# rich~=14.1, pandas and pyzmq, which must never constrain the TensorRT-LLM environment of a GPU worker.
TOOL_ENV = {"aiperf": "EF_AIPERF", "genai-perf": "EF_GENAI_PERF"}
BENCH_VENV = ".venv-bench"  # `make bench-venv` creates it in the project folder
PROJECT_DIR = Path(__file__).resolve().parents[2]


def tool_candidates(name: str) -> list[Path]:
    """Where a benchmark client is looked for, in order, before PATH: the dedicated bench venv (the project's,
    then the working directory's), then next to this interpreter (an install with the `bench` extra)."""
    return [PROJECT_DIR / BENCH_VENV / "bin" / name, Path.cwd() / BENCH_VENV / "bin" / name,
            Path(sys.executable).with_name(name)]


def _tool_path(name: str) -> str:
    """The executable of a benchmark client: $EF_AIPERF (or $EF_GENAI_PERF) when set, else the first of
    `tool_candidates`, else PATH."""
    variable = TOOL_ENV.get(name)
    explicit = os.environ.get(variable) if variable else None
    if explicit:
        path = Path(explicit).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ToolMissingError(f"{variable}={explicit} is not an executable file: point it at the '{name}' "
                                   f"of its own environment ({INSTALL_HINTS[name]})")
        return str(path)
    for candidate in tool_candidates(name):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(name)
    if not found:
        raise ToolMissingError(f"benchmark tool '{name}' is not installed: {INSTALL_HINTS[name]}"
                               + (f"; or set {variable} to its executable" if variable else "")
                               + "; or choose another benchmark.tool")
    return found


def _extra_inputs(extra: dict[str, str] | None) -> list[str]:
    """Fields added to every request payload (`--extra-inputs key:value`, both tools), e.g. ignore_eos:true."""
    return [arg for k, v in sorted((extra or {}).items()) for arg in ("--extra-inputs", f"{k}:{v}")]


def aiperf_argv(
    spec: BenchmarkSpec, scenario: Scenario, concurrency: int, *, url: str, model: str, tokenizer: str, out: Path,
    extra_inputs: dict[str, str] | None = None, input_file: Path | None = None,
) -> list[str]:
    """`input_file`: the scenario's requests as a single_turn custom dataset, sent in order (bench/mix.py: each
    record's prompt, output length and extra body fields), instead of AIPerf's synthetic prompts."""
    dataset = ([
        "--synthetic-input-tokens-mean", str(scenario.input_tokens_mean),
        "--synthetic-input-tokens-stddev", str(scenario.input_tokens_stddev),
        "--output-tokens-mean", str(scenario.output_tokens_mean),
        "--output-tokens-stddev", str(scenario.output_tokens_stddev),
    ] if input_file is None else [
        # aiperf 0.13.0 `profile --help`: --input-file, --custom-dataset-type single_turn, --dataset-sampling-strategy
        "--input-file", str(input_file), "--custom-dataset-type", "single_turn",
        "--dataset-sampling-strategy", "sequential",
    ])
    return [
        _tool_path("aiperf"), "profile", "--model", model, "--tokenizer", tokenizer,
        "--endpoint-type", "chat", "--url", url, "--streaming",
        "--concurrency", str(concurrency), "--request-count", str(spec.request_count),
        "--warmup-request-count", str(spec.warmup_request_count), *dataset,
        "--random-seed", str(spec.seed), "--artifact-dir", str(out),
        "--ui", "none", "--no-gpu-telemetry", "--no-server-metrics", *_extra_inputs(extra_inputs),
    ]


def genai_perf_argv(
    spec: BenchmarkSpec, scenario: Scenario, concurrency: int, *, url: str, model: str, tokenizer: str, out: Path,
    extra_inputs: dict[str, str] | None = None,
) -> list[str]:
    genai_perf = _tool_path("genai-perf")
    # genai-perf only builds inputs and then dies with FileNotFoundError without the C++ client.
    _tool_path("perf_analyzer")
    return [
        genai_perf, "profile", "-m", model, "--tokenizer", tokenizer,
        "--endpoint-type", "chat", "--url", url, "--streaming",
        "--concurrency", str(concurrency), "--request-count", str(spec.request_count),
        "--warmup-request-count", str(spec.warmup_request_count),
        "--synthetic-input-tokens-mean", str(scenario.input_tokens_mean),
        "--synthetic-input-tokens-stddev", str(scenario.input_tokens_stddev),
        "--output-tokens-mean", str(scenario.output_tokens_mean),
        "--random-seed", str(spec.seed), "--artifact-dir", str(out), *_extra_inputs(extra_inputs),
    ]


def run_point(
    spec: BenchmarkSpec, scenario: Scenario, concurrency: int, *, url: str, model: str, tokenizer: str,
    out: Path, progress: Callable[[str], None] = print, telemetry: Backend | None = None,
    extra_inputs: dict[str, str] | None = None, input_file: Path | None = None,
) -> tuple[BenchPoint, Path]:
    """Run one sweep point; return the validated point and the path of the tool's JSON export.

    With a telemetry backend, GPUs are sampled while the tool runs and the point carries the summary of
    the tool's measured window (AIPerf's start/end time), so start-up idle does not dilute the watts.
    """
    out.mkdir(parents=True, exist_ok=True)
    env = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    if spec.tool is BenchTool.AIPERF:
        argv = aiperf_argv(spec, scenario, concurrency, url=url, model=model, tokenizer=tokenizer, out=out,
                           extra_inputs=extra_inputs, input_file=input_file)
        export = out / "profile_export_aiperf.json"
    elif input_file is not None:
        raise ToolError(f"{spec.tool.value} is not sent a custom dataset here (AIPerf is): benchmark.tool: aiperf")
    else:
        argv = genai_perf_argv(spec, scenario, concurrency, url=url, model=model, tokenizer=tokenizer, out=out,
                               extra_inputs=extra_inputs)
        export = out / "profile_export_genai_perf.json"
    what = f"{spec.tool.value} c={concurrency}"
    try:
        with sampling(telemetry) as sampler:
            try:
                # AIPerf's offline-tokenizer bug: HF_HUB_OFFLINE with a local tokenizer path fails (facts §4),
                # and a local path makes no network call anyway, so the variables are unset for the tool.
                run_tool(argv, out / "tool.log", env={**env, "HF_HUB_OFFLINE": None, "TRANSFORMERS_OFFLINE": None},
                         timeout_s=spec.timeout_s, what=what, progress=progress)
            except ToolError as err:
                reason = _tool_reason(out / "tool.log") if "failed with exit code" in str(err) else None
                if reason is None:  # a timeout or a missing binary already says what happened
                    raise
                raise ToolError(f"{what} failed: {reason}\n{err}") from None
        if spec.tool is BenchTool.GENAI_PERF:
            found = sorted(out.glob("*/profile_export_genai_perf.json"))
            export = found[0] if found else export
        if not export.is_file():
            raise ToolError(f"{what} exited 0 but wrote no {export.name} in {out}; log:\n{tail(out / 'tool.log')}")
        try:
            data = read_export(export)
        except ToolError as err:
            raise ToolError(f"{what} wrote an unreadable {export.name}: {err}") from None
        parse = parse_aiperf if spec.tool is BenchTool.AIPERF else parse_genai_perf
        point = parse(data, scenario=scenario.name, concurrency=concurrency, requested=spec.request_count,
                      expected_output_len=scenario.output_tokens_mean)
        if sampler is not None:
            point = point.with_telemetry(sampler.summary(aiperf_window(data)))
        env_words = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        return point.model_copy(update={"command": f"{env_words} {shlex.join(argv)}"}), export
    finally:
        if spec.tool is BenchTool.AIPERF:
            remove_aiperf_leftovers(out)


# AIPerf prints `HH:MM:SS.mmm ERROR    <message> (<file>.py:<line>)`; the last one is the run's verdict.
_ERROR_LINE = re.compile(r"\bERROR\s+(?P<msg>.+?)(?:\s+\([\w./]+\.py:\d+\))?\s*$")
_MMAP_DIR = re.compile(r"aiperf_mmap_(?P<id>[0-9a-f]{6,64})\b")


def _tool_reason(log: Path) -> str | None:
    """The tool's own last ERROR line, so a sweep failure reads 'All 6 requests failed', not 'exit code 1'."""
    found = [m.group("msg") for line in tail(log, 200).splitlines() if (m := _ERROR_LINE.search(line))]
    return found[-1][:300] if found else None


def aiperf_benchmark_ids(out: Path) -> set[str]:
    """The benchmark ids of the AIPerf run in `out`: from its export, or from its own log when it died early."""
    ids: set[str] = set()
    export = out / "profile_export_aiperf.json"
    if export.is_file():
        try:
            bid = read_export(export).get("benchmark_id")
        except (OSError, ToolError):
            bid = None
        if bid:
            ids.add(str(bid))
    for log in (out / "logs" / "aiperf.log", out / "tool.log"):
        if log.is_file():
            ids.update(m.group("id") for m in _MMAP_DIR.finditer(log.read_text(errors="replace")))
    return ids


def remove_aiperf_leftovers(out: Path) -> list[Path]:
    """AIPerf leaves <tmp>/aiperf_mmap_<benchmark_id> after every run, failed runs too (facts §10).

    Only this run's directories are removed (ids from its own export and log), never another run's that
    may still be in progress.
    """
    removed = []
    for root in {Path(tempfile.gettempdir()), Path("/tmp")}:
        for bid in aiperf_benchmark_ids(out):
            path = root / f"aiperf_mmap_{bid}"
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed
