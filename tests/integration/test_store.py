"""Stores and the publish protocol, on a file:// store and on real SeaweedFS."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from enginefoundry.errors import StoreError
from enginefoundry.manifest import Manifest
from enginefoundry.publish import download_verified, publish_manifest, upload_folders
from enginefoundry.store import PART_SIZE, FileStore, S3Store, open_store


def _folder(tmp: Path, big: int = 0) -> Path:
    root = tmp / "bundle"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("alpha")
    (root / "sub" / "b.bin").write_bytes(os.urandom(1000))
    if big:
        (root / "big.bin").write_bytes(os.urandom(big))
    return root


def _manifest(key: str, files, status: str = "candidate", run: str = "r1") -> Manifest:
    return Manifest(key=key, key_components={"k": key}, model="m", unit="u", lane="reference", target={},
                    variant={}, profile={}, source={}, files=files, status=status, mlflow_run_id=run)


@pytest.fixture(params=["file", "s3"])
def store(request, tmp_path, unique):
    if request.param == "file":
        return FileStore(f"file://{tmp_path / 'store'}")
    request.getfixturevalue("s3_env")
    return S3Store(f"s3://enginefoundry/test-{unique}")


def test_upload_hashes_in_the_same_pass_and_download_verifies(store, tmp_path):
    folder = _folder(tmp_path, big=PART_SIZE * 2 + 123)  # multipart on S3
    entries, total = upload_folders(store, "artifacts/m/k1", {"bundle": folder}, progress=lambda _: None)
    expected = {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in folder.rglob("*") if p.is_file()}
    assert {e.path: e.sha256 for e in entries} == {f"bundle/{k}": v for k, v in expected.items()}
    assert total == sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    manifest = _manifest("k1", entries)
    assert publish_manifest(store, "m", manifest).created
    got = download_verified(store, "m", manifest, tmp_path / "down")
    assert sorted(p.name for p in got) == ["a.txt", "b.bin", "big.bin"]
    assert (tmp_path / "down" / "bundle" / "big.bin").read_bytes() == (folder / "big.bin").read_bytes()


def test_racing_publishers_publish_once_and_the_loser_adopts(store):
    results = []

    def publish(run: str) -> None:
        results.append(publish_manifest(store, "m", _manifest("k2", [], run=run)))

    threads = [threading.Thread(target=publish, args=(f"run-{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.created for r in results) == 1
    winner = next(r for r in results if r.created).manifest.mlflow_run_id
    assert {r.manifest.mlflow_run_id for r in results} == {winner}


def test_corrupted_object_is_refused_with_the_file_named(store, tmp_path):
    folder = _folder(tmp_path)
    entries, _ = upload_folders(store, "artifacts/m/k3", {"bundle": folder}, progress=lambda _: None)
    manifest = _manifest("k3", entries)
    bad = tmp_path / "tampered"
    bad.write_text("not alpha")
    store.put_file(bad, "artifacts/m/k3/bundle/a.txt")
    with pytest.raises(StoreError, match=r"bundle/a.txt is corrupted"):
        download_verified(store, "m", manifest, tmp_path / "down")


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
    assert not list((tmp_path / "s" / "a").glob("*.partial"))
    assert store.create_if_absent("a/m.json", b"{}") and not store.create_if_absent("a/m.json", b"[]")
    assert store.read_bytes("a/m.json") == b"{}"
