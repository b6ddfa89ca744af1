"""Issue 34, the store writer without the signing key, through the CLI on a file:// store (as the issue's red team
ran it): after a signed run, the writer edits one file of the published converted checkpoint (a new blob; the
checkpoint's manifest and its pointer's digest rewritten to match), forges the cached reference answers, and
truncates one blob of the unit so that the next run misses it. The next scheduled run with the CI key, on a fresh
worker, must refuse the poisoned checkpoint and the forged reference, convert again from the named source, and
publish a signed build that holds none of the writer's bytes, with every reused or rebuilt input bound by digest in
its signed provenance."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from enginefoundry.evidence.signing import keygen
from tests.support.paths import REPO, TINY_MODEL, TINY_PROMPTS


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "enginefoundry.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)


def _builds(store: Path, kind: str) -> dict[str, dict]:
    """Every build manifest of one kind ("unit" or "checkpoint") by its store path."""
    out = {}
    for p in sorted(store.glob("manifests/*/*/2*.json")):
        doc = json.loads(p.read_text())
        if ("unit" in doc) == (kind == "unit"):
            out[p.relative_to(store).as_posix()] = doc
    return out


def _blob(store: Path, digest: str) -> Path:
    return store / "blobs" / "sha256" / digest[:2] / digest


def _replace(path: Path, data: bytes) -> None:
    """What a writer of the store does: replace an object (a new inode, as an S3 PUT would)."""
    path.unlink()
    path.write_bytes(data)


def _provenance(store: Path, manifest_path: str) -> dict:
    """The signed provenance statement of a unit build (read from its attestation index)."""
    model, key, name = manifest_path.split("/")[1:]
    index = json.loads((store / "attestations" / model / key / name).read_text())
    entry = next(e for e in index["attestations"] if e["kind"] == "provenance")
    bundle = json.loads(_blob(store, entry["sha256"]).read_text())
    return json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))


def test_a_store_writer_cannot_get_bytes_signed_by_ci(tmp_path: Path):
    key, pub = keygen(tmp_path / "ci")
    store = tmp_path / "store"
    spec = yaml.safe_load((REPO / "configs" / "tiny-cpu.yaml").read_text())
    spec["model"]["source"] = str(TINY_MODEL)
    spec["smoke"]["prompts"] = str(TINY_PROMPTS)
    spec["benchmark"]["enabled"] = False
    spec["publish"] = {"store": store.as_uri(), "require_signature": True, "trusted_keys": [str(pub)]}
    spec["tracking"] = {"mlflow_uri": f"sqlite:///{tmp_path}/mlflow.db", "experiment": "attack"}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    base = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "EF_CACHE_DIR": str(tmp_path / "cache"),
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "300", "ENGINEFOUNDRY_SIGNING_KEY_FILE": str(key),
            "ENGINEFOUNDRY_SIGNER_NAME": "ci"}

    def worker(name: str) -> dict[str, str]:  # each run on a fresh worker: its own work folder and reference cache
        return {**base, "EF_WORK_DIR": str(tmp_path / f"work-{name}"), "EF_REFERENCE_CACHE": str(tmp_path / name)}

    first = _run(["run", str(path)], worker("first"))
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    (unit_path, unit), = _builds(store, "unit").items()
    (ckpt_path, ckpt), = _builds(store, "checkpoint").items()
    genuine = {f["path"].split("/", 1)[1]: f["sha256"] for f in unit["files"] if f["path"].startswith("bundle/model/")}

    # The writer edits one file of the converted checkpoint: a new blob, the manifest and the pointer rewritten.
    entry = next(f for f in ckpt["files"] if f["path"] == "checkpoint/generation_config.json")
    doc = json.loads(_blob(store, entry["sha256"]).read_text())
    evil = (json.dumps({**doc, "attacker": "store-writer"}, indent=2) + "\n").encode()
    evil_sha = hashlib.sha256(evil).hexdigest()
    _blob(store, evil_sha).parent.mkdir(parents=True, exist_ok=True)
    _blob(store, evil_sha).write_bytes(evil)
    entry.update(sha256=evil_sha, size=len(evil))
    data = (json.dumps(ckpt, indent=2) + "\n").encode()
    _replace(store / ckpt_path, data)
    pointer_path = store / ckpt_path.rsplit("/", 1)[0] / "current.json"
    pointer = json.loads(pointer_path.read_text())
    _replace(pointer_path, json.dumps({**pointer, "manifest_sha256": hashlib.sha256(data).hexdigest()}).encode())

    # … forges the cached reference answers (every answer replaced) …
    (ref_path,) = [p for p in store.glob("references/*.json") if not p.name.endswith(".spread.v2.json")]
    ref = json.loads(ref_path.read_text())
    for answer in ref["answers"]:
        answer.update(text="forged", token_ids=[1], token_texts=["forged"], token_logprobs=[0.0])
    forged_ref = json.dumps(ref, sort_keys=True).encode()
    _replace(ref_path, forged_ref)

    # … and truncates one blob of the unit, so that the next run refuses the hit and builds the unit again.
    report = next(f for f in unit["files"] if f["path"] == "reports/smoke.json")
    _replace(_blob(store, report["sha256"]), _blob(store, report["sha256"]).read_bytes()[:100])

    second = _run(["run", str(path)], worker("second"))
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-4000:]
    assert "not signed by a trusted key" in out, out[-4000:]
    assert "forged" not in json.dumps([r for r in out.splitlines() if "smoke: PASS" in r])

    rebuilt = {p: m for p, m in _builds(store, "unit").items() if p != unit_path}
    ((new_path, new),) = rebuilt.items()
    digests = {f["sha256"] for f in new["files"]}
    assert evil_sha not in digests, "the CI-signed build holds the store writer's bytes"
    # Every model file of the new bundle is the one converted from the named source (the conversion is exact).
    assert {f["path"].split("/", 1)[1]: f["sha256"] for f in new["files"]
            if f["path"].startswith("bundle/model/")} == genuine

    # The new build is signed by CI and verifies with CI's key.
    check = _run(["verify", f"{store.as_uri()}/{new_path}", "--json", "--trusted-key", str(pub)],
                 {**worker("verify"), "ENGINEFOUNDRY_SIGNING_KEY_FILE": ""})
    assert check.returncode == 0 and json.loads(check.stdout)["signature"]["state"] == "verified", check.stdout

    # Its signed provenance binds each input by digest: the checkpoint converted again (a new build, not the
    # writer's manifest) and the reference answers (not the forged document).
    statement = _provenance(store, new_path)
    deps = {d["name"]: d for d in statement["predicate"]["buildDefinition"]["resolvedDependencies"]}
    assert deps["converted-checkpoint"]["digest"]["sha256"] != hashlib.sha256(data).hexdigest()
    new_ckpt = [p for p in _builds(store, "checkpoint") if p != ckpt_path]
    assert len(new_ckpt) == 1
    assert deps["converted-checkpoint"]["digest"]["sha256"] == hashlib.sha256((store / new_ckpt[0]).read_bytes()
                                                                               ).hexdigest()
    assert evil_sha not in json.dumps(deps)
    assert deps["reference"]["digest"]["sha256"] != hashlib.sha256(forged_ref).hexdigest()
    assert new["inputs"] and {i["kind"] for i in new["inputs"]} >= {"converted-checkpoint", "reference"}
    smoke = json.loads(_blob(store, next(f["sha256"] for f in new["files"]
                                         if f["path"] == "reports/smoke.json")).read_text())
    assert smoke["verdict"]["passed"] is True
