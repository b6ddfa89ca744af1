"""The content-addressed store on real SeaweedFS and on file://: immutable builds, verification, pull,
refused cache hits, the version 1 layout still read."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from enginefoundry.cli import main
from enginefoundry.errors import StoreError
from enginefoundry.inputs.units import key_of
from enginefoundry.records.lineage import lineage
from enginefoundry.store.backends import FileStore, Store, blob_key, current_umask
from enginefoundry.store.manifest import FileEntry, Manifest
from enginefoundry.store.publish import (
    PublishOptions,
    check_hit,
    find_checkpoint_build,
    find_current,
    pointer_key,
    publish_build,
    publish_checkpoint,
)
from enginefoundry.store.verify import last_verified, pull, verify_build
from tests.support.stores import QUIET, small_bundle, store_fixture, unit_fields

store = store_fixture("cas")


def _cli(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


def _corrupt_blob(store: Store, digest: str, data: bytes, tmp: Path) -> None:
    bad = tmp / "bad"
    bad.write_bytes(data)
    if isinstance(store, FileStore):
        path = store.root / blob_key(digest)
        path.unlink()  # may be a hard link to the work file: replace, do not write through it
        path.write_bytes(data)
    else:
        store.put_file(bad, blob_key(digest))


def test_force_makes_a_new_build_and_the_earlier_one_stays_complete_and_verifiable(store, tmp_path, capsys):
    first = publish_build(store, "m", unit_fields(), {"bundle": small_bundle(tmp_path)}, **QUIET)
    # The rebuild writes other bytes into the same work folder: the first build must not change.
    shutil.rmtree(tmp_path / "bundle")
    second = publish_build(store, "m", unit_fields(run="r2"), {"bundle": small_bundle(tmp_path, seed=b"v2")},
                           options=PublishOptions(replace=True), **QUIET)
    assert second.created and second.build_id != first.build_id
    assert second.build_id > first.build_id  # build ids sort by time
    current = find_current(store, "m", first.manifest.key)
    assert current is not None and current.build_id == second.build_id
    for result in (first, second):
        code, out = _cli(capsys, "verify", result.uri)
        assert code == 0, out
        assert "ok:" in out
    assert first.manifest.files != second.manifest.files
    # The unchanged files are one blob shared by both builds.
    shared = {e.sha256 for e in first.manifest.files} & {e.sha256 for e in second.manifest.files}
    assert len(shared) == 2


def test_corrupted_blob_fails_verify_naming_the_file_and_is_refused_as_a_hit(store, tmp_path, capsys):
    result = publish_build(store, "m", unit_fields(), {"bundle": small_bundle(tmp_path)}, **QUIET)
    entry = next(e for e in result.manifest.files if e.path.endswith("config.json"))
    _corrupt_blob(store, entry.sha256, b'{"a": 2}', tmp_path)  # same size: only the sha256 tells
    build = find_current(store, "m", result.manifest.key)
    assert build is not None
    assert check_hit(store, build) == []  # the cheap check sees sizes only
    assert [p.path for p in check_hit(store, build, rehash=True)] == ["bundle/model/config.json"]

    code, out = _cli(capsys, "verify", result.uri)
    assert code == 1
    assert "bundle/model/config.json: sha256 differs" in out and entry.sha256 in out
    code, out = _cli(capsys, "verify", "--json", result.uri)
    report = json.loads(out)
    assert code == 1 and not report["ok"]
    assert report["problems"][0]["path"] == "bundle/model/config.json"
    assert report["problems"][0]["expected"] == entry.sha256
    record = last_verified(store, build)
    assert record is not None and not record.ok


@pytest.mark.parametrize("damage", ["missing", "wrong size"])
def test_a_hit_with_a_missing_or_short_blob_is_refused_and_the_rebuild_replaces_it(store, tmp_path, damage):
    result = publish_build(store, "m", unit_fields(), {"bundle": small_bundle(tmp_path)}, **QUIET)
    entry = next(e for e in result.manifest.files if e.path.endswith("weights.safetensors"))
    if damage == "missing":
        store.delete(blob_key(entry.sha256))
    else:
        _corrupt_blob(store, entry.sha256, b"W" * 10, tmp_path)
    build = find_current(store, "m", result.manifest.key)
    assert build is not None
    problems = check_hit(store, build)
    assert [p.path for p in problems] == ["bundle/model/weights.safetensors"]
    assert damage.split()[0] in problems[0].problem
    # A rebuild without --force (other bytes, so the broken blob stays broken) replaces a broken current build
    # instead of adopting it.
    rebuilt = publish_build(store, "m", unit_fields(run="r2"), {"bundle": small_bundle(tmp_path, "again", seed=b"2")},
                            **QUIET)
    assert rebuilt.created and rebuilt.build_id != result.build_id
    assert check_hit(store, find_current(store, "m", result.manifest.key), rehash=True) == []


def test_an_edited_manifest_is_refused(store, tmp_path, capsys):
    result = publish_build(store, "m", unit_fields(), {"bundle": small_bundle(tmp_path)}, **QUIET)
    build = find_current(store, "m", result.manifest.key)
    assert build is not None
    data = json.loads(store.read_bytes(build.manifest_key))
    data["key"] = "f" * 64
    tampered = json.dumps(data, indent=2).encode()
    if isinstance(store, FileStore):
        (store.root / build.manifest_key).write_bytes(tampered)
    else:
        store.delete(build.manifest_key)
        store.create_if_absent(build.manifest_key, tampered)
    with pytest.raises(StoreError, match="changed after it was published"):
        find_current(store, "m", result.manifest.key)
    code, out = _cli(capsys, "verify", result.uri)
    assert code == 1
    assert "key is not the hash of key_components" in out and "key differs from the key of its location" in out
    assert "changed after it was published" in out


def test_a_manifest_whose_key_is_not_its_components_hash_is_refused_as_a_hit(store, tmp_path):
    fields = {**unit_fields(), "key_components": {"unit": "something else"}}
    result = publish_build(store, "m", fields, {"bundle": small_bundle(tmp_path)}, **QUIET)
    build = find_current(store, "m", result.manifest.key)
    assert build is not None
    assert [p.problem for p in check_hit(store, build)] == ["key is not the hash of key_components"]


def test_a_blob_replaced_by_a_symlink_is_refused(tmp_path, capsys):
    store = FileStore(f"file://{tmp_path / 'store'}")
    result = publish_build(store, "m", unit_fields(), {"bundle": small_bundle(tmp_path)}, **QUIET)
    entry = next(e for e in result.manifest.files if e.path.endswith("config.json"))
    blob = store.root / blob_key(entry.sha256)
    blob.unlink()
    os.symlink("/etc/passwd", blob)
    build = find_current(store, "m", result.manifest.key)
    assert build is not None
    problems = check_hit(store, build)
    assert [p.path for p in problems] == ["bundle/model/config.json"] and "symlink" in problems[0].problem
    code, out = _cli(capsys, "verify", result.uri)
    assert code == 1 and "symlink" in out
    with pytest.raises(StoreError, match="symlink"):
        pull(store, build, tmp_path / "dest")
    assert not (tmp_path / "dest" / "bundle" / "model" / "config.json").exists()


def test_pull_is_verified_resumable_and_follows_the_umask(store, tmp_path, capsys):
    old = os.umask(0o022)
    try:
        result = publish_build(store, "m", unit_fields(), {"bundle": small_bundle(tmp_path)}, **QUIET)
        dest = tmp_path / "serve"
        code, out = _cli(capsys, "pull", result.uri, str(dest))
        assert code == 0, out
        files = {p.relative_to(dest).as_posix(): p for p in dest.rglob("*") if p.is_file()}
        assert set(files) == {e.path for e in result.manifest.files}
        assert files["bundle/serve.sh"].stat().st_mode & 0o777 == 0o755
        assert files["bundle/model/config.json"].stat().st_mode & 0o777 == 0o644
        # An interrupted pull: one file gone, one truncated, a temp file left behind.
        files["bundle/serve.sh"].unlink()
        with files["bundle/model/weights.safetensors"].open("r+b") as f:
            f.truncate(10)
        (dest / "bundle" / ".weights.safetensors.x.partial").write_bytes(b"junk")
        build = find_current(store, "m", result.manifest.key)
        assert build is not None
        report = pull(store, build, dest)
        assert (report.downloaded, report.kept) == (2, 1)
        assert files["bundle/model/weights.safetensors"].read_bytes() == b"W" * 100_000
        assert files["bundle/serve.sh"].stat().st_mode & 0o777 == 0o755
        assert pull(store, build, dest).downloaded == 0
    finally:
        os.umask(old)
    if isinstance(store, FileStore):
        assert current_umask() == old


def test_a_checkpoint_and_a_bundle_that_share_a_file_share_its_blob(store, tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "weights.safetensors").write_bytes(b"C" * 50_000)
    comps = {"kind": "checkpoint"}
    published = publish_checkpoint(store, {"key": key_of(comps), "key_components": comps, "model": "m",
                                           "variant": "bf16", "lane": "reference", "params": {}}, ckpt, **QUIET)
    bundle = tmp_path / "bundle"
    shutil.copytree(ckpt, bundle / "model")
    result = publish_build(store, "m", unit_fields(), {"bundle": bundle}, **QUIET)
    assert result.bytes_uploaded == 0  # every byte was already a blob
    assert {e.sha256 for e in published.files} == {e.sha256 for e in result.manifest.files}
    build = find_checkpoint_build(store, "m", key_of(comps))
    assert build is not None and check_hit(store, build) == []


def test_a_unit_published_in_the_version_1_layout_is_still_a_hit_and_verifiable(store, tmp_path, capsys):
    folder = small_bundle(tmp_path)
    entries = []
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = f"bundle/{f.relative_to(folder).as_posix()}"
        size, digest = store.put_file(f, f"artifacts/m/{key_of({'unit': 'u'})}/{rel}")
        entries.append(FileEntry(path=rel, size=size, sha256=digest))
    manifest = Manifest(**{**unit_fields(), "schema_version": 1}, files=entries)
    key = manifest.key
    assert store.create_if_absent(f"artifacts/m/{key}/manifest.json", manifest.model_dump_json().encode())
    build = find_current(store, "m", key)
    assert build is not None and build.layout == "legacy"
    assert check_hit(store, build) == []
    assert verify_build(store, build).ok
    code, out = _cli(capsys, "verify", key[:16], "--store", store.uri)
    assert code == 0, out
    pull(store, build, tmp_path / "dest")
    assert (tmp_path / "dest" / "bundle" / "model" / "config.json").read_text() == '{"a": 1}'
    # The next build of the key goes to the new layout and becomes current.
    new = publish_build(store, "m", unit_fields(), {"bundle": folder}, options=PublishOptions(replace=True), **QUIET)
    assert find_current(store, "m", key).build_id == new.build_id
    assert store.exists(pointer_key("m", key))


def test_lineage_shows_when_the_build_was_last_verified(tmp_path):
    store = FileStore(f"file://{tmp_path / 'store'}")
    result = publish_build(store, "m", {**unit_fields(), "mlflow_run_id": None}, {"bundle": small_bundle(tmp_path)},
                           **QUIET)
    assert lineage(result.uri, "http://127.0.0.1:9")["verification"] == {}
    build = find_current(store, "m", result.manifest.key)
    verify_build(store, build)
    chain = lineage(result.uri, "http://127.0.0.1:9")
    assert chain["verification"]["ok"] is True and chain["verification"]["files"] == 3


def test_lineage_names_a_trusted_key_it_cannot_read_instead_of_blaming_the_attestations(tmp_path, monkeypatch):
    """$ENGINEFOUNDRY_TRUSTED_KEYS naming a file that is gone is the user's setting to fix: lineage's signature
    line says which and how, not "cannot read attestations (InputError)" (the store was fine)."""
    store = FileStore(f"file://{tmp_path / 'store'}")
    result = publish_build(store, "m", {**unit_fields(), "mlflow_run_id": None}, {"bundle": small_bundle(tmp_path)},
                           **QUIET)
    monkeypatch.setenv("ENGINEFOUNDRY_TRUSTED_KEYS", str(tmp_path / "gone.pub"))
    line = lineage(result.uri, "http://127.0.0.1:9")["signature"]["line"]
    assert "gone.pub" in line and "attestations" not in line, line
    assert "$ENGINEFOUNDRY_TRUSTED_KEYS" in line and "--trusted-key" not in line, line  # where it was set


@pytest.mark.parametrize("argv", [["verify", "not-a-ref"], ["verify", "abc", "--store", "file:///nonexistent"],
                                  ["verify", "file:///tmp/x/other/m/k"], ["pull", "nope", "/tmp/x"]])
def test_verify_and_pull_refuse_bad_input_with_exit_2(argv, capsys, tmp_path):
    code, out = _cli(capsys, *argv)
    assert code == 2, out


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a/../../b", "a\\b", "./a", "", "a\x00b"])
def test_a_stored_manifest_with_a_hostile_path_is_refused_before_any_file_is_touched(store, tmp_path, path, capsys):
    """Written straight into the store (as an attacker with write access would), pointer and all."""
    import hashlib

    from enginefoundry.store.publish import Pointer, build_manifest_key

    fields = unit_fields()
    data = json.dumps({**fields, "schema_version": 2, "build_id": "20260101T000000000000Z-evil",
                       "files": [{"path": path, "size": 4, "sha256": "a" * 64, "executable": False}]}).encode()
    mkey = build_manifest_key("m", fields["key"], "20260101T000000000000Z-evil")
    assert store.create_if_absent(mkey, data)
    pointer = Pointer(build_id="20260101T000000000000Z-evil", manifest_sha256=hashlib.sha256(data).hexdigest())
    assert store.create_if_absent(pointer_key("m", fields["key"]), pointer.model_dump_json().encode())
    with pytest.raises(StoreError, match="not a valid manifest"):
        find_current(store, "m", fields["key"])
    code, out = _cli(capsys, "pull", f"{store.uri}/{mkey}", str(tmp_path / "dest"))
    assert code == 1 and "not a valid manifest" in out
    assert not (tmp_path / "x").exists() and not list((tmp_path / "dest").rglob("*"))
    # The next publish of the key replaces the broken build.
    result = publish_build(store, "m", fields, {"bundle": small_bundle(tmp_path)}, **QUIET)
    assert result.created and find_current(store, "m", fields["key"]).build_id == result.build_id


def _heals(store: Store, tmp_path: Path, damage) -> None:
    result = publish_build(store, "m", unit_fields(), {"bundle": small_bundle(tmp_path)}, **QUIET)
    entry = next(e for e in result.manifest.files if e.path.endswith("weights.safetensors"))
    damage(entry.sha256)
    build = find_current(store, "m", result.manifest.key)
    assert check_hit(store, build) != []
    publish_build(store, "m", unit_fields(run="r2"), {"bundle": small_bundle(tmp_path, "again")},
                  options=PublishOptions(replace=True), **QUIET)
    assert check_hit(store, build, rehash=True) == []  # the earlier build is whole again
    assert verify_build(store, build).ok


def test_publishing_the_right_bytes_again_heals_a_short_blob(store, tmp_path):
    _heals(store, tmp_path, lambda digest: _corrupt_blob(store, digest, b"W" * 10, tmp_path))


def test_publishing_the_right_bytes_again_heals_a_blob_replaced_by_a_symlink(tmp_path):
    store = FileStore(f"file://{tmp_path / 'store'}")

    def symlink(digest: str) -> None:
        blob = store.root / blob_key(digest)
        blob.unlink()
        os.symlink("/etc/passwd", blob)

    _heals(store, tmp_path, symlink)
    assert Path("/etc/passwd").read_bytes() != b"W" * 100_000  # nothing was written through the link


def _swap(store: Store, barrier, data: str, version: str, winners: list[int], i: int) -> None:
    barrier.wait()
    if store.replace_if("manifests/m/k/current.json", data.encode(), version):
        winners.append(i)


def test_the_pointer_moves_by_compare_and_swap_with_exactly_one_winner(store):
    """S3 If-Match on the ETag (SeaweedFS 4.48 honours it) and the locked rename on file://."""
    import threading

    assert store.replace_if("manifests/m/k/current.json", b"base", None)
    assert not store.replace_if("manifests/m/k/current.json", b"again", None)  # exists: If-None-Match refuses
    # Version tags are content digests (S3 ETags, sha256 on file://): every write here is unique, as every
    # pointer is (it names a unique build id), so an A-B-A cannot pass for "unchanged".
    for round_ in range(5):
        _, version = store.read_versioned("manifests/m/k/current.json")
        winners: list[int] = []
        barrier = threading.Barrier(8)
        threads = [threading.Thread(target=_swap, args=(store, barrier, f"w{i}-{round_}", version, winners, i))
                   for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(winners) == 1
        assert store.read_bytes("manifests/m/k/current.json") == f"w{winners[0]}-{round_}".encode()
    assert not store.replace_if("manifests/m/k/current.json", b"stale", version)  # a stale version is refused
