"""A published manifest reads and writes back byte for byte: its bytes are signed, hashed into pointers and
compared by digest, so the typed model must keep every key, its order and its number form (issue 35)."""

from __future__ import annotations

from pathlib import Path

import pytest

from enginefoundry.store.manifest import Manifest

FIXTURES = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "manifests").glob("*.json"))


def test_there_are_fixtures() -> None:
    assert len(FIXTURES) >= 20


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_a_published_manifest_round_trips_to_identical_bytes(path: Path) -> None:
    raw = path.read_bytes()
    assert Manifest.model_validate_json(raw).to_json() == raw
