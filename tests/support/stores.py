"""What the store tests share: a store fixture on file:// and SeaweedFS, a small bundle to publish, and the
manifest fields of one unit."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from enginefoundry.inputs.units import key_of
from enginefoundry.store.backends import FileStore, S3Store, Store

QUIET = {"progress": lambda _: None}


def store_fixture(prefix: str) -> Any:
    """A `store` fixture run twice: on a new file:// store, and (marked `services`) under `s3://enginefoundry/
    <prefix>-<unique>` on the session's SeaweedFS."""

    @pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.services)])
    def store(request: pytest.FixtureRequest, tmp_path: Path, unique: str) -> Store:
        if request.param == "file":
            return FileStore(f"file://{tmp_path / 'store'}")
        request.getfixturevalue("s3_env")
        return S3Store(f"s3://enginefoundry/{prefix}-{unique}")

    return store


def small_bundle(tmp: Path, name: str = "bundle", seed: bytes = b"", *, serving: bool = False) -> Path:
    """A unit folder of three small files: weights, a JSON file and an executable serve.sh (under serving/ as the
    pipeline writes it, or at the top)."""
    root = tmp / name
    (root / "model").mkdir(parents=True)
    (root / "model" / "weights.safetensors").write_bytes(b"W" * 100_000 + seed)
    (root / "model" / ("tokenizer_config.json" if serving else "config.json")).write_text('{"a": 1}')
    script = root / "serving" / "serve.sh" if serving else root / "serve.sh"
    script.parent.mkdir(exist_ok=True)
    script.write_text("#!/bin/sh\necho serve\n")
    os.chmod(script, 0o755)
    return root


def unit_fields(tag: str = "u", run: str = "r1") -> dict[str, Any]:
    """The manifest fields of one unit named `tag`, built by MLflow run `run` (a JSON edge: publish_build's input)."""
    comps = {"unit": tag}
    return dict(key=key_of(comps), key_components=comps, model="m", unit=tag, lane="reference", target={},
                variant={}, profile={}, source={}, status="candidate", mlflow_run_id=run)
