"""Reference answers as an artifact: keyed, computed once, published, reused by the next unit of the same source."""

from __future__ import annotations

from pathlib import Path

import pytest

from enginefoundry.smoke import reference as refmod
from enginefoundry.smoke.prompts import load_prompt_set
from enginefoundry.smoke.reference import (
    ReferenceAsk,
    ReferenceSettings,
    load_or_compute_reference,
    reference_key,
    store_key,
)
from enginefoundry.store.backends import open_store
from tests.support.paths import TINY_MODEL, TINY_PROMPTS

CASES = load_prompt_set(TINY_PROMPTS).cases[:4]


def test_key_changes_with_every_input_the_answers_depend_on():
    base = reference_key(TINY_MODEL, CASES, dtype="fp32", max_new_tokens=6)
    assert base.digest == reference_key(TINY_MODEL, CASES, dtype="fp32", max_new_tokens=6).digest
    others = [
        reference_key(TINY_MODEL, CASES[:3], dtype="fp32", max_new_tokens=6),
        reference_key(TINY_MODEL, CASES, dtype="bf16", max_new_tokens=6),
        reference_key(TINY_MODEL, CASES, dtype="fp32", max_new_tokens=7),
        reference_key(TINY_MODEL, CASES, dtype="fp32", max_new_tokens=6, weights_digest="0" * 64),
    ]
    assert len({base.digest, *(k.digest for k in others)}) == 5


def test_a_second_unit_reuses_the_published_answers(tmp_path: Path):
    """Unit 1 computes and publishes; unit 2 (another machine: empty local cache) reads them from the store."""
    store = open_store(f"file://{tmp_path / 'store'}")
    before = refmod.COMPUTE_COUNT["n"]
    say: list[str] = []
    first, o1 = load_or_compute_reference(TINY_MODEL, ReferenceAsk(CASES, 6),
                                          ReferenceSettings(store=store, cache_dir=tmp_path / "unit1",
                                                            progress=say.append), dtype="fp32")
    assert o1.source == "computed" and refmod.COMPUTE_COUNT["n"] == before + 1
    key = store_key(first.key)
    assert store.exists(key) and o1.store_url == store.url(key)
    published = store.read_bytes(key)

    second, o2 = load_or_compute_reference(TINY_MODEL, ReferenceAsk(CASES, 6),
                                           ReferenceSettings(store=store, cache_dir=tmp_path / "unit2",
                                                             progress=say.append), dtype="fp32")
    assert o2.source == "store" and refmod.COMPUTE_COUNT["n"] == before + 1  # not recomputed
    assert second == first and o2.key == o1.key and store.read_bytes(key) == published
    assert [a.text for a in second.answers] == [c.expected for c in CASES]
    # a later run on the same machine: the local cache, still no computation
    _, o3 = load_or_compute_reference(TINY_MODEL, ReferenceAsk(CASES, 6),
                                      ReferenceSettings(store=store, cache_dir=tmp_path / "unit2", progress=say.append),
                                      dtype="fp32")
    assert o3.source == "local cache" and refmod.COMPUTE_COUNT["n"] == before + 1
    assert o3.label().startswith(f"fp32 reference {o1.key[:12]} of {TINY_MODEL} (local cache, file://")


def test_a_damaged_cache_entry_is_recomputed_not_trusted(tmp_path: Path):
    ref, o = load_or_compute_reference(TINY_MODEL, ReferenceAsk(CASES[:1], 6),
                                       ReferenceSettings(cache_dir=tmp_path, progress=lambda _: None), dtype="fp32")
    (tmp_path / f"{o.key}.json").write_text("{half a docu")
    again, o2 = load_or_compute_reference(TINY_MODEL, ReferenceAsk(CASES[:1], 6),
                                          ReferenceSettings(cache_dir=tmp_path, progress=lambda _: None), dtype="fp32")
    assert o2.source == "computed" and again.answers == ref.answers
    with pytest.raises(ValueError):
        refmod.ReferenceSet.model_validate_json("{half a docu")
