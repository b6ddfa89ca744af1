"""`verify` takes a converted checkpoint's key folder as well as a unit's: both live under manifests/<model>/."""

from __future__ import annotations

from pathlib import Path

from enginefoundry.inputs.units import key_of
from enginefoundry.store.backends import open_store
from enginefoundry.store.publish import publish_checkpoint
from enginefoundry.store.verify import open_build, verify_build
from tests.support.paths import TINY_MODEL


def test_a_checkpoint_key_folder_verifies(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/store")
    components = {"test": "checkpoint"}
    key = key_of(components)
    publish_checkpoint(store, {"key": key, "key_components": components, "model": "tiny", "variant": "fp32",
                               "lane": "reference", "params": {"dtype": "float32"}}, TINY_MODEL,
                       progress=lambda m: None)
    found, build = open_build(f"{store.uri}/manifests/tiny/{key}")
    assert build.checkpoint is not None and build.manifest is None
    report = verify_build(found, build, record=False)
    assert report.ok and report.files == len(list(TINY_MODEL.iterdir()))
