"""A published manifest reads and writes back byte for byte: its bytes are signed, hashed into pointers and
compared by digest, so the typed model must keep every key, its order and its number form (issue 35)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from enginefoundry.schemas.base import DocumentError
from enginefoundry.schemas.checkpoint import CheckpointManifest
from enginefoundry.store.manifest import Manifest

FIXTURES = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "manifests").glob("*.json"))


def test_there_are_fixtures() -> None:
    assert len(FIXTURES) >= 20


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_a_published_manifest_round_trips_to_identical_bytes(path: Path) -> None:
    raw = path.read_bytes()
    assert Manifest.model_validate_json(raw).to_json() == raw


CHECKPOINTS = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "manifests" / "checkpoints").glob("*.json"))


@pytest.mark.parametrize("path", CHECKPOINTS, ids=lambda p: p.name)
def test_a_published_checkpoint_manifest_round_trips_to_identical_bytes(path: Path) -> None:
    raw = path.read_bytes()
    assert CheckpointManifest.parse(raw).to_json() == raw


def test_a_manifest_reads_its_parts_typed() -> None:
    searched = Manifest.parse(next(p for p in FIXTURES if "search-measured" in p.name).read_bytes())
    assert searched.benchmark.search is not None and searched.benchmark.usd_per_mtok() is not None
    assert searched.key_components.toolchain is not None and searched.key_components.toolchain.lane == "reference"
    assert searched.smoke.figure("smoke_agreement") is not None
    adapter = Manifest.parse(next(p for p in FIXTURES if "plus-one" in p.name).read_bytes())
    assert adapter.source.identity is not None and adapter.source.identity.adapter is not None
    assert adapter.key_components.key == adapter.key  # the key is the hash of the typed components


@pytest.mark.parametrize(("mangle", "said"), [
    (lambda raw: b"[" * 50_000, "nested deeper than"),
    (lambda raw: raw.replace(b'"size": ', b'"size": 1' + b"0" * 60 + b", \"x\": ", 1), "digits"),
    (lambda raw: raw[: len(raw) // 2], "not JSON"),
    (lambda raw: raw.replace(b'"model": "', b'"model": NaN, "m": "', 1), "NaN is not JSON"),
    (lambda raw: raw.replace(b'"smoke_n": ', b'"smoke_n": "many", "was": ', 1), "smoke.smoke_n"),
])
def test_a_hostile_manifest_is_refused_with_a_message(mangle: Callable[[bytes], bytes], said: str) -> None:
    with pytest.raises(DocumentError, match=r"^manifest: ") as err:
        Manifest.parse(mangle(FIXTURES[0].read_bytes()))
    assert said in str(err.value)
