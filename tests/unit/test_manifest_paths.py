"""Confinement: hostile manifest paths and store keys are refused at parse; a file:// store never follows a
symlink; build URIs are parsed strictly."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from enginefoundry.errors import InputError, StoreError
from enginefoundry.store.backends import FileStore, S3Store, link_or_copy, store_key
from enginefoundry.store.manifest import FileEntry, Manifest
from enginefoundry.store.publish import locate, manifests_prefix

DIGEST = "a" * 64
HOSTILE = ["../x", "/etc/passwd", "a/../../b", "a\\b", "./a", "", "a\x00b", "a//b", "a/", "a/./b", "..", ".",
           "bundle/../../../etc/shadow", "C:\\win", "a/.."]


@pytest.mark.parametrize("path", HOSTILE)
def test_hostile_file_entry_path_is_refused_with_the_field_named(path):
    with pytest.raises(ValidationError, match=r"files\[\]\.path"):
        FileEntry(path=path, size=1, sha256=DIGEST)


@pytest.mark.parametrize("path", HOSTILE)
def test_a_manifest_carrying_a_hostile_path_does_not_parse(path):
    data = {"key": "k", "key_components": {}, "model": "m", "unit": "u", "lane": "reference", "target": {},
            "variant": {}, "profile": {}, "source": {}, "status": "candidate",
            "files": [{"path": "bundle/ok.bin", "size": 1, "sha256": DIGEST}, {"path": path, "size": 1,
                                                                                "sha256": DIGEST}]}
    with pytest.raises(ValidationError):
        Manifest.model_validate(json.loads(json.dumps(data)))


@pytest.mark.parametrize("path", ["bundle/model/model.safetensors", "reports/bench/x.json", "a", "a.b/c-d_e"])
def test_ordinary_paths_parse(path):
    assert FileEntry(path=path, size=0, sha256=DIGEST).path == path


@pytest.mark.parametrize("digest", ["A" * 64, "a" * 63, "g" * 64, "../" + "a" * 61])
def test_a_sha256_that_is_not_lowercase_hex_is_refused(digest):
    with pytest.raises(ValidationError):
        FileEntry(path="a", size=1, sha256=digest)


@pytest.mark.parametrize("key", HOSTILE)
def test_store_keys_are_confined(key, tmp_path):
    with pytest.raises(StoreError):
        store_key(key)
    store = FileStore(f"file://{tmp_path}")
    with pytest.raises(StoreError):
        store.exists(key)


@pytest.mark.parametrize("uri", ["s3://bucket/../../x", "s3://bucket/a/../b", "s3://bucket/a\\b"])
def test_an_s3_prefix_that_leaves_its_bucket_is_refused(uri):
    with pytest.raises(StoreError, match="store key"):
        S3Store(uri, endpoint_url="http://127.0.0.1:9")


@pytest.mark.parametrize("name", ["../m", "a/b", "", ".."])
def test_model_names_and_keys_are_single_segments(name):
    with pytest.raises(StoreError):
        manifests_prefix(name, "k" * 64)
    with pytest.raises(StoreError):
        manifests_prefix("m", name)


def test_a_symlinked_object_or_folder_in_a_file_store_is_corrupt_never_followed(tmp_path):
    store = FileStore(f"file://{tmp_path / 'store'}")
    assert store.create_if_absent("manifests/m/k/x.json", b"{}")
    (tmp_path / "store" / "blobs").mkdir()
    os.symlink("/etc/passwd", tmp_path / "store" / "blobs" / "evil")
    for call in (store.exists, store.size, store.read_bytes):
        with pytest.raises(StoreError, match="symlink"):
            call("blobs/evil")
    os.symlink(tmp_path / "store" / "manifests", tmp_path / "store" / "linked")
    with pytest.raises(StoreError, match="symlink"):
        store.read_bytes("linked/m/k/x.json")
    assert store.list("") == ["manifests/m/k/x.json"]  # listing does not descend into the linked folder


def test_link_or_copy_shares_the_inode_on_one_filesystem(tmp_path):
    src = tmp_path / "a"
    src.write_bytes(b"weights")
    link_or_copy(src, tmp_path / "b")
    assert (tmp_path / "b").stat().st_ino == src.stat().st_ino


@pytest.mark.parametrize(("uri", "expected"), [
    ("file:///s/manifests/m/" + "a" * 64, ("file:///s", "manifests", "m", "a" * 64, None)),
    ("s3://b/p/manifests/m/k/current.json", ("s3://b/p", "manifests", "m", "k", None)),
    ("s3://b/p/manifests/m/k/20261130T000000Z-ab.json", ("s3://b/p", "manifests", "m", "k", "20261130T000000Z-ab")),
    ("file:///s/artifacts/m/k/manifest.json", ("file:///s", "artifacts", "m", "k", "legacy")),
    ("file:///s/checkpoints/m/k/", ("file:///s", "checkpoints", "m", "k", "legacy")),
])
def test_build_uris_are_located(uri, expected):
    assert locate(uri) == expected


@pytest.mark.parametrize("uri", ["file:///s/other/m/k", "file:///s/artifacts/m/k/other.json", "file:///s/manifests/m"])
def test_other_uris_are_not_builds(uri):
    with pytest.raises(InputError, match="not the URI of a published build"):
        locate(uri)


def test_path_confinement_is_also_what_a_pulled_path_resolves_to(tmp_path: Path):
    """Parsing is the gate: every accepted path joins under the destination."""
    for path in ["bundle/a", "x/y/z.bin"]:
        entry = FileEntry(path=path, size=0, sha256=DIGEST)
        assert (tmp_path / entry.path).resolve().is_relative_to(tmp_path.resolve())
