"""Optional lm-evaluation-harness tasks against the served endpoint, fully offline.

The command talks to the served unit through `local-chat-completions` (the same OpenAI chat API the
smoke gate uses), with the chat template applied. Datasets come from a local task folder
(`--include_path`, task YAMLs pointing at local files) or a prepared datasets cache; HF_DATASETS_OFFLINE
and HF_HUB_OFFLINE make a missing dataset fail fast instead of reaching for the hub.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from enginefoundry.errors import InputError, ToolError
from enginefoundry.runner import every, run_tool
from enginefoundry.spec.checks import LmEvalSpec

INSTALL_HINT = "pip install 'lm-eval[api]'"
# What lm-eval's API models import lazily (lm_eval/models/api_models.py); without them a run dies at start.
API_EXTRA = ("aiohttp", "tqdm", "tenacity", "requests")


# The spec's `smoke.lm_eval` section is this run's configuration.
LmEvalConfig = LmEvalSpec


def spec_lm_eval(section: LmEvalSpec | None, base_path: Path) -> LmEvalConfig | None:
    """The run's lm-eval configuration from the spec's `smoke.lm_eval` section (None: no lm-eval check): its
    task folder and datasets cache resolved against the spec's folder, as every other path the spec names."""
    if section is None:
        return None

    def resolved(path: str | None) -> str | None:
        return None if path is None else str(Path(path) if Path(path).is_absolute() else (base_path / path).resolve())

    return section.model_copy(update={"include_path": resolved(section.include_path),
                                      "datasets_cache": resolved(section.datasets_cache)})


class LmEvalScore(BaseModel):
    task: str
    metric: str  # e.g. exact_match
    filter: str  # e.g. strict-match, none
    value: float
    stderr: float | None = None


class LmEvalResult(BaseModel):
    status: Literal["ok", "not installed", "failed"]
    detail: str
    version: str | None = None
    command: list[str] = Field(default_factory=list)
    scores: list[LmEvalScore] = Field(default_factory=list)
    samples: dict[str, int] = Field(default_factory=dict)  # examples evaluated per task
    results_path: str | None = None

    def summary(self) -> dict[str, float]:
        return {f"lm_eval_{s.task}_{s.metric}_{s.filter}".replace("-", "_"): s.value for s in self.scores}


def lm_eval_version() -> str | None:
    """The installed lm-eval version, or None when `lm_eval` is not importable by this interpreter."""
    if importlib.util.find_spec("lm_eval") is None:
        return None
    for dist in ("lm_eval", "lm-eval"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def _arg(name: str, value: str) -> str:
    # --model_args is split on ',' and '=': a value holding either would be cut silently.
    if "," in value or "=" in value:
        raise InputError(f"lm-eval: {name} '{value}' contains ',' or '=', which --model_args cannot carry")
    return f"{name}={value}"


def lm_eval_argv(config: LmEvalConfig, *, base_url: str, model: str, tokenizer: str, out: Path) -> list[str]:
    """The lm_eval command line: the console script beside this interpreter, else `python -m lm_eval`."""
    script = Path(sys.executable).with_name("lm_eval")
    head = [str(script)] if script.exists() else [sys.executable, "-m", "lm_eval"]
    model_args = ",".join([
        _arg("base_url", base_url.rstrip("/") + "/v1/chat/completions"), _arg("model", model),
        _arg("tokenizer", tokenizer), f"num_concurrent={config.num_concurrent}", "max_retries=1",
        "tokenized_requests=False",
    ])
    argv = [*head, "--model", "local-chat-completions", "--model_args", model_args,
            "--tasks", ",".join(config.tasks), "--apply_chat_template", "--batch_size", "1",
            "--output_path", str(out)]
    if config.limit is not None:
        argv += ["--limit", str(config.limit)]
    if config.num_fewshot is not None:
        argv += ["--num_fewshot", str(config.num_fewshot)]
    if config.include_path is not None:
        argv += ["--include_path", config.include_path]
    return argv


def lm_eval_env(config: LmEvalConfig) -> dict[str, str]:
    env = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "OPENAI_API_KEY": "EMPTY"}
    if config.datasets_cache is not None:
        env["HF_DATASETS_CACHE"] = config.datasets_cache
    return env


