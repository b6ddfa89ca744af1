"""Stores and the publish protocol, on a file:// store and on real SeaweedFS."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from enginefoundry.errors import StoreError
from enginefoundry.inputs.units import key_of
from enginefoundry.store.backends import PART_SIZE, FileStore, S3Store, blob_key, current_umask, open_store
from enginefoundry.store.publish import find_current, publish_build, upload_folders
from enginefoundry.store.verify import pull


def _folder(tmp: Path, big: int = 0) -> Path:
    root = tmp / "bundle"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("alpha")
    (root / "sub" / "b.bin").write_bytes(os.urandom(1000))
    if big:
        (root / "big.bin").write_bytes(os.urandom(big))
    return root


def _fields(name: str, status: str = "candidate", run: str = "r1") -> dict:
    comps = {"k": name}
    return dict(key=key_of(comps), key_components=comps, model="m", unit="u", lane="reference", target={},
                variant={}, profile={}, source={}, status=status, mlflow_run_id=run)


@pytest.fixture(params=["file", "s3"])
def store(request, tmp_path, unique):
    if request.param == "file":
        return FileStore(f"file://{tmp_path / 'store'}")
    request.getfixturevalue("s3_env")
    return S3Store(f"s3://enginefoundry/test-{unique}")


def test_upload_hashes_in_the_same_pass_and_download_verifies(store, tmp_path):
    folder = _folder(tmp_path, big=PART_SIZE * 2 + 123)  # multipart on S3
    entries, total, _ = upload_folders(store, {"bundle": folder}, progress=lambda _: None)
    expected = {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in folder.rglob("*") if p.is_file()}
    assert {e.path: e.sha256 for e in entries} == {f"bundle/{k}": v for k, v in expected.items()}
    assert total == sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    assert all(store.size(blob_key(e.sha256)) == e.size for e in entries)
    result = publish_build(store, "m", _fields("k1"), {"bundle": folder}, progress=lambda _: None)
    assert result.created
    build = find_current(store, "m", result.manifest.key)
    assert build is not None and build.build_id == result.build_id
    pull(store, build, tmp_path / "down")
    assert sorted(p.name for p in (tmp_path / "down").rglob("*") if p.is_file()) == ["a.txt", "b.bin", "big.bin"]
    assert (tmp_path / "down" / "bundle" / "big.bin").read_bytes() == (folder / "big.bin").read_bytes()


def test_racing_publishers_publish_once_and_the_loser_adopts(store, tmp_path):
    folder = _folder(tmp_path)
    results = []

    def publish(run: str) -> None:
        results.append(publish_build(store, "m", _fields("k2", run=run), {"bundle": folder},
                                     progress=lambda _: None))

    threads = [threading.Thread(target=publish, args=(f"run-{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.created for r in results) == 1
    winner = next(r for r in results if r.created)
    assert {r.manifest.mlflow_run_id for r in results} == {winner.manifest.mlflow_run_id}
    assert {r.build_id for r in results} == {winner.build_id}


def test_corrupted_object_is_refused_with_the_file_named(store, tmp_path):
    folder = _folder(tmp_path)
    result = publish_build(store, "m", _fields("k3"), {"bundle": folder}, progress=lambda _: None)
    entry = next(e for e in result.manifest.files if e.path == "bundle/a.txt")
    bad = tmp_path / "tampered"
    bad.write_text("ALPHA")  # same size: only the sha256 tells
    store.delete(blob_key(entry.sha256))
    store.put_file(bad, blob_key(entry.sha256))
    build = find_current(store, "m", result.manifest.key)
    with pytest.raises(StoreError, match=r"bundle/a.txt: .* is corrupted"):
        pull(store, build, tmp_path / "down")


def test_wrong_credentials_are_a_store_error(s3_env, monkeypatch, tmp_path, unique):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-123")
    store = S3Store(f"s3://enginefoundry/test-{unique}")
    f = tmp_path / "x"
    f.write_text("x")
    with pytest.raises(StoreError, match="failed on s3://enginefoundry"):
        store.put_file(f, "x")
    assert "wrong-secret-123" not in str(f)


def test_file_store_writes_are_atomic(tmp_path):
    store = open_store(f"file://{tmp_path}/s")
    f = tmp_path / "f"
    f.write_bytes(b"1" * 10)
    store.put_file(f, "a/b")
    assert store.list("a") == ["a/b"]
    assert (tmp_path / "s" / "a" / "b").stat().st_mode & 0o777 == 0o666 & ~current_umask()
    assert not list((tmp_path / "s" / "a").glob("*.partial"))
    assert store.create_if_absent("a/m.json", b"{}") and not store.create_if_absent("a/m.json", b"[]")
    assert store.read_bytes("a/m.json") == b"{}"
