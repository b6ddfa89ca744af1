"""Signed attestations per build on file:// and real SeaweedFS: sign and verify round trip (also checked by
openssl, outside this project), each tamper case failing with its cause named, key rotation, unsigned builds
said plainly, pull refusing before downloading, and the private key never written anywhere."""

from __future__ import annotations

import base64
import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from enginefoundry.cli import main
from enginefoundry.evidence.attest import KINDS, index_key, read_index, sign_published, verify_attestations
from enginefoundry.evidence.signing import (
    ENV_KEY,
    ENV_KEY_FILE,
    KeyPairSigner,
    TrustedKey,
    TrustPolicy,
    consumer_policy,
    keygen,
    pae,
    signer_from_env,
)
from enginefoundry.inputs.units import SourceDigests, key_of
from enginefoundry.store.backends import FileStore, Store, blob_key
from enginefoundry.store.publish import PublishOptions, build_manifest_key, publish_build, read_build
from tests.support.stores import QUIET, store_fixture

store = store_fixture("attest")


@pytest.fixture
def keys(tmp_path) -> dict[str, tuple[Path, Path]]:
    return {name: keygen(tmp_path / "keys" / name) for name in ("old", "new", "stranger")}


def _signer(keys, name: str) -> KeyPairSigner:
    return signer_from_env({ENV_KEY_FILE: str(keys[name][0]), "ENGINEFOUNDRY_SIGNER_NAME": f"ci-{name}"})


def _publish(store: Store, tmp: Path, tag: str, signer, status: str = "candidate") -> tuple[str, str]:
    """A small unit build, published and (with a signer) signed; (manifest URI, build id)."""
    root = tmp / f"bundle-{tag}"
    (root / "model").mkdir(parents=True)
    (root / "model" / "weights.safetensors").write_bytes(b"W" * 50_000 + tag.encode())
    (root / "serve.sh").write_text("#!/bin/sh\necho serve\n")
    comps = {"unit": tag}
    fields = dict(key=key_of(comps), key_components=comps, model="m", unit=tag, lane="reference", target={},
                  variant={}, profile={}, source={"uri": "hf://org/m@abc", "weights_digest": "1" * 64},
                  status=status, mlflow_run_id="r1", gate={"min_agreement": 0.9},
                  smoke={"smoke_agreement": 0.97, "samples": 64},
                  benchmark={"tool": "aiperf", "points": [{"concurrency": 32, "output_tps": 123.0}]})
    result = publish_build(store, "m", fields, {"bundle": root}, **QUIET)
    sign_published(store, "m", result.manifest.key, result.build_id, signer, **QUIET)
    return f"{store.uri}/{build_manifest_key('m', result.manifest.key, result.build_id)}", result.build_id


def _verify(capsys, uri: str, *flags: str) -> tuple[int, dict, str]:
    code = main(["verify", uri, "--signatures-only", "--json", *flags])
    out = capsys.readouterr()
    return code, json.loads(out.out), out.err


def _rewrite(store: Store, key: str, data: bytes) -> None:
    """What an attacker with write access to the bucket does: replace an object in place."""
    if isinstance(store, FileStore):
        path = store.root / key
        path.unlink()
        path.write_bytes(data)
    else:
        store.delete(key)
        assert store.create_if_absent(key, data)


