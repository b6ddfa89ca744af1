"""Prompt-length analysis: from observed input lengths to profile limits.

Rules (documented here because they become profile fields):
- percentiles use the nearest-rank method (no interpolation: every reported length was observed);
- `max_input_len` = the base length × (1 + headroom), rounded up to a multiple of 256, where the base is p99 when
  there are at least 100 samples (p99 of fewer samples is just the maximum, so the maximum is used);
- `max_seq_len` = `max_input_len` + `output_budget` (output tokens the profile allows);
- a short/long split is proposed when the tail is heavy, p99 / p50 > 4: one profile for the bulk (base p90)
  and one for the tail (base p99 or the maximum), since a single profile sized for the tail wastes KV cache
  and batch slots on the common short prompt.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from enginefoundry.errors import InputError
from enginefoundry.schemas.loose import JsonObject

ROUND_TO = 256
MIN_SAMPLES_FOR_P99 = 100
SPLIT_RATIO = 4.0


class ProfileProposal(BaseModel):
    name: str
    covers: str = Field(description="the share of prompts it serves, e.g. 'p90'")
    max_input_len: int
    max_seq_len: int


class LengthReport(BaseModel):
    count: int
    min: int
    max: int
    mean: float
    stddev: float = Field(description="population standard deviation")
    p50: int
    p90: int
    p95: int
    p99: int
    base: str = Field(description="what max_input_len was sized from: p99 or max")
    headroom: float
    output_budget: int
    max_input_len: int
    max_seq_len: int
    split: list[ProfileProposal] | None = None
    rule: str


def percentile(sorted_counts: list[int], q: float) -> int:
    """Nearest-rank percentile of an ascending list (q in 0..100)."""
    if not sorted_counts:
        raise ValueError("no values")
    rank = max(1, math.ceil(q / 100 * len(sorted_counts)))
    return sorted_counts[rank - 1]


def round_up(n: float, multiple: int = ROUND_TO) -> int:
    return max(multiple, math.ceil(n / multiple) * multiple)


def analyze_lengths(counts: list[int], output_budget: int = 1024, headroom: float = 0.1) -> LengthReport:
    """Percentiles of input lengths and the profile limits they suggest (see the module docstring)."""
    if not counts:
        raise InputError("no prompt lengths to analyse: the file had no records")
    bad = [c for c in counts if not isinstance(c, int) or isinstance(c, bool) or c < 0]
    if bad:
        raise InputError(f"prompt lengths must be non-negative integers; got {bad[:5]}")
    if output_budget < 1 or headroom < 0:
        raise InputError("output_budget must be ≥ 1 and headroom ≥ 0")
    xs = sorted(counts)
    mean = sum(xs) / len(xs)
    p50, p90, p95, p99 = (percentile(xs, q) for q in (50, 90, 95, 99))
    use_p99 = len(xs) >= MIN_SAMPLES_FOR_P99
    base = p99 if use_p99 else xs[-1]
    max_input = round_up(base * (1 + headroom))
    split = None
    if p50 > 0 and p99 / p50 > SPLIT_RATIO:
        short_in = round_up(p90 * (1 + headroom))
        if short_in < max_input:
            split = [
                ProfileProposal(name="short", covers="p90", max_input_len=short_in,
                                max_seq_len=short_in + output_budget),
                ProfileProposal(name="long", covers="p99" if use_p99 else "max", max_input_len=max_input,
                                max_seq_len=max_input + output_budget),
            ]
    return LengthReport(
        count=len(xs), min=xs[0], max=xs[-1], mean=round(mean, 2),
        stddev=round(math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs)), 2), p50=p50, p90=p90, p95=p95, p99=p99,
        base="p99" if use_p99 else "max", headroom=headroom, output_budget=output_budget,
        max_input_len=max_input, max_seq_len=max_input + output_budget, split=split,
        rule=(f"max_input_len = round_up_{ROUND_TO}({'p99' if use_p99 else 'max'} × {1 + headroom:g}); "
              f"max_seq_len = max_input_len + {output_budget}; split when p99/p50 > {SPLIT_RATIO:g}"),
    )


def _token_count(record: JsonObject, tokenizer: Any, where: str) -> int:
    for key in ("tokens", "input_tokens"):
        if key in record:
            value = record[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InputError(f"{where}: '{key}' must be a non-negative integer, got {value!r}")
            return value
    if "prompt" in record or "messages" in record:
        if tokenizer is None:
            raise InputError(f"{where}: a text record needs a tokenizer: pass tokenizer_dir (or give "
                             "{\"tokens\": N} records)")
        if "prompt" in record:
            if not isinstance(record["prompt"], str):
                raise InputError(f"{where}: 'prompt' must be a string")
            return len(tokenizer(record["prompt"], add_special_tokens=True)["input_ids"])
        messages = record["messages"]
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise InputError(f"{where}: 'messages' must be a list of {{role, content}} objects")
        try:
            ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        except ValueError as err:  # no chat template
            raise InputError(f"{where}: the tokenizer cannot apply a chat template ({err})") from None
        if hasattr(ids, "keys") and "input_ids" in ids:  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        return len(ids)
    raise InputError(f"{where}: expected one of the keys tokens, input_tokens, prompt, messages; "
                     f"got {sorted(record)}")


def read_lengths(path: str | Path, tokenizer_dir: str | Path | None = None) -> list[int]:
    """Input lengths from a JSONL file of {"tokens": N}, {"input_tokens": N}, {"prompt": str} or
    {"messages": [...]} records (text records are tokenized with the tokenizer in `tokenizer_dir`)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{p} does not exist")
    tokenizer = None
    if tokenizer_dir is not None:
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        except (OSError, ValueError) as err:
            raise InputError(f"cannot load a tokenizer from {tokenizer_dir}: {err}") from None
    counts = []
    with p.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{p}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise InputError(f"{where}: not valid JSON ({err.msg})") from None
            if not isinstance(record, dict):
                raise InputError(f"{where}: each line must be a JSON object")
            counts.append(_token_count(record, tokenizer, where))
    if not counts:
        raise InputError(f"{p} has no records")
    return counts


MAX_LENGTHS_FILE = 512 * 1024 * 1024


def file_lengths(path: Path) -> tuple[LengthReport, str]:
    """A prompt-length file of token counts ({"tokens": N} / {"input_tokens": N}; no tokenizer), analysed like
    `enginefoundry lengths`, and its sha256. A missing file, a non-regular one (a FIFO or device would never end)
    or one over 512 MiB is refused."""
    if not path.is_file():
        raise InputError(f"{path} does not exist or is not a regular file")
    if path.stat().st_size > MAX_LENGTHS_FILE:
        raise InputError(f"{path} is over {MAX_LENGTHS_FILE >> 20} MiB")
    digest = hashlib.sha256()
    try:
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        counts = read_lengths(path)
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{path} cannot be read ({err})") from None
    return analyze_lengths(counts), digest.hexdigest()