def find_results_file(out: Path) -> Path | None:
    """lm-eval writes <output_path>/<sanitized model name>/results_<timestamp>.json; the newest wins."""
    found = sorted(out.rglob("results_*.json"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def parse_lm_eval_results(data: dict[str, Any] | Path,  # JSON edge: lm-eval's results JSON
                          ) -> tuple[list[LmEvalScore], dict[str, int]]:
    """`results` → one score per (task, metric, filter), with its stderr; `n-samples` → examples per task.

    Metric keys look like "exact_match,strict-match" and "exact_match_stderr,strict-match"; "alias" and
    non-numeric values (a stderr of "N/A") are not scores.
    """
    payload = data if isinstance(data, dict) else json.loads(Path(data).read_text())
    scores = []
    for task, metrics in sorted((payload.get("results") or {}).items()):
        if not isinstance(metrics, dict):
            continue
        for key, value in metrics.items():
            if "," not in key or not isinstance(value, int | float) or isinstance(value, bool):
                continue
            metric, flt = key.split(",", 1)
            if metric.endswith("_stderr"):
                continue
            stderr = metrics.get(f"{metric}_stderr,{flt}")
            scores.append(LmEvalScore(task=task, metric=metric, filter=flt, value=float(value),
                                      stderr=float(stderr) if isinstance(stderr, int | float) else None))
    samples = {}
    for task, counts in (payload.get("n-samples") or {}).items():
        if isinstance(counts, dict) and isinstance(counts.get("effective"), int):
            samples[task] = counts["effective"]
    return scores, samples


def run_lm_eval(
    config: LmEvalConfig, *, base_url: str, model: str, tokenizer: str, out: Path,
    progress: Callable[[str], None] = print,
) -> LmEvalResult:
    """Run the tasks; never raises for a missing or failing lm-eval: the result says what happened."""
    version = lm_eval_version()
    if version is None:
        return LmEvalResult(status="not installed",
                            detail=f"lm-eval is not installed for {sys.executable}: {INSTALL_HINT}")
    missing = [pkg for pkg in API_EXTRA if importlib.util.find_spec(pkg) is None]
    if missing:
        return LmEvalResult(status="not installed", version=version,
                            detail=f"lm-eval {version} lacks its [api] extra ({', '.join(missing)}): {INSTALL_HINT}")
    argv = lm_eval_argv(config, base_url=base_url, model=model, tokenizer=tokenizer, out=out)
    progress(f"lm-eval {version}: {', '.join(config.tasks)}"
             + (f" (limit {config.limit})" if config.limit else ""))
    try:
        run_tool(argv, out / "lm_eval.log", env=lm_eval_env(config), timeout_s=config.timeout_s,
                 what="lm_eval", progress=every(30, progress))
    except ToolError as err:
        return LmEvalResult(status="failed", detail=str(err).splitlines()[0], version=version, command=argv)
    results = find_results_file(out)
    if results is None:  # lm-eval only warns when it cannot save its results, and exits 0
        return LmEvalResult(status="failed", version=version, command=argv,
                            detail=f"lm_eval exited 0 but wrote no results_*.json under {out}")
    scores, samples = parse_lm_eval_results(results)
    if not scores:
        return LmEvalResult(status="failed", version=version, command=argv, results_path=str(results),
                            detail=f"{results.name} holds no numeric score for {config.tasks}")
    detail = ", ".join(f"{s.task} {s.metric}[{s.filter}] {s.value:.3f}" for s in scores)
    return LmEvalResult(status="ok", detail=detail, version=version, command=argv, scores=scores,
                        samples=samples, results_path=str(results))