def test_round_trip_verifies_with_the_trusted_key_and_with_openssl(store, tmp_path, keys, capsys):
    uri, build_id = _publish(store, tmp_path, "a", _signer(keys, "old"))
    code, doc, _ = _verify(capsys, uri, "--trusted-key", str(keys["old"][1]))
    assert code == 0 and doc["ok"], doc
    sig = doc["signature"]
    assert sig["state"] == "verified" and sig["signer"].startswith("old (")
    assert sorted(c["kind"] for c in sig["checks"] if c["ok"]) == sorted(KINDS)
    # Full verify (every file re-hashed) agrees, in text.
    assert main(["verify", uri, "--trusted-key", str(keys["old"][1])]) == 0
    assert "provenance, gate and benchmark verified" in capsys.readouterr().out

    # Outside this project: the DSSE PAE and the ECDSA signature checked by openssl.
    build = read_build(store, "m", uri.rsplit("/", 2)[1], build_id)
    index = read_index(store, build)
    entry = next(e for e in index.attestations if e.kind == "gate")
    bundle = json.loads(store.read_bytes(blob_key(entry.sha256)))
    assert bundle["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    payload = base64.b64decode(bundle["dsseEnvelope"]["payload"])
    (tmp_path / "pae.bin").write_bytes(pae(bundle["dsseEnvelope"]["payloadType"], payload))
    (tmp_path / "sig.der").write_bytes(base64.b64decode(bundle["dsseEnvelope"]["signatures"][0]["sig"]))
    ran = subprocess.run(["openssl", "dgst", "-sha256", "-verify", str(keys["old"][1]), "-signature",
                          str(tmp_path / "sig.der"), str(tmp_path / "pae.bin")], capture_output=True, text=True)
    assert ran.returncode == 0 and "Verified OK" in ran.stdout, ran.stdout + ran.stderr
    statement = json.loads(payload)
    assert statement["subject"][0]["digest"]["sha256"] == build.manifest_sha256
    assert statement["predicateType"] == "https://in-toto.io/attestation/test-result/v0.1"
    assert statement["predicate"]["result"] == "PASSED"


def test_tampered_manifest_fails_naming_it(store, tmp_path, keys, capsys):
    uri, _ = _publish(store, tmp_path, "a", _signer(keys, "old"))
    mkey = uri.removeprefix(store.uri + "/")
    doc = json.loads(store.read_bytes(mkey))
    doc["smoke"]["smoke_agreement"] = 0.999  # a better figure than the one measured and signed
    _rewrite(store, mkey, (json.dumps(doc, indent=2) + "\n").encode())
    code, out, _ = _verify(capsys, uri, "--trusted-key", str(keys["old"][1]))
    assert code == 1 and out["signature"]["state"] == "failed"
    assert any("manifest changed after signing" in p for p in out["signature"]["problems"]), out


def test_replaced_gate_result_fails_naming_it(store, tmp_path, keys, capsys):
    uri, build_id = _publish(store, tmp_path, "a", _signer(keys, "old"))
    build = read_build(store, "m", uri.rsplit("/", 2)[1], build_id)
    index = read_index(store, build)
    gate = next(e for e in index.attestations if e.kind == "gate")
    bundle = json.loads(store.read_bytes(blob_key(gate.sha256)))
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    statement["predicate"]["result"] = "PASSED"
    statement["predicate"]["enginefoundry"]["metrics"]["smoke_agreement"] = 1.0
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    forged = json.dumps(bundle).encode()
    # In place (same object name) …
    _rewrite(store, blob_key(gate.sha256), forged)
    code, out, _ = _verify(capsys, uri, "--trusted-key", str(keys["old"][1]))
    assert code == 1 and any(p.startswith("gate: attestation object replaced") for p in out["signature"]["problems"])
    # … and as a new object with the index rewritten to name it.
    import hashlib

    digest = hashlib.sha256(forged).hexdigest()
    store.create_if_absent(blob_key(digest), forged)
    new_index = index.model_copy(update={"attestations": [
        e.model_copy(update={"sha256": digest, "size": len(forged)}) if e.kind == "gate" else e
        for e in index.attestations]})
    _rewrite(store, index_key(build), new_index.model_dump_json().encode())
    code, out, _ = _verify(capsys, uri, "--trusted-key", str(keys["old"][1]))
    assert code == 1
    assert any(p.startswith("gate: signature does not verify") and "altered after signing" in p
               for p in out["signature"]["problems"]), out


def test_benchmark_statement_from_another_build_fails_naming_it(store, tmp_path, keys, capsys):
    signer = _signer(keys, "old")
    uri_a, id_a = _publish(store, tmp_path, "a", signer)
    uri_b, id_b = _publish(store, tmp_path, "b", signer)
    build_a = read_build(store, "m", uri_a.rsplit("/", 2)[1], id_a)
    build_b = read_build(store, "m", uri_b.rsplit("/", 2)[1], id_b)
    index_a, index_b = read_index(store, build_a), read_index(store, build_b)
    bench_b = next(e for e in index_b.attestations if e.kind == "benchmark")
    forged = index_a.model_copy(update={"attestations": [bench_b if e.kind == "benchmark" else e
                                                         for e in index_a.attestations]})
    _rewrite(store, index_key(build_a), forged.model_dump_json().encode())
    code, out, _ = _verify(capsys, uri_a, "--trusted-key", str(keys["old"][1]))
    assert code == 1
    assert any(p.startswith("benchmark: statement belongs to another build") and build_b.manifest_key in p
               for p in out["signature"]["problems"]), out


def test_unknown_signer_fails_naming_it(store, tmp_path, keys, capsys):
    uri, _ = _publish(store, tmp_path, "a", _signer(keys, "stranger"))
    code, out, _ = _verify(capsys, uri, "--trusted-key", str(keys["old"][1]))
    assert code == 1
    assert all("signed by unknown key" in p and "ci-stranger" in p for p in out["signature"]["problems"]), out


def test_key_rotation_old_builds_verify_and_an_expired_key_fails(store, tmp_path, keys, capsys):
    uri_old, _ = _publish(store, tmp_path, "a", _signer(keys, "old"))
    rotated = datetime.now(UTC) + timedelta(seconds=1)  # the old key retires after signing build a
    uri_new, _ = _publish(store, tmp_path, "b", _signer(keys, "new"))
    policy = tmp_path / "trust.yaml"
    policy.write_text(f"require_signature: true\nkeys:\n"
                      f"  - name: old\n    public_key_file: keys/old.pub\n    expires_at: '{rotated.isoformat()}'\n"
                      f"  - name: new\n    public_key_file: keys/new.pub\n")
    # Build a (old key, signed while it was valid) and build b (new key) both verify under the rotated policy …
    code, out, _ = _verify(capsys, uri_old, "--trust-policy", str(policy))
    assert code == 0 and out["signature"]["state"] == "verified" and out["signature"]["signer"].startswith("old")
    code, out, _ = _verify(capsys, uri_new, "--trust-policy", str(policy))
    assert code == 0 and out["signature"]["signer"].startswith("new"), out
    # … and the old key, used after it expired, fails naming the expiry.
    uri_late, _ = _publish(store, tmp_path, "c", _signer(keys, "old"))
    policy.write_text(f"keys:\n  - name: old\n    public_key_file: keys/old.pub\n    expires_at: "
                      f"'{(datetime.now(UTC) - timedelta(hours=1)).isoformat()}'\n")
    code, out, _ = _verify(capsys, uri_late, "--trust-policy", str(policy))
    assert code == 1 and all("expired at" in p for p in out["signature"]["problems"]), out


def test_unsigned_build_is_said_plainly_and_refused_when_required(store, tmp_path, keys, capsys):
    uri, _ = _publish(store, tmp_path, "a", None)
    assert main(["verify", uri, "--signatures-only"]) == 0
    assert "UNSIGNED" in capsys.readouterr().out
    code, out, _ = _verify(capsys, uri, "--require-signature", "--trusted-key", str(keys["old"][1]))
    assert code == 1 and out["signature"]["state"] == "unsigned" and "unsigned" in out["signature"]["problems"][0]
    dest = tmp_path / "pulled"
    assert main(["pull", uri, str(dest), "--require-signature", "--trusted-key", str(keys["old"][1])]) == 1
    assert "pull refused" in capsys.readouterr().err and not dest.exists()
    # A signed build pulls under the same requirement.
    signed, _ = _publish(store, tmp_path, "b", _signer(keys, "old"))
    assert main(["pull", signed, str(dest), "--require-signature", "--trusted-key", str(keys["old"][1])]) == 0
    assert "signature: signed by old (" in capsys.readouterr().out


def test_the_private_key_is_never_written_to_the_store_or_printed(store, tmp_path, keys, capsys, monkeypatch):
    pem = keys["old"][0].read_text()
    monkeypatch.setenv(ENV_KEY, pem)
    signer = signer_from_env()
    assert "PRIVATE" not in repr(signer) and signer.public_pem() not in pem
    uri, _ = _publish(store, tmp_path, "a", signer)
    main(["verify", uri, "--json", "--trusted-key", str(keys["old"][1])])
    main(["keygen", "--out", str(tmp_path / "k2")])
    out = capsys.readouterr()
    secret_line = pem.splitlines()[1]  # a line of the key's base64 body
    assert secret_line not in out.out + out.err
    for name in store.list(""):
        assert secret_line.encode() not in store.read_bytes(name), name
    # A bad key is refused without echoing it.
    monkeypatch.setenv(ENV_KEY, pem.replace(secret_line, secret_line[::-1]))
    with pytest.raises(Exception) as err:
        signer_from_env()
    assert secret_line[::-1] not in str(err.value) and ENV_KEY in str(err.value)


def test_trust_policy_from_the_environment(tmp_path, keys, monkeypatch):
    monkeypatch.setenv("ENGINEFOUNDRY_TRUSTED_KEYS", str(keys["old"][1]))
    monkeypatch.setenv("ENGINEFOUNDRY_REQUIRE_SIGNATURE", "1")
    policy = consumer_policy()
    assert policy.require_signature and [k.key_id for k in policy.keys] == [_signer(keys, "old").key_id]
    assert verify_attestations.__doc__  # the policy type verify_attestations takes
    assert isinstance(policy, TrustPolicy) and isinstance(policy.keys[0], TrustedKey)


def test_a_build_is_signed_before_it_becomes_current(tmp_path, keys, monkeypatch):
    """The publish stage signs between the manifest and the pointer: at the moment the pointer moves, the build's
    attestation index is in the store, so a reader requiring signatures never sees a current unsigned build."""
    from enginefoundry.spec import load_spec
    from enginefoundry.store.manifest import Manifest
    from enginefoundry.tasks.publish import publish_unit

    store_dir = tmp_path / "store"
    spec = load_spec(Path(__file__).resolve().parents[2] / "configs" / "tiny-cpu.yaml")
    spec = spec.model_copy(update={"publish": spec.publish.model_copy(update={"store": f"file://{store_dir}"})})
    root = tmp_path / "bundle"
    root.mkdir()
    (root / "weights.bin").write_bytes(b"w" * 1000)
    comps = {"unit": "u"}
    draft = Manifest.model_validate(dict(
        key=key_of(comps), key_components=comps, model=spec.model.name, unit="u", lane="reference", target={},
        variant={}, profile={}, source={}, status="candidate", files=[], build_id="draft"))
    monkeypatch.setenv(ENV_KEY_FILE, str(keys["old"][0]))
    seen: list[bool] = []
    real_replace_if = FileStore.replace_if

    def spy(self, key, data, version):  # records whether the index exists as the pointer moves
        if key.endswith("/current.json"):
            build_id = json.loads(data)["build_id"]
            seen.append(any(store_dir.glob(f"attestations/**/{build_id}.json")))
        return real_replace_if(self, key, data, version)

    monkeypatch.setattr(FileStore, "replace_if", spy)
    result = publish_unit.fn(spec, draft, {"bundle": str(root)})
    assert result.created and seen == [True]
    build = read_build(FileStore(f"file://{store_dir}"), spec.model.name, draft.key, result.build_id)
    policy = TrustPolicy(keys=[TrustedKey(name="old", public_key=keys["old"][1].read_text())],
                         require_signature=True)
    assert verify_attestations(FileStore(f"file://{store_dir}"), build, policy).state == "verified"


def test_the_spec_signature_policy_applies_to_pull_and_verify(tmp_path, keys, capsys, monkeypatch):
    """publish.require_signature and publish.trusted_keys in the spec, with no trust option on the command line:
    `pull --spec` refuses an unsigned build and one signed by another key, and pulls one signed by the spec's key."""
    import yaml

    for var in ("ENGINEFOUNDRY_TRUST_POLICY", "ENGINEFOUNDRY_TRUSTED_KEYS", "ENGINEFOUNDRY_REQUIRE_SIGNATURE"):
        monkeypatch.delenv(var, raising=False)
    store = FileStore(f"file://{tmp_path / 'store'}")
    configs = Path(__file__).resolve().parents[2] / "configs"
    doc = yaml.safe_load((configs / "tiny-cpu.yaml").read_text())
    doc["model"]["source"] = str((configs / doc["model"]["source"]).resolve())
    doc["smoke"]["prompts"] = str((configs / doc["smoke"]["prompts"]).resolve())
    doc["publish"] = {"store": store.uri, "require_signature": True, "trusted_keys": [str(keys["old"][1])]}
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(doc))
    unsigned, _ = _publish(store, tmp_path, "a", None)
    stranger, _ = _publish(store, tmp_path, "b", _signer(keys, "stranger"))
    signed, _ = _publish(store, tmp_path, "c", _signer(keys, "old"))
    dest = tmp_path / "pulled"
    assert main(["pull", unsigned, str(dest), "--spec", str(spec)]) == 1
    assert "pull refused" in capsys.readouterr().err and not dest.exists()
    assert main(["pull", stranger, str(dest), "--spec", str(spec)]) == 1
    assert "unknown key" in capsys.readouterr().err and not dest.exists()
    assert main(["pull", signed, str(dest), "--spec", str(spec)]) == 0
    assert "signature: signed by old (" in capsys.readouterr().out
    assert main(["verify", unsigned, "--signatures-only", "--spec", str(spec)]) == 1


