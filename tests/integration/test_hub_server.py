"""The git-backed test hub, exercised through the real huggingface_hub client (no mocks)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import huggingface_hub
import pytest
from huggingface_hub import constants, hf_hub_download, snapshot_download
from huggingface_hub.errors import RemoteEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

from tests.services.hub_server import seed_repo, serving
from tests.support.paths import TINY_MODEL

FIXTURE = TINY_MODEL
REPO_ID = "tiny-org/tiny-chat"


@dataclass(frozen=True)
class SeededHub:
    url: str
    v1_sha: str  # tagged v1.0: exactly the fixture
    main_sha: str  # main: the fixture plus README.md and extra/notes.txt (a nested path)
    main_dir: Path  # what main should download to


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeededHub]:
    base = tmp_path_factory.mktemp("hub")
    root = base / "root"
    v1_sha = seed_repo(root, REPO_ID, FIXTURE, tag="v1.0")
    # A second commit on main, so a tag and a branch resolve to different snapshots.
    main_dir = base / "main-src"
    shutil.copytree(FIXTURE, main_dir)
    (main_dir / "README.md").write_text("# tiny-chat\n")
    (main_dir / "extra").mkdir()
    (main_dir / "extra" / "notes.txt").write_text("nested file\n")
    main_sha = seed_repo(root, REPO_ID, main_dir)
    with serving(root) as url:
        yield SeededHub(url=url, v1_sha=v1_sha, main_sha=main_sha, main_dir=main_dir)


@pytest.fixture
def hf_cache(hub: SeededHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point huggingface_hub at the test hub and a private cache.

    The env vars cover anything started from here (subprocesses, late imports). huggingface_hub has already
    read them into `constants` at import time, and reads `constants.X` at call time, so those are patched too.
    """
    hf_home = tmp_path / "hf-home"
    env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(hf_home), "HF_HUB_DISABLE_XET": "1"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    # A developer's HF_HUB_CACHE/offline setting would otherwise win over HF_HOME or block the download.
    for key in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "HF_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    url_template = hub.url + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url_template)
    monkeypatch.setattr(constants, "HF_HOME", str(hf_home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    return hf_home / "hub"


def _git_blob_sha(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def _repo_cache(cache: Path) -> Path:
    return cache / f"models--{REPO_ID.replace('/', '--')}"


def test_snapshot_download_main_resolves_to_git_head(hub: SeededHub, hf_cache: Path) -> None:
    path = Path(snapshot_download(REPO_ID, revision="main"))

    assert _files(path) == _files(hub.main_dir)
    assert (_repo_cache(hf_cache) / "refs" / "main").read_text() == hub.main_sha
    assert path == _repo_cache(hf_cache) / "snapshots" / hub.main_sha
    # Nothing should have needed Xet for a hub that never advertises it.
    assert "hf_xet" not in sys.modules


def test_snapshot_download_tag(hub: SeededHub, hf_cache: Path) -> None:
    path = Path(snapshot_download(REPO_ID, revision="v1.0"))

    assert hub.v1_sha != hub.main_sha
    assert _files(path) == _files(FIXTURE)
    assert (_repo_cache(hf_cache) / "refs" / "v1.0").read_text() == hub.v1_sha


def test_snapshot_download_by_commit_sha(hub: SeededHub, hf_cache: Path) -> None:
    # A full sha skips the revision API call: only the tree and resolve routes are used.
    path = Path(snapshot_download(REPO_ID, revision=hub.v1_sha))

    assert _files(path) == _files(FIXTURE)


def test_unknown_revision_raises_revision_not_found(hub: SeededHub, hf_cache: Path) -> None:
    with pytest.raises(RevisionNotFoundError):
        snapshot_download(REPO_ID, revision="no-such-branch")


def test_unknown_repo_raises_repository_not_found(hub: SeededHub, hf_cache: Path) -> None:
    with pytest.raises(RepositoryNotFoundError):
        snapshot_download("tiny-org/does-not-exist", revision="main")


def test_missing_file_raises_entry_not_found(hub: SeededHub, hf_cache: Path) -> None:
    with pytest.raises(RemoteEntryNotFoundError):
        hf_hub_download(REPO_ID, "tokenizer.model", revision="main")
    # X-Repo-Commit on the 404 lets the client remember the miss for this commit.
    assert (_repo_cache(hf_cache) / ".no_exist" / hub.main_sha / "tokenizer.model").exists()


def test_refs_and_info_api(hub: SeededHub, hf_cache: Path) -> None:
    api = huggingface_hub.HfApi(endpoint=hub.url)

    refs = api.list_repo_refs(REPO_ID)
    info = api.model_info(REPO_ID, revision="v1.0")

    assert {(b.name, b.target_commit) for b in refs.branches} == {("main", hub.main_sha)}
    assert {(t.name, t.target_commit) for t in refs.tags} == {("v1.0", hub.v1_sha)}
    assert info.sha == hub.v1_sha
    assert info.last_modified is not None
    assert sorted(s.rfilename for s in info.siblings or []) == sorted(_files(FIXTURE))


def test_head_and_range_requests(hub: SeededHub) -> None:
    url = f"{hub.url}/{REPO_ID}/resolve/main/config.json"
    content = (FIXTURE / "config.json").read_bytes()

    with urllib.request.urlopen(urllib.request.Request(url, method="HEAD")) as resp:
        assert resp.headers["X-Repo-Commit"] == hub.main_sha
        assert resp.headers["Content-Length"] == str(len(content))
        assert resp.headers["ETag"].strip('"') == _git_blob_sha(content)
    with urllib.request.urlopen(urllib.request.Request(url, headers={"Range": "bytes=2-9"})) as resp:
        assert resp.status == 206
        assert resp.headers["Content-Range"] == f"bytes 2-9/{len(content)}"
        assert resp.read() == content[2:10]
    with urllib.request.urlopen(urllib.request.Request(url, headers={"Range": "bytes=-5"})) as resp:
        assert resp.read() == content[-5:]


def test_missing_tree_path_is_entry_not_found(hub: SeededHub) -> None:
    url = f"{hub.url}/api/models/{REPO_ID}/tree/main/additional_chat_templates"
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(url)
    assert caught.value.code == 404
    assert caught.value.headers["X-Error-Code"] == "EntryNotFound"
    assert caught.value.headers["X-Repo-Commit"] == hub.main_sha


def test_tree_of_subdirectory(hub: SeededHub) -> None:
    with urllib.request.urlopen(f"{hub.url}/api/models/{REPO_ID}/tree/main/extra") as resp:
        entries = json.load(resp)
    assert [(e["type"], e["path"], e["size"]) for e in entries] == [("file", "extra/notes.txt", 12)]


def test_seed_repo_commits_only_on_change(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("one\n")
    first = seed_repo(tmp_path / "root", "org/repo", src)
    assert seed_repo(tmp_path / "root", "org/repo", src) == first
    (src / "a.txt").write_text("two\n")
    assert seed_repo(tmp_path / "root", "org/repo", src) != first


def test_transformers_loads_repo_id_through_hf_endpoint(hub: SeededHub, tmp_path: Path) -> None:
    """End to end as the reference lane does it: a fresh process configured only through environment
    variables, loading by bare repo id (this also sends the optional-file HEADs and the
    additional_chat_templates probe)."""
    script = textwrap.dedent(
        f"""
        from transformers import AutoModelForCausalLM, AutoTokenizer
        tok = AutoTokenizer.from_pretrained({REPO_ID!r})
        model = AutoModelForCausalLM.from_pretrained({REPO_ID!r})
        text = tok.apply_chat_template([{{"role": "user", "content": "What is 3 plus 4?"}}],
                                       tokenize=False, add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False, return_tensors="pt")
        out = model.generate(**ids, do_sample=False, max_new_tokens=6)
        print("ANSWER=" + tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True).strip())
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf-home"), HF_HUB_DISABLE_XET="1")
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )

    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ANSWER=7" in proc.stdout.splitlines()
