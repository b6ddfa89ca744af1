"""Issue 21 through the real CLI on a file:// store, the tiny model copied into a folder of the user's: published
blobs share no inode with the user's files or the work folder, a same-size corrupted blob is quarantined and
healed by `run --verify-hits` (never re-adopted: no "adopted" line without another run) and by `run --force`,
and a user's in-place rewrite of the source folder changes nothing published."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import yaml

from tests.support.paths import REPO, TINY_MODEL, TINY_PROMPTS


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "enginefoundry.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


def _current(store: Path) -> tuple[str, dict]:
    """(manifest URI, manifest) of the current unit build."""
    for pointer in store.glob("manifests/*/*/current.json"):
        build = json.loads(pointer.read_text())["build_id"]
        path = pointer.with_name(f"{build}.json")
        doc = json.loads(path.read_text())
        if "unit" in doc:
            return path.as_uri(), doc
    raise AssertionError("no unit build")


def _corrupt_same_size(store: Path, manifest: dict, suffix: str) -> Path:
    entry = next(f for f in manifest["files"] if f["path"].endswith(suffix))
    blob = store / "blobs" / "sha256" / entry["sha256"][:2] / entry["sha256"]
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0x01
    os.chmod(blob, 0o644)  # read-only; the tests run as root, which could write anyway
    with blob.open("r+b") as f:  # in place, through the blob's own name
        f.write(data)
    return blob


def _inodes(root: Path) -> dict[int, Path]:
    return {p.lstat().st_ino: p for p in root.rglob("*") if p.is_file() and not p.is_symlink()}


def test_blobs_own_their_bytes_and_corruption_heals(tmp_path: Path):
    source = tmp_path / "user-model"
    shutil.copytree(TINY_MODEL, source)
    spec = yaml.safe_load((REPO / "configs" / "tiny-cpu.yaml").read_text())
    spec["model"]["source"] = str(source)
    spec["smoke"]["prompts"] = str(TINY_PROMPTS)
    spec["benchmark"]["enabled"] = False  # this is about building and publishing
    store, work = tmp_path / "store", tmp_path / "work"
    spec["publish"] = {"store": store.as_uri()}
    spec["tracking"] = {"mlflow_uri": f"sqlite:///{tmp_path}/mlflow.db", "experiment": "heal"}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "EF_WORK_DIR": str(work), "PREFECT_HOME": str(tmp_path / "prefect"),
           "EF_CACHE_DIR": str(tmp_path / "cache"), "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "300"}

    _ok(_run(["run", str(path)], env))
    first_uri, first = _current(store)
    # 1. No blob shares an inode with the user's files or the work folder; the user's files have one name each.
    blobs, theirs, ours = _inodes(store / "blobs"), _inodes(source), _inodes(work)
    assert not set(blobs) & (set(theirs) | set(ours))
    assert not set(theirs) & set(ours), "the work checkpoint or bundle links to the user's folder"
    assert all(p.stat().st_nlink == 1 for p in [*blobs.values(), *theirs.values()])
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o444 for p in blobs.values())

    # 2. Same-size corruption: --verify-hits refuses and quarantines it, rebuilds, and never adopts it back.
    blob = _corrupt_same_size(store, first, "model/tokenizer.json")
    out = _ok(_run(["run", str(path), "--verify-hits"], env))
    assert "quarantined" in out and "adopted" not in out, out[-4000:]
    second_uri, _ = _current(store)
    assert second_uri != first_uri
    assert list((store / "quarantine").rglob(f"{blob.name}.*"))
    for uri in (first_uri, second_uri):  # the earlier build lists the same bytes: whole again
        _ok(_run(["verify", uri], env))

    # 3. --force re-hashes the blobs it reuses: a corrupt one is quarantined and written afresh.
    _, second = _current(store)
    _corrupt_same_size(store, second, "model/config.json")
    out = _ok(_run(["run", str(path), "--force"], env))
    assert "quarantined" in out and "adopted" not in out, out[-4000:]
    third_uri, _ = _current(store)
    assert third_uri not in (first_uri, second_uri)
    _ok(_run(["verify", third_uri], env))

    # 4. The user rewrites a file of the source folder in place (as `save_pretrained` does): nothing published
    # changes.
    with (source / "tokenizer_config.json").open("r+b") as f:
        f.write(b"{}  ")
    for uri in (first_uri, second_uri, third_uri):
        _ok(_run(["verify", uri], env))