def test_signed_bundles_are_read_only_blobs_like_every_other(tmp_path, keys):
    """Attestation bundles live in blobs/sha256 beside the build's files: on a file:// store they are read-only
    on disk like every blob (issue 21: a blob is never writable through any name)."""
    import stat

    store = FileStore(f"file://{tmp_path / 'store'}")
    _publish(store, tmp_path, "a", _signer(keys, "old"))
    blobs = [p for p in (tmp_path / "store" / "blobs").rglob("*") if p.is_file()]
    assert len(blobs) >= 2 + len(KINDS)  # the build's two files and a bundle per kind
    writable = [str(p) for p in blobs if stat.S_IMODE(p.stat().st_mode) & 0o222]
    assert not writable, writable


def test_a_quarantined_and_healed_build_keeps_its_signatures_and_a_rebuild_gets_its_own(tmp_path, keys, capsys):
    """store-cas healing beside signing: `verify --repair` moves a corrupt blob aside (never a signed bundle,
    which no manifest lists), a --force republish writes it afresh under a new build with its own attestations,
    and the first build then verifies whole, files and signatures, with its index untouched."""
    store = FileStore(f"file://{tmp_path / 'store'}")
    uri, build_id = _publish(store, tmp_path, "a", _signer(keys, "old"))
    key = uri.rsplit("/", 2)[1]
    first = read_build(store, "m", key, build_id)
    index_before = store.read_bytes(index_key(first))
    entry = next(e for e in first.files if e.path.endswith("weights.safetensors"))
    blob = tmp_path / "store" / blob_key(entry.sha256)
    blob.chmod(0o644)
    blob.write_bytes(b"X" * entry.size)  # same size: only a re-hash finds it
    blob.chmod(0o444)
    trusted = ["--trusted-key", str(keys["old"][1])]
    assert main(["verify", uri, "--repair", *trusted]) == 1
    out = capsys.readouterr().out
    assert "quarantined" in out and "provenance, gate and benchmark verified" in out, out
    assert not blob.exists()
    for e in read_index(store, first).attestations:  # the signed bundles were not moved aside
        assert store.exists(blob_key(e.sha256))

    # A --force rebuild of the same bytes, signed as the pipeline signs (before its pointer moves).
    from enginefoundry.evidence.attest import sign_before_current

    comps = {"unit": "a"}
    fields = json.loads(store.read_bytes(first.manifest_key))
    fields = {k: v for k, v in fields.items() if k not in ("files", "build_id", "created_at")} | {"key": key_of(comps)}
    root = tmp_path / "bundle-a"
    second = publish_build(store, "m", fields, {"bundle": root},
                           options=PublishOptions(replace=True, verify_blobs=True,
                                                  before_current=sign_before_current(store, _signer(keys, "new"))),
                           **QUIET)
    assert second.created and second.build_id != build_id
    rebuilt = read_build(store, "m", key, second.build_id)
    assert read_index(store, rebuilt).signer.identity.startswith("ci-new")
    assert store.read_bytes(index_key(first)) == index_before
    assert main(["verify", uri, *trusted]) == 0  # the first build: whole again, still signed by the old key
    assert "provenance, gate and benchmark verified" in capsys.readouterr().out
    assert main(["verify", rebuilt.uri, "--trusted-key", str(keys["new"][1])]) == 0


