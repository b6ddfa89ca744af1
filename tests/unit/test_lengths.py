"""Prompt-length analysis: percentiles, recommended limits, the short/long split, and reading JSONL."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from enginefoundry.errors import InputError
from enginefoundry.spec.lengths import (
    MIN_SAMPLES_FOR_P99,
    ROUND_TO,
    analyze_lengths,
    percentile,
    read_lengths,
    round_up,
)

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    """A real Hugging Face tokenizer (word level, with a chat template) saved to disk."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>", "hello", "world", "how", "are",
             "you", "?", "be", "brief"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    out = tmp_path_factory.mktemp("tok")
    fast.save_pretrained(out)
    return out


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n")
    return path


def test_nearest_rank_percentiles():
    xs = list(range(1, 101))
    assert [percentile(xs, q) for q in (50, 90, 95, 99, 100)] == [50, 90, 95, 99, 100]
    assert percentile([7], 99) == 7
    assert round_up(1) == 256 and round_up(256) == 256 and round_up(257) == 512


def test_limits_from_p99_with_headroom():
    rng = random.Random(0)
    counts = [rng.randint(200, 1200) for _ in range(1000)]
    r = analyze_lengths(counts, output_budget=512)
    assert (r.count, r.base) == (1000, "p99")
    assert r.p50 <= r.p90 <= r.p95 <= r.p99 <= r.max
    assert r.max_input_len % ROUND_TO == 0 and r.max_input_len >= r.p99 * 1.1
    assert r.max_input_len - ROUND_TO < r.p99 * 1.1
    assert r.max_seq_len == r.max_input_len + 512
    assert r.split is None  # p99/p50 ≈ 1.7: one profile is right
    assert "p99" in r.rule and "512" in r.rule


def test_small_samples_size_from_the_maximum():
    r = analyze_lengths([100, 120, 130, 900], headroom=0.0)
    assert MIN_SAMPLES_FOR_P99 > 4 and r.base == "max"
    assert r.max_input_len == 1024 and r.max_seq_len == 1024 + 1024


def test_heavy_tail_proposes_short_and_long_profiles():
    counts = [300] * 900 + [3000] * 80 + [12000] * 20
    r = analyze_lengths(counts, output_budget=1024)
    assert (r.p50, r.p90, r.p99) == (300, 300, 12000)
    assert r.split is not None
    short, long = r.split
    assert (short.name, short.covers, short.max_input_len) == ("short", "p90", 512)
    assert (long.name, long.covers, long.max_input_len) == ("long", "p99", r.max_input_len)
    assert long.max_input_len == round_up(12000 * 1.1) and long.max_seq_len == long.max_input_len + 1024


def test_bad_inputs_are_refused():
    with pytest.raises(InputError, match="no prompt lengths"):
        analyze_lengths([])
    with pytest.raises(InputError, match="non-negative integers"):
        analyze_lengths([10, -1])
    with pytest.raises(InputError, match="output_budget"):
        analyze_lengths([10], output_budget=0)


def test_read_token_counts(tmp_path):
    path = write_jsonl(tmp_path / "l.jsonl", [{"tokens": 12}, "", {"input_tokens": 40, "output_tokens": 9}])
    assert read_lengths(path) == [12, 40]


def test_read_errors_name_the_line(tmp_path):
    cases = [
        ([{"tokens": 1}, "{not json"], r"l\.jsonl:2: not valid JSON"),
        ([{"tokens": 1}, {"tokens": 2}, {"prompt": "hi"}], r"l\.jsonl:3: a text record needs a tokenizer"),
        ([{"tokens": -3}], r"l\.jsonl:1: 'tokens' must be a non-negative integer"),
        ([{"text": "x"}], r"l\.jsonl:1: expected one of the keys tokens, input_tokens, prompt, messages"),
        ([[1, 2]], r"l\.jsonl:1: each line must be a JSON object"),
    ]
    for records, pattern in cases:
        path = write_jsonl(tmp_path / "l.jsonl", records)
        with pytest.raises(InputError, match=pattern):
            read_lengths(path)
    with pytest.raises(InputError, match="does not exist"):
        read_lengths(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(InputError, match="has no records"):
        read_lengths(tmp_path / "empty.jsonl")


def test_read_text_records_with_a_tokenizer(tmp_path, tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "how are you ?"}]
    path = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "hello world"}, {"messages": messages}, {"tokens": 5}])
    counts = read_lengths(path, tokenizer_dir=tokenizer_dir)
    expected_chat = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    if hasattr(expected_chat, "keys"):
        expected_chat = expected_chat["input_ids"]
    assert counts == [len(tok("hello world")["input_ids"]), len(expected_chat), 5]
    assert counts[1] == 9  # <|system|> be brief <|user|> how are you ? <|assistant|>
    bad = write_jsonl(tmp_path / "b.jsonl", [{"messages": "hi"}])
    with pytest.raises(InputError, match=r"b\.jsonl:1: 'messages' must be a list"):
        read_lengths(bad, tokenizer_dir=tokenizer_dir)


def test_read_then_analyze(tmp_path):
    path = write_jsonl(tmp_path / "l.jsonl", [{"tokens": n} for n in range(1, 201)])
    r = analyze_lengths(read_lengths(path), output_budget=256)
    assert (r.p50, r.p99, r.max_input_len, r.max_seq_len) == (100, 198, 256, 512)
