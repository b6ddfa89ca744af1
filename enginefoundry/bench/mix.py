"""The benchmark's request mix over a unit that serves the base and its LoRA adapters (model.adapter_mode serve).

Each adapter's `traffic_share` (spec) is its part of the requests; the base gets what the shares leave, split evenly
with the adapters that set none. AIPerf 0.13.0 assigns requests to models round-robin over its `--model` list (the nth
to model n mod len: aiperf/dataset/composer/base.py `_select_model_name`; its `weighted` strategy is validated in
config/models.py but that function raises for it), so the shares become a list of at most MAX_SLOTS names, repeated
in proportion and interleaved (smooth weighted round-robin), that the benchmark passes as `--model`.

A lane whose server selects an adapter by a request field instead of the `model` name (lane trtllm: the body's
`lora_request`, `Lane.adapter_request`) gets the same interleaved list as a custom dataset: AIPerf 0.13.0's
`single_turn` JSONL (aiperf/dataset/loader/models.py `SingleTurn`: `text`, `output_length`, `session_id`, and `extra`,
"per-turn extra fields shallow-merged into the request body at dispatch time"), read in order
(`--custom-dataset-type single_turn --dataset-sampling-strategy sequential`). Each record's prompt is a window of a
seeded word stream cut to the scenario's token length with the served tokenizer, and its `session_id` names the
served model it is for, so the per-request records AIPerf writes (profile_export.jsonl, `metadata.conversation_id`)
give each adapter's part of the sweep (`served_from_records`), as the scoring server's counters do for the reference
lane; both become the same figures (`served_figures`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from math import gcd
from pathlib import Path
from typing import IO, TYPE_CHECKING, Literal

from pydantic import JsonValue

from enginefoundry.bench.report import ServedFigures
from enginefoundry.errors import InputError
from enginefoundry.spec import BuildSpec, Scenario
from enginefoundry.spec.checks import BenchTool

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

MAX_SLOTS = 20  # names in the round-robin list: shares are kept to 1/20 (5 %)


def served_shares(spec: BuildSpec, base_name: str) -> dict[str, float]:
    """Each served model name's share of the benchmark's requests: the base's name first, then each adapter's."""
    given = {a.name: a.traffic_share for a in spec.model.adapters if a.traffic_share is not None}
    rest = [base_name, *(a.name for a in spec.model.adapters if a.traffic_share is None)]
    each = max(0.0, 1.0 - sum(given.values())) / len(rest)
    return {base_name: each, **{a.name: given.get(a.name, each) for a in spec.model.adapters}}


def round_robin(shares: dict[str, float], slots: int = MAX_SLOTS) -> list[str]:
    """The names in proportion to their shares (every positive share at least once, at most `slots` names, reduced
    by their common divisor) and interleaved, so that any window of the list is close to the mix."""
    total = sum(s for s in shares.values() if s > 0)
    if total <= 0:
        return []
    exact = {n: s / total * slots for n, s in shares.items() if s > 0}
    counts = {n: max(1, int(x)) for n, x in exact.items()}
    for n in sorted(exact, key=lambda n: exact[n] - int(exact[n]), reverse=True):  # largest remainders
        if sum(counts.values()) >= slots:
            break
        if exact[n] > int(exact[n]):
            counts[n] += 1
    common = 0
    for c in counts.values():
        common = gcd(common, c)
    counts = {n: c // common for n, c in counts.items()}
    out: list[str] = []
    current = dict.fromkeys(counts, 0)
    for _ in range(sum(counts.values())):  # smooth weighted round-robin (nginx's)
        for n, c in counts.items():
            current[n] += c
        pick = max(current, key=lambda n: current[n])
        current[pick] -= sum(counts.values())
        out.append(pick)
    return out


SESSION_SEP = "~"  # a record's session_id: "<index>~<served name>" (adapter names never hold it: ADAPTER_NAME)
RECORDS_FILE = "profile_export.jsonl"  # AIPerf 0.13.0's per-request records (aiperf/config/artifacts.py)
MAX_RECORDS_BYTES = 256 << 20  # one point's records: about 3 KiB a request
MAX_RECORD_LINE = 1 << 20  # one record's line, its newline included: a longer one is skipped, never held whole
MAX_RECORDS = 1 << 20  # lines read from one point's records: 256 MiB holds about 87,000 of AIPerf's records
MAX_DATASET_TOKENS = 1 << 26  # prompt tokens in one scenario's dataset (about 256 MiB of text): refused above
# Plain words for the prompts: any text does (the server is asked to continue it); a seeded stream of them is cut
# into windows of the scenario's token lengths.
WORDS_TEXT = ("the of and to in is that it was for on are as with his they at be this from have or by one had not "
         "but what "
         "all were when we there can an your which their said if do will each about how up out them then she many "
         "some so these would other into has more her two like him see time could no make than first been its who now "
         "people my made over did down only way find use may water long little very after words called just where "
         "most know get through back much before go good new write our used me man too any day same right look think "
         "also around another came come work three word must because does part even place well such here take why "
         "things help put years different away again off went old number great tell men say small every found still "
         "between name should home big give air line set own under read last never us left end along while might "
         "next sound below saw something thought both few those always looked show large often together asked house "
         "world going want school important until form food keep children feet land side without boy once animals "
         "life enough took sometimes four head above kind began almost live page got earth need far hand high year "
         "mother light parts country father let night following picture being study second eyes soon times story "
         "boys since white days ever paper hard near sentence better best across during today others sure means "
         "knew its try told young miles sun ways thing whole hear example heard several change answer room sea "
         "against top turned learn point city play toward five using himself usually")


@lru_cache(maxsize=4)
def _tokenizer(tokenizer_dir: str) -> PreTrainedTokenizerBase:
    """The served tokenizer, loaded once per sweep (every scenario's dataset is cut with it)."""
    from transformers import AutoTokenizer

    tok: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(tokenizer_dir)
    return tok


def mix_dataset(scenario: Scenario, names: Sequence[str], extras: Mapping[str, Mapping[str, JsonValue] | None], *,
                count: int, tokenizer_dir: str, seed: int) -> list[dict[str, JsonValue]]:
    """`count` single_turn records for `scenario`, the nth for served model names[n mod len] with its request fields
    `extras[name]` (None: the base, nothing added): a prompt of the scenario's token length (normal around its mean,
    at least 1), `output_length` likewise."""
    if not names:
        raise ValueError("an adapter mix needs at least one served model name")
    rng, words = random.Random(seed), WORDS_TEXT.split()
    lengths = [(max(1, round(rng.gauss(scenario.input_tokens_mean, scenario.input_tokens_stddev))),
                max(1, round(rng.gauss(scenario.output_tokens_mean, scenario.output_tokens_stddev))))
               for _ in range(count)]
    total = sum(isl for isl, _ in lengths)
    if total > MAX_DATASET_TOKENS:
        raise InputError(f"benchmark: scenario {scenario.name}: {count} requests of about "
                         f"{scenario.input_tokens_mean} prompt tokens are {total} tokens to write for the adapter "
                         f"mix's dataset, over {MAX_DATASET_TOKENS}: lower benchmark.request_count or the scenario's "
                         "input_tokens_mean")
    tok = _tokenizer(tokenizer_dir)
    longest = max(isl for isl, _ in lengths)
    stream: list[int] = []
    while len(stream) < 2 * longest + 1:
        text = " ".join(rng.choice(words) for _ in range(max(64, longest)))
        stream += tok(text, add_special_tokens=False)["input_ids"]
    out: list[dict[str, JsonValue]] = []
    for n, (isl, osl) in enumerate(lengths):
        name = names[n % len(names)]
        start = rng.randrange(0, len(stream) - isl)
        piece = tok.decode(stream[start:start + isl])
        record: dict[str, JsonValue] = {"session_id": f"{n:06d}{SESSION_SEP}{name}",
                                        "text": piece if isinstance(piece, str) else " ".join(piece),
                                        "output_length": osl}
        extra = extras.get(name)
        if extra:
            record["extra"] = dict(extra)
        out.append(record)
    return out


def write_mix_dataset(path: Path, records: Sequence[Mapping[str, JsonValue]]) -> Path:
    """The records as AIPerf's single_turn JSONL, written whole (a temporary file renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    tmp.replace(path)
    return path


def _metric(metrics: object, name: str) -> float | None:
    value = metrics.get(name) if isinstance(metrics, dict) else None
    v = value.get("value") if isinstance(value, dict) else None
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def served_figures(totals: Mapping[str, tuple[int, int, float]], asked: Mapping[str, float] | None = None,
                   measured_by: Literal["server", "client"] = "server") -> dict[str, ServedFigures]:
    """Each served name's requests, completion tokens, share and mean request latency over a sweep, from its
    `totals` (requests, completion tokens, summed request latency in milliseconds), beside the share the spec
    `asked` for it; `measured_by`: the server's counters or AIPerf's per-request records (the client)."""
    total = sum(requests for requests, _, _ in totals.values())
    return {n: ServedFigures(requests=requests, completion_tokens=tokens,
                             share=round(requests / total, 6) if total else 0.0,
                             mean_latency_ms=round(latency_ms / requests, 3) if requests else None,
                             traffic_share=(asked or {}).get(n), measured_by=measured_by)
            for n, (requests, tokens, latency_ms) in totals.items()}


def bounded_lines(f: IO[bytes], max_line: int, max_lines: int) -> Iterator[bytes]:
    """The first `max_lines` lines of `f`, each with its newline; a line longer than `max_line` bytes (its newline
    included) counts among them but is skipped, read past in pieces of at most `max_line + 1` bytes, never whole."""
    for _ in range(max_lines):
        raw = f.readline(max_line + 1)
        if not raw:
            return
        if len(raw) <= max_line:
            yield raw
            continue
        while raw and not raw.endswith(b"\n"):  # the rest of the over-long line
            raw = f.readline(max_line + 1)


def _record_totals(path: Path, counts: dict[str, list[float]]) -> None:
    """One point's profiling records added to `counts` (name: [requests, completion tokens, summed latency ms])."""
    with path.open("rb") as f:
        for raw in bounded_lines(f, MAX_RECORD_LINE, MAX_RECORDS):
            try:
                rec = json.loads(raw)
            except ValueError:
                continue
            meta = rec.get("metadata") if isinstance(rec, dict) else None
            if not isinstance(meta, dict) or meta.get("benchmark_phase") != "profiling":
                continue
            session = meta.get("conversation_id")
            name = session.partition(SESSION_SEP)[2] if isinstance(session, str) else ""
            if name not in counts or rec.get("error"):
                continue
            c = counts[name]
            c[0] += 1
            c[1] += int(_metric(rec.get("metrics"), "output_sequence_length") or 0)
            c[2] += _metric(rec.get("metrics"), "request_latency") or 0.0


def served_from_records(points: Sequence[Path], names: Sequence[str], asked: Mapping[str, float] | None = None
                        ) -> dict[str, ServedFigures]:
    """Each served name's figures (served_figures, as the client saw them) over the profiling phase of the sweep's
    `points` (their folders' profile_export.jsonl), by each record's session id; a failed request, a record of
    another name, an unreadable line or one over MAX_RECORD_LINE, a line past the first MAX_RECORDS of a file, or a
    file over MAX_RECORDS_BYTES is not counted."""
    counts: dict[str, list[float]] = {n: [0, 0, 0.0] for n in names}
    for path in (d / RECORDS_FILE for d in points):
        if path.is_file() and path.stat().st_size <= MAX_RECORDS_BYTES:
            _record_totals(path, counts)
    return served_figures({n: (int(c[0]), int(c[1]), c[2]) for n, c in counts.items()}, asked, "client")


@dataclass(frozen=True)
class MixPlan:
    """How a sweep sends a unit's adapter mix: `model` (AIPerf's --model: the base's name, or the round-robin list of
    names), each name's share (None: no mix), each scenario's dataset where the adapters are selected by a request
    field, what the log says before the sweep (`note`), and the warning the sweep's report carries where the mix
    cannot be sent at all (`warning`)."""

    model: str
    shares: dict[str, float] | None = None
    datasets: dict[str, Path] | None = None
    note: str | None = None
    warning: str | None = None


def plan_mix(spec: BuildSpec, base_name: str, tokenizer_dir: str, served: Sequence[str],
             fields: Mapping[str, Mapping[str, JsonValue] | None] | None, out: Path) -> MixPlan:
    """The mix for a unit serving `served` (the base's name, then each adapter's; [] for none). `fields`: where the
    lane's server selects an adapter by a request field (lane trtllm's lora_request), each name's fields; then each
    scenario's requests are written as a single_turn dataset under `out` (warm-up included), the base named as every
    request's `model`. Else AIPerf 0.13.0's `--model` takes a comma-separated list assigned round-robin, the nth
    request to model n mod len (aiperf/common/enums/enums.py ModelSelectionStrategy.ROUND_ROBIN, the CLI default:
    aiperf/config/endpoint.py MODEL_SELECTION_STRATEGY): the shares as names repeated. Another tool sends every
    request to the base; where the lane selects an adapter by a request field, which only AIPerf's custom dataset
    carries per request (AIPerf 0.13.0 single_turn `extra`, shallow-merged into the body:
    aiperf/dataset/loader/models.py SingleTurn.extra) and genai-perf's synthetic requests do not, the plan's
    `warning` says so for the report."""
    if not served:
        return MixPlan(model=base_name)
    tool = spec.benchmark.tool
    if tool is not BenchTool.AIPERF:
        warning = None if fields is None else (
            f"adapter mix: lane {spec.lane} selects an adapter by the request's lora_request, which {tool.value}'s "
            "synthetic requests do not carry: every request went to the base; the adapters are gated (smoke), not "
            "benchmarked (benchmark.tool: aiperf sends the mix)")
        return MixPlan(model=base_name, note=f"{tool.value} sends every request to the base ({base_name}): the "
                                             "adapter mix is measured with aiperf only", warning=warning)
    shares = served_shares(spec, base_name)
    names = round_robin(shares)
    mix = ", ".join(f"{n} {s:.0%}" for n, s in shares.items())
    if fields is None:
        return MixPlan(model=",".join(names), shares=shares,
                       note=f"the adapter mix {mix} (round-robin over {len(names)} model names)")
    bench = spec.benchmark
    datasets = {s.name: write_mix_dataset(out / f"{s.name}.jsonl", mix_dataset(
        s, names, fields, count=bench.request_count + bench.warmup_request_count, tokenizer_dir=tokenizer_dir,
        seed=bench.seed)) for s in bench.scenarios}
    return MixPlan(model=base_name, shares=shares, datasets=datasets,
                   note=f"the adapter mix {mix} (a dataset of {len(names)} requests repeated, each with its "
                        "adapter's request fields)")