def test_a_spec_that_requires_signatures_does_not_take_an_unsigned_cache_hit(tmp_path, keys, monkeypatch):
    """publish.require_signature: the run's own pull, promote and rollout refuse an unsigned build, so the run
    must not report one as its cache hit (exit 0, a green state) either: it is a miss, rebuilt and signed. A hit
    signed by the spec's key is taken; one signed by another key is refused too. `run`'s all-hits fast path
    (`decide_all_hits`) and the flow's plan share `cache_plan.find_hit`."""
    import yaml

    from enginefoundry.inputs.sources import fetch
    from enginefoundry.inputs.units import expand_units
    from enginefoundry.planning.cache_plan import unit_keys
    from enginefoundry.planning.noop_run import decide_all_hits
    from enginefoundry.spec import load_spec

    for var in ("ENGINEFOUNDRY_TRUST_POLICY", "ENGINEFOUNDRY_TRUSTED_KEYS", "ENGINEFOUNDRY_REQUIRE_SIGNATURE"):
        monkeypatch.delenv(var, raising=False)
    configs = Path(__file__).resolve().parents[2] / "configs"
    doc = yaml.safe_load((configs / "tiny-cpu.yaml").read_text())
    doc["model"]["source"] = str((configs / doc["model"]["source"]).resolve())
    doc["smoke"]["prompts"] = str((configs / doc["smoke"]["prompts"]).resolve())

    def spec_with(store: FileStore):
        doc["publish"] = {"store": store.uri, "require_signature": True, "trusted_keys": [str(keys["old"][1])]}
        path = tmp_path / f"{store.root.name}.yaml"
        path.write_text(yaml.safe_dump(doc))
        return load_spec(path)

    def publish_each_unit(store: FileStore, signer) -> None:
        spec = spec_with(store)
        units = expand_units(spec)
        snap = fetch(spec.model.parsed_source(spec.base_path), progress=lambda _: None)
        keyed = unit_keys(spec, units, SourceDigests.of(snap))
        for unit in units:
            root = tmp_path / f"bundle-{store.root.name}-{unit.name}"
            (root / "model").mkdir(parents=True)
            (root / "model" / "weights.safetensors").write_bytes(b"W" * 5_000)
            fields = dict(key=keyed.keys[unit.name], key_components=keyed.components[unit.name].as_json(),
                          model="tiny-chat", unit=unit.name, lane="reference", target={}, variant={}, profile={},
                          source={"uri": "hf://org/m@abc", "weights_digest": "1" * 64}, status="candidate",
                          gate={}, smoke={}, benchmark={})
            result = publish_build(store, "tiny-chat", fields, {"bundle": root}, **QUIET)
            sign_published(store, "tiny-chat", result.manifest.key, result.build_id, signer, **QUIET)

    said: list[str] = []
    for name, signer, hit in (("unsigned", None, False), ("stranger", _signer(keys, "stranger"), False),
                              ("signed", _signer(keys, "old"), True)):
        store = FileStore(f"file://{tmp_path / name}")
        publish_each_unit(store, signer)
        found = decide_all_hits(spec_with(store), progress=said.append)
        assert (found is not None) == hit, (name, said)
    assert any("publish.require_signature" in line and "UNSIGNED" in line for line in said), said
    assert any("unknown key" in line for line in said), said


