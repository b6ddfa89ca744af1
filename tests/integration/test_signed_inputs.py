"""Issue 34: the inputs a signed build reuses from the store, through the pipeline's own stage functions (not a
Prefect run) on a file:// store with the tiny model: a converted checkpoint (the reference lane's cast) and a
simulated reference (int8_wo). A run that signs reuses only what a trusted key signed, converts or computes anything
else again from the named source, signs what it made, and records each input by digest."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from enginefoundry.evidence.signing import keygen
from enginefoundry.spec import parse_spec
from enginefoundry.store.backends import FileStore
from enginefoundry.store.publish import find_checkpoint_build
from tests.support.paths import CONFIGS, TINY_MODEL, TINY_PROMPTS


@pytest.fixture
def spec(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("EF_CACHE_DIR", str(tmp_path / "cache"))
    data = yaml.safe_load((CONFIGS / "tiny-cpu.yaml").read_text())
    data["model"]["source"] = str(TINY_MODEL)
    data["smoke"].update(prompts=str(TINY_PROMPTS), small_sample="warn")
    data["publish"]["store"] = (tmp_path / "store").as_uri()
    return parse_spec(data, source="test spec", base_dir=CONFIGS)


def _as_worker(monkeypatch, tmp: Path, name: str, key: Path | None) -> None:
    """The next stage runs on a fresh worker (its own work folder and reference cache), with or without the key."""
    monkeypatch.setenv("EF_WORK_DIR", str(tmp / f"work-{name}"))
    monkeypatch.setenv("EF_REFERENCE_CACHE", str(tmp / f"refs-{name}"))
    if key is None:
        monkeypatch.delenv("ENGINEFOUNDRY_SIGNING_KEY_FILE", raising=False)
    else:
        monkeypatch.setenv("ENGINEFOUNDRY_SIGNING_KEY_FILE", str(key))


def _replace(path: Path, data: bytes) -> None:
    path.unlink()
    path.write_bytes(data)


def _poison(store: FileStore, model: str, key: str) -> str:
    """Edit one file of the current checkpoint build as a writer of the store can: a new blob, its manifest and
    the pointer's digest rewritten to match. The new blob's digest."""
    build = find_checkpoint_build(store, model, key)
    doc = json.loads(store.read_bytes(build.manifest_key))
    entry = next(f for f in doc["files"] if f["path"].endswith("generation_config.json"))
    evil = json.dumps({"attacker": "store-writer", "bos_token_id": 1}).encode()
    digest = hashlib.sha256(evil).hexdigest()
    store.create_if_absent(f"blobs/sha256/{digest[:2]}/{digest}", evil)
    entry.update(sha256=digest, size=len(evil))
    data = (json.dumps(doc, indent=2) + "\n").encode()
    _replace(store.root / build.manifest_key, data)
    pointer_path = store.root / build.manifest_key.rsplit("/", 1)[0] / "current.json"
    pointer = json.loads(pointer_path.read_text())
    _replace(pointer_path, json.dumps({**pointer, "manifest_sha256": hashlib.sha256(data).hexdigest()}).encode())
    return digest


def test_a_signing_run_reuses_only_a_checkpoint_a_trusted_key_signed(spec, tmp_path, monkeypatch):
    from enginefoundry.tasks.convert import convert_variant
    from enginefoundry.tasks.fetch import fetch_source

    key, _ = keygen(tmp_path / "ci")
    store = FileStore(spec.publish.store)
    variant = spec.variants[0]
    snapshot = fetch_source.fn(spec)
    genuine = hashlib.sha256((TINY_MODEL / "generation_config.json").read_bytes()).hexdigest()

    def convert(name: str, signing: bool):
        _as_worker(monkeypatch, tmp_path, name, key if signing else None)
        got = convert_variant.fn(spec, variant, snapshot)
        folder = Path(got.result.checkpoint_dir)
        return got, hashlib.sha256((folder / "generation_config.json").read_bytes()).hexdigest()

    # An unsigned run publishes the checkpoint; a signing run does not take it on trust: it converts again.
    unsigned, _ = convert("unsigned", signing=False)
    assert unsigned.input is not None and unsigned.input.origin == "computed" and not unsigned.reused
    first, _ = convert("first", signing=True)
    assert not first.reused and first.input is not None and first.input.origin == "computed"
    assert first.input.sha256 != unsigned.input.sha256
    current = find_checkpoint_build(store, spec.model.name, first.key)
    assert current.manifest_sha256 == first.input.sha256  # the refused build is never adopted back
    assert {f.sha256 for f in first.input.files} == {f.sha256 for f in current.files}

    # Another signing worker reuses it: proven by the signature over its manifest digest.
    second, _ = convert("second", signing=True)
    assert second.reused and second.input.origin == "store" and second.input.proven_by.startswith("key ")
    assert second.input.sha256 == first.input.sha256

    # The store writer edits one file: an unsigned run takes the writer's bytes, a signing run refuses them and
    # converts again from the source.
    evil = _poison(store, spec.model.name, first.key)
    _, taken = convert("unsigned-2", signing=False)
    assert taken == evil
    third, got = convert("third", signing=True)
    assert not third.reused and got == genuine and evil not in {f.sha256 for f in third.input.files}
    assert find_checkpoint_build(store, spec.model.name, first.key).manifest_sha256 == third.input.sha256

    # A worker whose folder holds an earlier build (its marker names that build's manifest) fetches the current one.
    again, got = convert("second", signing=True)
    assert again.reused and again.input.sha256 == third.input.sha256 and got == genuine


def test_a_signing_run_refuses_a_forged_simulated_reference(spec, tmp_path, monkeypatch):
    from enginefoundry.tasks.smoke import smoke_reference

    key, _ = keygen(tmp_path / "ci")
    spec = spec.model_copy(update={"smoke": spec.smoke.model_copy(update={"reference_precision": "simulated",
                                                                          "max_new_tokens": 6})})
    _as_worker(monkeypatch, tmp_path, "first", key)
    ref, outcome = smoke_reference.fn(spec, str(TINY_MODEL), precision="int8_wo")
    kinds = [i.kind for i in outcome.inputs]
    assert kinds.count("reference") == 2 and "simulation" in kinds  # the simulation's answers and the source's
    (sim,) = [i for i in outcome.inputs if i.kind == "simulation"]
    assert sim.uri == outcome.model_dir and sim.sha256 == ref.key.weights_digest
    signed = {i.sha256 for i in outcome.inputs if i.kind == "reference"}

    # A writer forges the simulation's published answers; the next signing worker uses the signed ones instead.
    store = FileStore(spec.publish.store)
    path = store.root / f"references/{outcome.key}.json"
    doc = json.loads(path.read_text())
    for answer in doc["answers"]:
        answer["text"] = "forged"
    forged = json.dumps(doc, sort_keys=True).encode()
    _replace(path, forged)
    _as_worker(monkeypatch, tmp_path, "second", key)
    ref2, outcome2 = smoke_reference.fn(spec, str(TINY_MODEL), precision="int8_wo")
    assert {a.text for a in ref2.answers} == {a.text for a in ref.answers}
    used = {i.sha256 for i in outcome2.inputs if i.kind == "reference"}
    assert used == signed and hashlib.sha256(forged).hexdigest() not in used
    assert all(i.proven_by for i in outcome2.inputs if i.kind == "reference")
