"""The adapter mix as AIPerf's single_turn dataset (bench/mix.py), for a lane that selects an adapter by a request
field (lane trtllm's lora_request), and each adapter's figures read back from AIPerf's per-request records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from enginefoundry.bench import mix
from enginefoundry.bench.mix import bounded_lines, mix_dataset, served_from_records, write_mix_dataset
from enginefoundry.errors import InputError
from enginefoundry.spec import Scenario
from tests.support.paths import TINY_MODEL

PLUS_ONE = {"lora_request": {"lora_name": "plus-one", "lora_int_id": 0, "lora_path": "adapters/plus-one"}}


def test_each_record_is_its_names_prompt_of_the_scenarios_length_with_its_adapters_fields(tmp_path: Path):
    from transformers import AutoTokenizer

    scenario = Scenario(name="short", input_tokens_mean=24, input_tokens_stddev=4, output_tokens_mean=16)
    names = ["plus-one", "base", "plus-one", "plus-one"]
    records = mix_dataset(scenario, names, {"base": None, "plus-one": PLUS_ONE}, count=10,
                          tokenizer_dir=str(TINY_MODEL), seed=42)
    assert [str(r["session_id"]).split("~")[1] for r in records] == [names[i % 4] for i in range(10)]
    assert all(r["extra"] == PLUS_ONE for r in records if str(r["session_id"]).endswith("~plus-one"))
    assert all("extra" not in r for r in records if str(r["session_id"]).endswith("~base"))
    tok = AutoTokenizer.from_pretrained(TINY_MODEL)
    lengths = [len(tok(str(r["text"]), add_special_tokens=False)["input_ids"]) for r in records]
    assert all(12 <= n <= 36 for n in lengths), lengths  # about 24 ± 4 (a decoded window re-tokenizes nearly alike)
    assert len(set(lengths)) > 1 and all(r["output_length"] == 16 for r in records)
    again = mix_dataset(scenario, names, {"base": None, "plus-one": PLUS_ONE}, count=10,
                        tokenizer_dir=str(TINY_MODEL), seed=42)
    assert again == records  # seeded: every endpoint and every run gets the same requests
    path = write_mix_dataset(tmp_path / "d" / "short.jsonl", records)
    assert [json.loads(line) for line in path.read_text().splitlines()] == records
    assert not list(path.parent.glob("*.part"))


def test_a_dataset_too_large_to_write_is_refused_with_the_fields_before_any_tokenizer_loads():
    huge = Scenario(name="long", input_tokens_mean=1 << 20, output_tokens_mean=16)
    with pytest.raises(InputError, match=r"scenario long: 100 requests .* lower benchmark\.request_count"):
        mix_dataset(huge, ["base"], {"base": None}, count=100, tokenizer_dir="/nonexistent", seed=1)


def _record(session: str, phase: str = "profiling", tokens: int = 4, latency: float = 10.0, **extra: object) -> str:
    return json.dumps({"metadata": {"conversation_id": session, "benchmark_phase": phase},
                       "metrics": {"output_sequence_length": {"value": tokens, "unit": "tokens"},
                                   "request_latency": {"value": latency, "unit": "ms"}}, **extra})


def test_each_adapters_figures_come_from_the_profiling_records_of_the_sweeps_points(tmp_path: Path):
    one, two, other = tmp_path / "short-c1", tmp_path / "short-c2", tmp_path / "search"
    for d in (one, two, other):
        d.mkdir()
    (one / "profile_export.jsonl").write_text("\n".join([
        _record("000000~plus-one", phase="warmup"),  # not the measured window
        _record("000001~plus-one", tokens=5, latency=20.0),
        _record("000002~base", tokens=3, latency=10.0),
        _record("000003~plus-one", error={"code": 500}),  # failed: not counted
        _record("000004~stranger"),  # a name not served: not counted
        "not json", "[1, 2]",
    ]) + "\n")
    (two / "profile_export.jsonl").write_text(_record("000005~plus-one", tokens=7, latency=40.0) + "\n")
    (other / "profile_export.jsonl").write_text(_record("000006~base") + "\n")  # not one of the sweep's points
    got = served_from_records([one, two, tmp_path / "missing"], ["base", "plus-one"], {"plus-one": 0.75})
    assert got["plus-one"].requests == 2 and got["plus-one"].completion_tokens == 12
    assert got["plus-one"].mean_latency_ms == 30.0 and got["plus-one"].share == round(2 / 3, 6)
    assert got["plus-one"].traffic_share == 0.75 and got["plus-one"].measured_by == "client"
    assert got["base"].requests == 1 and got["base"].traffic_share is None
    empty = served_from_records([], ["base"])
    assert empty["base"].requests == 0 and empty["base"].mean_latency_ms is None and empty["base"].share == 0.0


def test_a_record_line_over_the_bound_is_skipped_unread_and_the_records_after_it_count(tmp_path: Path):
    point = tmp_path / "short-c1"
    point.mkdir()
    long = _record("000001~plus-one", tokens=100, padding="x" * mix.MAX_RECORD_LINE)  # a whole record, too long
    assert len(long) > mix.MAX_RECORD_LINE
    (point / "profile_export.jsonl").write_text("\n".join([
        _record("000000~plus-one", tokens=5, latency=20.0), long, _record("000002~plus-one", tokens=7, latency=40.0),
    ]) + "\n")
    got = served_from_records([point], ["base", "plus-one"])["plus-one"]
    assert got.requests == 2 and got.completion_tokens == 12 and got.mean_latency_ms == 30.0


def test_the_line_reader_holds_at_most_its_bound_and_stops_after_its_count(tmp_path: Path):
    path = tmp_path / "lines"
    path.write_bytes(b"ab\n" + b"y" * 25 + b"\n" + b"cd\n" + b"z" * 9)  # the last: over the bound, no newline
    with path.open("rb") as f:
        assert list(bounded_lines(f, 8, 10)) == [b"ab\n", b"cd\n"]
    with path.open("rb") as f:
        assert list(bounded_lines(f, 8, 2)) == [b"ab\n"]  # the over-long line counts among the two
    with path.open("rb") as f:
        assert list(bounded_lines(f, 3, 10)) == [b"ab\n", b"cd\n"]  # a line of exactly the bound is kept


def test_the_records_past_the_cap_of_a_file_are_not_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(mix, "MAX_RECORDS", 2)
    point = tmp_path / "short-c1"
    point.mkdir()
    (point / "profile_export.jsonl").write_text("".join(_record(f"{i:06d}~base") + "\n" for i in range(3)))
    assert served_from_records([point], ["base"])["base"].requests == 2


def test_the_tokenizer_is_loaded_once_for_every_scenario_of_a_sweep(monkeypatch: pytest.MonkeyPatch):
    import transformers

    loads: list[str] = []
    real = transformers.AutoTokenizer.from_pretrained

    def counted(path: str) -> object:
        loads.append(path)
        return real(path)

    mix._tokenizer.cache_clear()
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", counted)
    for name in ("short", "long"):
        scenario = Scenario(name=name, input_tokens_mean=8, output_tokens_mean=4)
        mix_dataset(scenario, ["base"], {"base": None}, count=2, tokenizer_dir=str(TINY_MODEL), seed=1)
    mix._tokenizer.cache_clear()
    assert loads == [str(TINY_MODEL)]