def test_mlflow_is_not_told_signed_when_the_attestations_do_not_check(tmp_path, keys):
    """The MLflow tags (`attest.tags_for`: the unit run and model version of a publish or a cache hit) say
    `signed` and name the signer only when the build's attestations check out (digests, signatures by the
    key the index names, subject): a gate bundle rewritten in the bucket and an index naming it is not
    "signed by ci-old" on the version page an auditor reads; it says the check failed and why."""
    import hashlib

    from enginefoundry.evidence.attest import TAG_SIGNATURE, TAG_SIGNER, tags_for

    store = FileStore(f"file://{tmp_path / 'store'}")
    uri, build_id = _publish(store, tmp_path, "a", _signer(keys, "old"))
    trusted = TrustPolicy(keys=[TrustedKey(name="old", public_key=keys["old"][1].read_text())])
    assert tags_for(uri, policy=trusted)[TAG_SIGNATURE] == "signed"
    # Issue 34: a consistent signature by a key the run's policy does not trust is never "signed" (nor is any
    # signature where the policy trusts no key).
    stranger, _ = _publish(store, tmp_path, "s", _signer(keys, "stranger"))
    assert tags_for(stranger, policy=trusted)[TAG_SIGNATURE].startswith("untrusted: ")
    assert "not among the trusted keys" in tags_for(stranger, policy=trusted)[TAG_SIGNATURE]
    assert tags_for(uri)[TAG_SIGNATURE].startswith("untrusted: no trusted key is configured")
    assert TAG_SIGNER not in tags_for(stranger, policy=trusted)
    build = read_build(store, "m", uri.rsplit("/", 2)[1], build_id)
    index = read_index(store, build)
    gate = next(e for e in index.attestations if e.kind == "gate")
    bundle = json.loads(store.read_bytes(blob_key(gate.sha256)))
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    statement["predicate"]["enginefoundry"]["metrics"]["smoke_agreement"] = 1.0
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    forged = json.dumps(bundle).encode()
    digest = hashlib.sha256(forged).hexdigest()
    store.create_if_absent(blob_key(digest), forged)
    _rewrite(store, index_key(build), index.model_copy(update={"attestations": [
        e.model_copy(update={"sha256": digest, "size": len(forged)}) if e.kind == "gate" else e
        for e in index.attestations]}).model_dump_json().encode())
    tags = tags_for(uri, policy=trusted)
    assert tags[TAG_SIGNATURE].startswith("invalid: gate: signature does not verify"), tags
    assert TAG_SIGNER not in tags


