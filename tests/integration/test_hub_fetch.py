"""Hub sources go through the standard Hugging Face cache and fetch only what a build reads: against the loopback
hub (tests/services/hub_server.py), in fresh processes that see only the environment a user would set
(HF_ENDPOINT, HF_HOME, HF_HUB_OFFLINE)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from enginefoundry.identity import checkpoint_digests
from tests.services.hub_server import seed_repo, serving

REPO = Path(__file__).resolve().parents[2]
TINY_MODEL = REPO / "tests" / "fixtures" / "tiny-chat" / "model"
REPO_ID = "meta-test/tiny-with-original"
FETCH = """
import json, sys
from enginefoundry.inputs.sources import fetch
from enginefoundry.spec import ModelSpec
spec = ModelSpec.model_validate(json.loads(sys.argv[1]))
snap = fetch(spec.parsed_source(), progress=lambda line: print(line, file=sys.stderr))
print(json.dumps(snap.model_dump(mode="json")))
"""


def fetch_in_process(model: dict, env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, "-c", FETCH, json.dumps(model)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return {**json.loads(done.stdout), "log": done.stderr}


@pytest.fixture
def hub_repo(tmp_path: Path) -> Path:
    """The tiny checkpoint plus what Meta's repos carry besides: original/ with a .pth, and a .bin duplicate."""
    src = tmp_path / "src"
    shutil.copytree(TINY_MODEL, src)
    (src / "original").mkdir()
    (src / "original" / "consolidated.00.pth").write_bytes(b"a second copy of the weights" * 100)
    (src / "original" / "params.json").write_text("{}")
    (src / "pytorch_model.bin").write_bytes(b"pickled duplicate")
    seed_repo(tmp_path / "hub", REPO_ID, src)
    return src


def test_fetch_skips_duplicates_and_works_offline_from_the_cache(hub_repo: Path, tmp_path: Path) -> None:
    assert any(p.suffix == ".safetensors" for p in TINY_MODEL.iterdir()), "the fixture has safetensors weights"
    hf_home = tmp_path / "hf-home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "EF_CACHE"))}
    env.update(HF_HOME=str(hf_home), HF_HUB_DISABLE_XET="1", EF_CACHE_DIR=str(tmp_path / "ef-cache"),
               PYTHONPATH=str(REPO))
    model = {"source": f"hf://{REPO_ID}@main", "name": "tiny"}
    with serving(tmp_path / "hub") as url:
        online = fetch_in_process(model, {**env, "HF_ENDPOINT": url})
    local = Path(online["local_dir"])
    # The standard cache under HF_HOME, where `hf cache` tools and other libraries find it.
    assert local.is_relative_to(hf_home / "hub" / "models--meta-test--tiny-with-original" / "snapshots")
    assert not any(f.startswith("original/") or f.endswith((".pth", ".bin")) for f in online["files"])
    assert "skipped 3 by pattern" in online["log"]
    assert not list((hf_home / "hub").rglob("*.pth")), "the duplicate was downloaded"
    # The digests cover exactly the checkpoint without the duplicates.
    plain = tmp_path / "plain"
    shutil.copytree(TINY_MODEL, plain)
    weights, tokenizer, files = checkpoint_digests(plain)
    assert (online["weights_digest"], online["tokenizer_digest"], online["files"]) == (weights, tokenizer, files)
    assert online["identity"]["ignore_patterns"][-1] == "*.bin"
    assert f"{len(files)} files" in online["log"] and f"downloading {len(files)} (" in online["log"]

    # Interrupted after all but one file: the next fetch downloads only that one.
    repo_cache = hf_home / "hub" / "models--meta-test--tiny-with-original"
    (local / "config.json").resolve().unlink()
    (local / "config.json").unlink()
    with serving(tmp_path / "hub") as url:
        again = fetch_in_process(model, {**env, "HF_ENDPOINT": url})
        cached = fetch_in_process(model, {**env, "HF_ENDPOINT": url})
    assert "downloading 1 (" in again["log"] and "all in the cache" in cached["log"]
    assert again["weights_digest"] == online["weights_digest"]
    assert (repo_cache / "refs" / "main").read_text() == online["revision"]

    # Offline, hub gone: the same snapshot from the cache, with the same identity.
    offline = fetch_in_process(model, {**env, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "1"})
    assert offline["revision"] == online["revision"]
    assert (offline["weights_digest"], offline["files"]) == (online["weights_digest"], online["files"])
    assert "HF_HUB_OFFLINE" in offline["log"]


def test_spec_patterns_and_a_shared_snapshot(hub_repo: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "EF_CACHE"))}
    env.update(HF_HOME=str(tmp_path / "hf-home"), HF_HUB_DISABLE_XET="1", EF_CACHE_DIR=str(tmp_path / "ef"),
               PYTHONPATH=str(REPO))
    with serving(tmp_path / "hub") as url:
        env["HF_ENDPOINT"] = url
        everything = fetch_in_process({"source": f"hf://{REPO_ID}@main", "name": "t", "ignore_patterns": []}, env)
        default = fetch_in_process({"source": f"hf://{REPO_ID}@main", "name": "t"}, env)
    assert "original/consolidated.00.pth" in everything["files"]
    assert everything["weights_digest"] != default["weights_digest"]
    # The shared snapshot now holds original/ too; the default selection reads a folder without it.
    assert "original" not in {p.name for p in Path(default["local_dir"]).iterdir()}
    assert "original/consolidated.00.pth" not in default["files"]
