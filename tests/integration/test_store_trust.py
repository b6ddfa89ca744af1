"""Issue 21, items 5–7 on a real file:// store and the real CLI: `pull` refuses hostile file lists before any
download, caps what it reads at the manifest's size, never writes through a symlinked folder inside DEST and
removes what killed pulls left; `verify` on a read-only store; `--spec` lookups; `explain` and `run` agree on a
refused pointer; `lineage <key>` after `--force`; destinations, full disks, system folders as sources."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from enginefoundry.cli import main
from enginefoundry.inputs.units import key_of
from enginefoundry.store.backends import FileStore, blob_key
from enginefoundry.store.publish import PublishOptions, build_manifest_key, find_current, publish_build
from tests.support.paths import CONFIGS, FIXTURES, REPO
from tests.support.stores import QUIET, small_bundle, unit_fields


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    return FileStore(f"file://{tmp_path / 'store'}")


def _cli(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


def _published(store: FileStore, tmp_path: Path):
    return publish_build(store, "m", unit_fields(), {"bundle": small_bundle(tmp_path)}, **QUIET)


def _hostile_build(store: FileStore, published, paths: list[str]) -> str:
    """Another build of the key whose manifest lists real blobs under `paths` (as someone with write access to
    the store would write it): the URI of its manifest."""
    data = json.loads(store.read_bytes(find_current(store, "m", published.manifest.key).manifest_key))
    real = data["files"]
    data["build_id"] = "20260101T000000000000Z-evil"
    data["files"] = [{**real[i % len(real)], "path": p} for i, p in enumerate(paths)]
    mkey = build_manifest_key("m", published.manifest.key, data["build_id"])
    assert store.create_if_absent(mkey, json.dumps(data).encode())
    return f"{store.uri}/{mkey}"


DEEP = "/".join(["d"] * 999 + ["f"])


@pytest.mark.parametrize("paths, reason", [
    (["bundle/ok", "bundle/evil\nname"], "control character"),
    (["bundle/\x1b]0;owned\x07title"], "control character"),
    (["bundle/.git/hooks/post-checkout"], "version-control folder"),
    ([DEEP], "1000 components"),
    (["bundle/a", "bundle/a"], "listed twice"),
    (["bundle/a", "bundle/a/b"], "both a file and a folder"),
], ids=["newline", "escape", "git-hook", "depth-1000", "duplicate", "file-and-folder"])
def test_pull_refuses_a_hostile_file_list_before_writing_anything(store, tmp_path, capsys, paths, reason):
    uri = _hostile_build(store, _published(store, tmp_path), paths)
    dest = tmp_path / "dest"
    code, out = _cli(capsys, "pull", uri, str(dest))
    assert code == 1 and "not a valid manifest" in out and reason in out, out[-800:]
    assert "Traceback" not in out and "RecursionError" not in out
    assert not dest.exists() or not list(dest.rglob("*"))
    code, out = _cli(capsys, "verify", uri)
    assert code == 1 and reason in out


class _Counting(FileStore):
    """The file store, counting the bytes a reader takes from it."""

    taken = 0

    def iter_bytes(self, key: str):
        for chunk in super().iter_bytes(key):
            _Counting.taken += len(chunk)
            yield chunk


def test_pull_reads_no_more_than_the_manifest_says(store, tmp_path):
    """A blob that grew (or an endpoint that streams without end) is refused once it passes the manifest's size:
    main wrote the whole 64 MiB for a 100 kB file before the refusal."""
    from enginefoundry.errors import StoreError
    from enginefoundry.store.verify import pull

    published = _published(store, tmp_path)
    entry = next(e for e in published.manifest.files if e.path.endswith("weights.safetensors"))
    blob = store.root / blob_key(entry.sha256)
    blob.unlink()
    with blob.open("wb") as f:
        for _ in range(64):
            f.write(b"W" * 2**20)
    counting = _Counting(store.uri)
    build = find_current(counting, "m", published.manifest.key)
    with pytest.raises(StoreError, match="sent more than the manifest's"):
        pull(counting, build, tmp_path / "dest", workers=1)
    assert _Counting.taken <= entry.size + 8 * 2**20  # one read chunk past the size at most
    assert not [p for p in (tmp_path / "dest").rglob("*") if p.name.endswith(".partial")]


def test_pull_never_writes_through_a_symlinked_folder_in_dest(store, tmp_path, capsys):
    published = _published(store, tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "bundle").symlink_to(outside)
    code, out = _cli(capsys, "pull", published.uri, str(dest))
    assert code == 1 and "is a symlink" in out and str(dest / "bundle") in out
    assert list(outside.rglob("*")) == []


def test_a_resumed_pull_removes_what_killed_pulls_left(store, tmp_path, capsys):
    """A kill -9 mid-download leaves `.<name>.<pid>.<random>.partial` (main's: `.<name>.<random>.partial`); the
    next pull removes those of dead processes, keeps a live pull's and unrelated files."""
    published = _published(store, tmp_path)
    dest = tmp_path / "dest" / "bundle" / "model"
    dest.mkdir(parents=True)
    dead_pid = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    dead = dest / f".weights.safetensors.{dead_pid}.abcd1234.partial"
    legacy = dest / ".config.json.k2j4_x9q.partial"
    live = dest / f".weights.safetensors.{os.getpid()}.zzzz9999.partial"
    mine = dest / ".notes.partial"
    for path in (dead, legacy, live, mine):
        path.write_bytes(b"half")
    os.utime(legacy, (1, 1))  # unchanged for decades
    code, out = _cli(capsys, "pull", published.uri, str(tmp_path / "dest"))
    assert code == 0, out
    assert not dead.exists() and not legacy.exists()
    assert live.exists() and mine.exists()


def _in_mount_namespace(script: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a private mount")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(["unshare", "--mount", "sh", "-euc", script], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)


def test_verify_on_a_read_only_store_succeeds_and_notes_the_record(store, tmp_path):
    published = _published(store, tmp_path)
    root = store.root
    done = _in_mount_namespace(f"mount --bind -o ro {root} {root}; "
                               f"{sys.executable} -m enginefoundry.cli verify {published.uri}", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok:" in done.stdout and "not recorded" in done.stdout and "Read-only file system" in done.stdout


def test_a_full_disk_names_the_file_being_written(store, tmp_path):
    published = _published(store, tmp_path)
    dest = tmp_path / "small"
    dest.mkdir()
    done = _in_mount_namespace(f"mount -t tmpfs -o size=64k tmpfs {dest}; "
                               f"{sys.executable} -m enginefoundry.cli pull {published.uri} {dest}", tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "no space left on device writing" in out and str(dest / "bundle" / "model") in out, out[-1500:]


def _spec_for(store: FileStore, tmp_path: Path) -> Path:
    text = (CONFIGS / "tiny-cpu.yaml").read_text()
    text = text.replace("source: ../tests/fixtures/tiny-chat/model", f"source: {FIXTURES / 'tiny-chat/model'}")
    text = text.replace("prompts: prompts/tiny-chat.jsonl", f"prompts: {CONFIGS / 'prompts/tiny-chat.jsonl'}")
    text = text.replace("store: file://../.enginefoundry/store", f"store: {store.uri}")
    text = text.replace("mlflow_uri: sqlite:///../.enginefoundry/mlflow.db",
                        f"mlflow_uri: sqlite:///{tmp_path / 'mlflow.db'}")
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    return spec


def test_verify_and_pull_look_a_key_up_through_spec(store, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("EF_STORE", raising=False)
    published = _published(store, tmp_path)
    spec = _spec_for(store, tmp_path)
    key = published.manifest.key
    code, out = _cli(capsys, "verify", "--spec", str(spec), "--model", "m", key)
    assert code == 0 and "ok:" in out, out
    code, out = _cli(capsys, "pull", "--spec", str(spec), "--model", "m", key, str(tmp_path / "dest"))
    assert code == 0 and "pulled" in out, out


def test_a_store_uri_of_an_unknown_kind_is_an_input_error_naming_its_flag(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("EF_STORE", raising=False)
    code, out = _cli(capsys, "validate", str(CONFIGS / "tiny-cpu.yaml"), "--store", "ftp://x")
    assert code == 2 and "--store: 'ftp://x' is not a store URI" in out and "ValidationError" not in out
    monkeypatch.setenv("EF_STORE", "ftp://y")
    code, out = _cli(capsys, "validate", str(CONFIGS / "tiny-cpu.yaml"))
    assert code == 2 and "EF_STORE: 'ftp://y'" in out


def test_explain_calls_a_pointer_run_refuses_a_miss(store, tmp_path, capsys, monkeypatch):
    """One decision: a current build whose blob is gone is refused by `run` (it rebuilds), so `explain` must
    not call it a hit."""
    from enginefoundry.inputs.sources import fetch
    from enginefoundry.inputs.units import SourceDigests, expand_units, toolchain_identity, unit_key_components
    from enginefoundry.lanes import get_lane
    from enginefoundry.planning.explain import explain
    from enginefoundry.spec import load_spec

    monkeypatch.delenv("EF_STORE", raising=False)
    spec = load_spec(_spec_for(store, tmp_path))
    snapshot = fetch(spec.model.parsed_source(spec.base_path), progress=lambda _: None)
    unit = expand_units(spec)[0]
    comps = unit_key_components(spec, unit, SourceDigests.of(snapshot),
                                toolchain_identity(spec, get_lane(spec.lane).versions()), spec.lane_options)
    fields = {**unit_fields(), "key": key_of(comps), "key_components": comps, "model": spec.model.name}
    published = publish_build(store, spec.model.name, fields, {"bundle": small_bundle(tmp_path)}, **QUIET)
    assert [r.hit for r in explain(spec, snapshot, store)] == [True]
    entry = next(e for e in published.manifest.files if e.path.endswith("weights.safetensors"))
    store.delete(blob_key(entry.sha256))
    [row] = explain(spec, snapshot, store)
    assert not row.hit and row.refused and "refused" in row.refused and "weights.safetensors" in row.refused
    assert row.reference == "fp32 (like with like)"  # what the rebuild's smoke stage judges it against


def test_lineage_of_a_key_with_two_builds_is_one_unit_listing_both(store, tmp_path, capsys):
    """After `run --force` a key has two builds (and two unit runs in MLflow): `lineage <key>` answers for the
    current one and lists both, instead of "ambiguous (2 units)"."""
    from enginefoundry import tracking_tags as mltags
    from enginefoundry.records.tracking import Tracker

    first = _published(store, tmp_path)
    second = publish_build(store, "m", unit_fields(run="r2"), {"bundle": small_bundle(tmp_path, "b2", seed=b"2")},
                           options=PublishOptions(replace=True), **QUIET)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, "demo")
    for result in (first, second):
        run = tracker.client.create_run(tracker.experiment_id, tags={
            mltags.KEY: result.manifest.key, mltags.MANIFEST_URI: result.uri, mltags.CACHE_HIT: "false"})
        tracker.client.set_terminated(run.info.run_id)
    for ref in (first.manifest.key, first.manifest.key[:12]):
        code = main(["--json", "lineage", ref, "--mlflow-uri", uri])
        out = capsys.readouterr().out
        assert code == 0, out
        chain = json.loads(out)
        assert chain["artifact"]["manifest_uri"] == second.uri  # the current build
        assert chain["builds"] == sorted([first.uri, second.uri])


def test_lineage_of_a_key_published_in_two_stores_sharing_one_mlflow_names_both(tmp_path, capsys):
    """One key published to two stores (staging and prod, one MLflow): `lineage <key>` must not answer with
    whichever store's build sorts last; it refuses, naming both stores and what to give instead."""
    from enginefoundry import tracking_tags as mltags
    from enginefoundry.records.tracking import Tracker

    results = [publish_build(FileStore(f"file://{tmp_path / name}"), "m", unit_fields(),
                             {"bundle": small_bundle(tmp_path, f"b-{name}")}, **QUIET) for name in ("prod", "staging")]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, "demo")
    for result in results:
        run = tracker.client.create_run(tracker.experiment_id, tags={
            mltags.KEY: result.manifest.key, mltags.MANIFEST_URI: result.uri, mltags.CACHE_HIT: "false"})
        tracker.client.set_terminated(run.info.run_id)
    code = main(["lineage", results[0].manifest.key[:12], "--mlflow-uri", uri])
    err = capsys.readouterr().err
    assert code == 2 and "published in 2 stores" in err, err
    assert str(tmp_path / "prod") in err and str(tmp_path / "staging") in err


@pytest.mark.parametrize("folder", ["/usr", "/"])
def test_a_system_folder_as_source_is_refused_before_it_is_walked(folder, monkeypatch):
    from enginefoundry.errors import SourceError
    from enginefoundry.inputs.sources import fetch
    from enginefoundry.spec.source import parse_source_uri

    def walked(*_a, **_k):
        raise AssertionError("the folder was walked before its refusal")

    monkeypatch.setattr("enginefoundry.inputs.sources.symlinks_leaving", walked)
    with pytest.raises(SourceError, match="system folder"):
        fetch(parse_source_uri(folder), progress=lambda _: None)


def test_a_source_folder_with_more_entries_than_any_checkpoint_is_refused(tmp_path, monkeypatch):
    from enginefoundry.errors import SourceError
    from enginefoundry.inputs import sources
    from enginefoundry.spec.source import parse_source_uri

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    for i in range(40):
        (tmp_path / "m" / f"f{i}").write_bytes(b"")
    monkeypatch.setattr(sources, "MAX_SOURCE_ENTRIES", 30)
    with pytest.raises(SourceError, match="more than 30 files and folders"):
        sources.fetch(parse_source_uri(str(tmp_path / "m")), progress=lambda _: None)