def test_tools_and_servers_never_get_the_private_key_in_their_environment(tmp_path, keys, monkeypatch):
    """The key (and its password) given as environment variables stay in this process: a tool that prints its
    environment into its log (a launcher's `env` dump, a crash report) has nothing to print. The build's
    other environment still reaches it."""
    import sys

    from enginefoundry.evidence.signing import ENV_KEY, ENV_KEY_PASSWORD
    from enginefoundry.runner import run_tool

    pem = keys["old"][0].read_text()
    monkeypatch.setenv(ENV_KEY, pem)
    monkeypatch.setenv(ENV_KEY_PASSWORD, "pw-never-printed")
    monkeypatch.setenv("EF_TEST_VISIBLE", "visible-to-tools")
    log = tmp_path / "tool.log"
    run_tool([sys.executable, "-c", "import os; print(dict(os.environ))"], log, timeout_s=60)
    text = log.read_text()
    assert "visible-to-tools" in text
    assert pem.splitlines()[1] not in text and "pw-never-printed" not in text and ENV_KEY not in text


def test_the_reaper_and_the_embedded_prefect_server_never_get_the_signing_key(tmp_path, keys, monkeypatch):
    """Issue 34: the key sat in the environment of the embedded Prefect API server and of the reaper, neither of
    which signs. Their environments (/proc/<pid>/environ, as the kernel holds them) have neither the key, its
    password nor the key file's path; the rest of the environment still reaches them."""
    import subprocess
    import sys

    from enginefoundry import runner
    from enginefoundry.evidence.signing import ENV_KEY, ENV_KEY_PASSWORD
    from enginefoundry.flows.prefect_server.ephemeral import start_early_server

    pem = keys["old"][0].read_text()
    monkeypatch.setenv(ENV_KEY, pem)
    monkeypatch.setenv(ENV_KEY_PASSWORD, "pw-never-printed")
    monkeypatch.setenv(ENV_KEY_FILE, str(keys["old"][0]))
    monkeypatch.setenv("EF_TEST_VISIBLE", "visible-to-children")
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    monkeypatch.setenv("EF_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)

    def environ(pid: int) -> str:
        return Path(f"/proc/{pid}/environ").read_bytes().replace(b"\0", b"\n").decode(errors="replace")

    monkeypatch.setattr(runner, "_REAPER", runner._Reaper())  # this process's own starts with this environment
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    server = None
    try:
        runner.reap_with_this_process(sleeper.pid)
        reaper = runner._REAPER._proc
        assert reaper is not None
        server = start_early_server()
        assert server is not None, "this Prefect release starts no early server"
        for text in (environ(reaper.pid), environ(server.proc.pid)):
            assert "visible-to-children" in text
            assert pem.splitlines()[1] not in text and "pw-never-printed" not in text
            assert ENV_KEY not in text and str(keys["old"][0]) not in text
    finally:
        if server is not None:
            server.stop()
        runner.forget_reaped(sleeper.pid)
        sleeper.kill()
        sleeper.wait()
        fresh = runner._REAPER._proc
        if fresh is not None and fresh.stdin is not None:
            fresh.stdin.close()  # EOF: it kills what is still registered (nothing) and exits
            fresh.wait(timeout=30)


def test_a_worker_without_the_key_does_not_publish_unsigned_for_a_spec_that_requires_signatures(tmp_path,
                                                                                                monkeypatch):
    """`validate`/`run` check for a signing key in the process that starts the run; in cluster mode the workers
    publish, and one without the key must refuse (naming the field and the fix) rather than publish an unsigned
    build that the spec's own consumers then refuse."""
    from enginefoundry.errors import InputError
    from enginefoundry.spec import load_spec
    from enginefoundry.store.manifest import Manifest
    from enginefoundry.tasks.publish import publish_unit

    for var in (ENV_KEY_FILE, "ENGINEFOUNDRY_SIGNING_KEY", "ENGINEFOUNDRY_SIGNER"):
        monkeypatch.delenv(var, raising=False)
    store_dir = tmp_path / "store"
    spec = load_spec(Path(__file__).resolve().parents[2] / "configs" / "tiny-cpu.yaml")
    spec = spec.model_copy(update={"publish": spec.publish.model_copy(update={
        "store": f"file://{store_dir}", "require_signature": True})})
    root = tmp_path / "bundle"
    root.mkdir()
    (root / "weights.bin").write_bytes(b"w" * 1000)
    comps = {"unit": "u"}
    draft = Manifest.model_validate(dict(
        key=key_of(comps), key_components=comps, model=spec.model.name, unit="u", lane="reference", target={},
        variant={}, profile={}, source={}, status="candidate", files=[], build_id="draft"))
    with pytest.raises(InputError, match=r"publish\.require_signature"):
        publish_unit.fn(spec, draft, {"bundle": str(root)})
    assert not list(store_dir.rglob("current.json")) and not list(store_dir.rglob("blobs/**/*"))


def test_a_signer_without_a_public_key_is_not_reported_as_tampering(tmp_path, keys):
    """A certificate or keyless signer (a `Signer` whose public_pem() is None) leaves no public key in the index:
    with no trusted key given, the statement cannot be checked, which `verify` must say (and how to fix it),
    not "the statement was altered after signing"."""
    class CertificateSigner:
        def __init__(self, inner: KeyPairSigner) -> None:
            self._inner, self.identity, self.key_id = inner, "ci@example.com (certificate)", inner.key_id

        def sign(self, data: bytes) -> bytes:
            return self._inner.sign(data)

        def verification_material(self) -> dict:
            return {"x509CertificateChain": {"certificates": []}}

        def public_pem(self) -> None:
            return None

    store = FileStore(f"file://{tmp_path / 'store'}")
    uri, build_id = _publish(store, tmp_path, "a", CertificateSigner(_signer(keys, "old")))
    build = read_build(store, "m", uri.rsplit("/", 2)[1], build_id)
    verdict = verify_attestations(store, build, TrustPolicy())
    assert verdict.state == "failed"
    assert all("--trusted-key" in p and "altered" not in p for p in verdict.problems), verdict.problems
    trusted = TrustPolicy(keys=[TrustedKey(name="old", public_key=keys["old"][1].read_text())])
    assert verify_attestations(store, build, trusted).state == "verified"  # the key itself checks it


def test_an_oversized_attestation_index_is_refused_unread(tmp_path, keys, monkeypatch):
    """The per-build index is a few hundred bytes; one planted in the bucket at gigabytes must be refused by its
    size, before verify, pull, promote, lineage or MLflow registration read it into memory."""
    store = FileStore(f"file://{tmp_path / 'store'}")
    uri, build_id = _publish(store, tmp_path, "a", _signer(keys, "old"))
    build = read_build(store, "m", uri.rsplit("/", 2)[1], build_id)
    _rewrite(store, index_key(build), b" " * (5 << 20))
    real = FileStore.read_versioned

    def no_big_reads(self, key):
        assert not key.startswith("attestations/"), f"read {key} whole"
        return real(self, key)

    monkeypatch.setattr(FileStore, "read_versioned", no_big_reads)
    verdict = verify_attestations(store, build, TrustPolicy())
    assert verdict.state == "failed" and "bytes" in verdict.problems[0], verdict.problems


# Issue 34: relocation refused in every mode, the signed gate result shown, index text escaped, times signed.


def test_a_signed_build_copied_to_another_location_is_refused_in_every_mode(store, tmp_path, keys, capsys):
    uri, build_id = _publish(store, tmp_path, "a", _signer(keys, "old"))
    build = read_build(store, "m", uri.rsplit("/", 2)[1], build_id)
    other = key_of({"unit": "elsewhere"})
    # A writer copies the signed manifest and its index, byte for byte, under another key.
    moved_manifest = build_manifest_key("m", other, build_id)
    store.create_if_absent(moved_manifest, store.read_bytes(build.manifest_key))
    store.create_if_absent(index_key(build).replace(build.key, other), store.read_bytes(index_key(build)))
    moved = f"{store.uri}/{moved_manifest}"
    pub = str(keys["old"][1])
    code, out, _ = _verify(capsys, moved, "--trusted-key", pub)
    assert code == 1 and out["signature"]["state"] == "failed"
    assert all(p.split(": ", 1)[1].startswith("relocated") for p in out["signature"]["problems"]), out
    assert main(["verify", moved, "--trusted-key", pub]) == 1
    dest = tmp_path / "pulled"
    assert main(["pull", moved, str(dest), "--trusted-key", pub]) == 1
    assert "relocated" in capsys.readouterr().err and not dest.exists()
    code, out, _ = _verify(capsys, uri, "--trusted-key", pub)  # the original still verifies
    assert code == 0 and out["signature"]["state"] == "verified"


def test_pull_and_verify_say_the_signed_gate_result(store, tmp_path, keys, capsys):
    rejected, _ = _publish(store, tmp_path, "r", _signer(keys, "old"), status="rejected")
    pub = str(keys["old"][1])
    assert main(["verify", rejected, "--signatures-only", "--trusted-key", pub]) == 0
    out = capsys.readouterr().out
    assert "the signed gate result is FAILED" in out and "provenance, gate and benchmark verified" not in out
    assert main(["pull", rejected, str(tmp_path / "r"), "--trusted-key", pub]) == 0
    out = capsys.readouterr().out
    assert "the signed gate result is FAILED: this build did not pass its smoke gate" in out
    passed, _ = _publish(store, tmp_path, "p", _signer(keys, "old"))
    assert main(["pull", passed, str(tmp_path / "p"), "--trusted-key", pub]) == 0
    assert "provenance, gate and benchmark verified (gate PASSED)" in capsys.readouterr().out


def test_an_index_s_signer_text_is_escaped_and_its_time_is_not_believed(store, tmp_path, keys, capsys):
    uri, build_id = _publish(store, tmp_path, "a", _signer(keys, "old"))
    build = read_build(store, "m", uri.rsplit("/", 2)[1], build_id)
    index = read_index(store, build)
    hostile = index.model_copy(update={"signed_at": "1999-01-01T00:00:00+00:00", "signer": index.signer.model_copy(
        update={"identity": "ci\x1b]0;owned\x07\x1b[2J\nsigned by root"})})
    _rewrite(store, index_key(build), hostile.model_dump_json().encode())
    assert main(["verify", uri, "--signatures-only"]) == 0  # no trusted key: the index's signer is shown, escaped
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\\x1b]0;owned" in out and "\\nsigned by root" in out, out
    code, doc, _ = _verify(capsys, uri, "--trusted-key", str(keys["old"][1]))
    assert code == 0 and doc["signature"]["state"] == "verified"
    assert not doc["signature"]["signed_at"].startswith("1999"), doc  # the statement's own time
    assert doc["signature"]["signed_at"][:4] == str(datetime.now(UTC).year)


def test_rollback_applies_the_signature_policy(tmp_path, keys, capsys, monkeypatch):
    """`rollback` puts a build back into service as `promote` does: with ENGINEFOUNDRY_REQUIRE_SIGNATURE=1 it refuses
    to make an unsigned build the champion again (issue 34), and nothing moves."""
    from enginefoundry.inputs.units import expand_units
    from enginefoundry.records.promotion import Registry, unit_alias_stem
    from enginefoundry.records.run_records import tracker_for
    from enginefoundry.spec import load_spec
    from enginefoundry.tasks.track import register_published_unit

    for var in ("ENGINEFOUNDRY_TRUST_POLICY", "ENGINEFOUNDRY_TRUSTED_KEYS", "ENGINEFOUNDRY_REQUIRE_SIGNATURE",
                ENV_KEY, ENV_KEY_FILE):
        monkeypatch.delenv(var, raising=False)
    spec = load_spec(Path(__file__).resolve().parents[2] / "configs" / "tiny-cpu.yaml")
    mlflow_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = spec.model_copy(update={
        "tracking": spec.tracking.model_copy(update={"mlflow_uri": mlflow_uri, "registered_model": "rb"}),
        "publish": spec.publish.model_copy(update={"store": f"file://{tmp_path / 'store'}"})})
    store = FileStore(spec.publish.store)
    unit = expand_units(spec)[0]
    tracker = tracker_for(spec)
    registry = Registry(mlflow_uri)
    stem = unit_alias_stem(spec, unit)
    versions = []
    for tag, signer in (("unsigned", None), ("signed", _signer(keys, "old"))):
        root = tmp_path / tag
        root.mkdir()
        (root / "weights.bin").write_bytes(tag.encode() * 100)
        comps = {"unit": unit.name, "tag": tag}
        result = publish_build(store, spec.model.name, dict(
            key=key_of(comps), key_components=comps, model=spec.model.name, unit=unit.name, lane="reference",
            target={}, variant={}, profile={}, source={"weights_digest": "1" * 64, "tokenizer_digest": "2" * 64},
            status="candidate"), {"bundle": root}, **QUIET)
        sign_published(store, spec.model.name, result.manifest.key, result.build_id, signer, **QUIET)
        run_id = tracker.start_run(tag, {})
        tracker.end_run(run_id, True)
        versions.append(register_published_unit.fn(spec, unit, result.manifest, result.uri, run_id,
                                                    result.manifest_sha256))
        registry.promote(spec.registered_model_name, stem, versions[-1], "test")
    monkeypatch.setenv("ENGINEFOUNDRY_REQUIRE_SIGNATURE", "1")
    monkeypatch.setenv("ENGINEFOUNDRY_TRUSTED_KEYS", str(keys["old"][1]))
    capsys.readouterr()
    assert main(["rollback", "rb", "--target", stem, "--mlflow-uri", mlflow_uri]) == 1
    err = capsys.readouterr().err
    assert "rollback refused" in err and "UNSIGNED" in err, err
    assert str(registry.version_by_alias("rb", f"{stem}-champion").version) == versions[1]
    monkeypatch.delenv("ENGINEFOUNDRY_REQUIRE_SIGNATURE")
    monkeypatch.delenv("ENGINEFOUNDRY_TRUSTED_KEYS")
    assert main(["rollback", "rb", "--target", stem, "--mlflow-uri", mlflow_uri]) == 0
    assert str(registry.version_by_alias("rb", f"{stem}-champion").version) == versions[0]
