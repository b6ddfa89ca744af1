"""DSSE and the key-pair signer, in memory: the spec's PAE vector, sign/verify, an altered payload, keys
that are not P-256, and a trust policy file."""

from __future__ import annotations

import base64
import json

import pytest

from enginefoundry.errors import InputError
from enginefoundry.evidence.signing import (
    BUNDLE_MEDIA_TYPE,
    STATEMENT_TYPE,
    SignatureError,
    check_signature,
    keygen,
    load_trust_policy,
    open_bundle,
    pae,
    sign_statement,
    signer_from_env,
)


def test_pae_matches_the_dsse_spec_vector():
    # github.com/secure-systems-lab/dsse protocol.md, "Test vector".
    assert pae("http://example.com/HelloWorld", b"hello world") == \
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"


def test_sign_and_check_and_an_altered_payload_fails(tmp_path):
    key, pub = keygen(tmp_path / "k")
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    signer = signer_from_env({"ENGINEFOUNDRY_SIGNING_KEY_FILE": str(key)})
    data = sign_statement({"_type": STATEMENT_TYPE, "subject": [], "predicateType": "x", "predicate": {}}, signer)
    doc = json.loads(data)
    assert doc["mediaType"] == BUNDLE_MEDIA_TYPE and doc["verificationMaterial"]["publicKey"]["hint"] == signer.key_id
    assert check_signature(open_bundle(data), pub.read_text())
    doc["dsseEnvelope"]["payload"] = base64.b64encode(
        json.dumps({"_type": STATEMENT_TYPE, "subject": [], "predicateType": "y", "predicate": {}}).encode()).decode()
    assert not check_signature(open_bundle(json.dumps(doc).encode()), pub.read_text())
    with pytest.raises(InputError, match="exists"):
        keygen(tmp_path / "k")  # a key is never overwritten


def test_only_p256_keys_are_accepted():
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    pem = ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    with pytest.raises(InputError, match="P-256"):
        signer_from_env({"ENGINEFOUNDRY_SIGNING_KEY": pem})
    assert signer_from_env({}) is None  # no key: builds are published unsigned


def test_trust_policy_file_names_the_bad_entry(tmp_path):
    keygen(tmp_path / "k")
    (tmp_path / "ok.yaml").write_text("require_signature: true\nkeys:\n  - name: ci\n    public_key_file: k.pub\n"
                                      "    expires_at: '2030-01-01T00:00:00Z'\n")
    policy = load_trust_policy(tmp_path / "ok.yaml")
    assert policy.require_signature and policy.keys[0].name == "ci" and policy.keys[0].expires_at.year == 2030
    (tmp_path / "bad.yaml").write_text("keys:\n  - name: oops\n    public_key_file: k.key\n")
    with pytest.raises(InputError, match=r"keys\[0\].*private key"):
        load_trust_policy(tmp_path / "bad.yaml")


_PLUGIN_KEY: list[str] = []


def plugin_signer():
    """A Signer factory as ENGINEFOUNDRY_SIGNER=module:factory names it (a PKI or Sigstore signer in practice)."""
    from enginefoundry.evidence.signing import KeyPairSigner

    return KeyPairSigner(_PLUGIN_KEY[0].encode(), name="plugged")


def test_a_signer_can_be_plugged_in(tmp_path):
    key, pub = keygen(tmp_path / "k")
    _PLUGIN_KEY[:] = [key.read_text()]
    signer = signer_from_env({"ENGINEFOUNDRY_SIGNER": "tests.unit.test_signing:plugin_signer"})
    assert signer.identity.startswith("plugged")
    data = sign_statement({"_type": STATEMENT_TYPE, "subject": [], "predicateType": "x", "predicate": {}}, signer)
    assert check_signature(open_bundle(data), pub.read_text())
    with pytest.raises(InputError, match="module:factory"):
        signer_from_env({"ENGINEFOUNDRY_SIGNER": "no.such.module:f"})


def _spec_with(tmp_path, **publish):
    """configs/tiny-cpu.yaml copied beside `tmp_path` with its inputs absolute and these publish fields."""
    from pathlib import Path

    import yaml

    from enginefoundry.spec import load_spec

    configs = Path(__file__).resolve().parents[2] / "configs"
    doc = yaml.safe_load((configs / "tiny-cpu.yaml").read_text())
    doc["model"]["source"] = str((configs / doc["model"]["source"]).resolve())
    doc["smoke"]["prompts"] = str((configs / doc["smoke"]["prompts"]).resolve())
    doc["publish"] = {"store": f"file://{tmp_path / 'store'}", **publish}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path, load_spec(path)


def test_spec_signature_policy_refuses_a_missing_key_file_and_a_missing_signing_key(tmp_path, monkeypatch):
    from enginefoundry.errors import SpecError
    from enginefoundry.evidence.signing import ENV_KEY, ENV_KEY_FILE
    from enginefoundry.planning.validate import validate_deep

    for var in (ENV_KEY, ENV_KEY_FILE, "ENGINEFOUNDRY_SIGNER"):
        monkeypatch.delenv(var, raising=False)
    _, spec = _spec_with(tmp_path, require_signature=True, trusted_keys=["keys/absent.pub"])
    with pytest.raises(SpecError) as err:
        validate_deep(spec)
    fields = [f for f, _ in err.value.problems]
    assert "publish.trusted_keys[0]" in fields and "publish.require_signature" in fields, err.value.problems
    assert "absent.pub" in str(err.value) and ENV_KEY_FILE in str(err.value)

    key, _ = keygen(tmp_path / "keys" / "ci")
    monkeypatch.setenv(ENV_KEY_FILE, str(key))
    _, spec = _spec_with(tmp_path, require_signature=True, trusted_keys=["keys/ci.pub"])
    validate_deep(spec)  # relative to the spec's folder; a signing key is set


def test_spec_signature_policy_joins_the_command_lines(tmp_path, monkeypatch):
    import argparse

    from enginefoundry.cli.signing import policy_of

    for var in ("ENGINEFOUNDRY_TRUST_POLICY", "ENGINEFOUNDRY_TRUSTED_KEYS", "ENGINEFOUNDRY_REQUIRE_SIGNATURE"):
        monkeypatch.delenv(var, raising=False)
    _, spec_pub = keygen(tmp_path / "spec-key")
    _, cli_pub = keygen(tmp_path / "cli-key")
    path, _ = _spec_with(tmp_path, require_signature=True, trusted_keys=[str(spec_pub)])
    args = argparse.Namespace(spec=str(path), trusted_key=[str(cli_pub)], trust_policy=None, require_signature=None)
    policy = policy_of(args)
    assert policy.require_signature and {k.name for k in policy.keys} == {"spec-key", "cli-key"}
    (tmp_path / "other.yaml").write_text("keys: []\n")
    path, _ = _spec_with(tmp_path, trust_policy="other.yaml")
    with pytest.raises(InputError, match="give one of them"):
        policy_of(argparse.Namespace(spec=str(path), trusted_key=None, trust_policy=str(tmp_path / "other.yaml"),
                                     require_signature=None))


@pytest.mark.parametrize("doc", [
    {"verificationMaterial": "x"},
    {"verificationMaterial": {"publicKey": "x"}},
    {"verificationMaterial": {"publicKey": {"hint": 7}}},
    {"signatures": 5},
    {"signatures": {"sig": "AAAA"}},
], ids=["material-not-a-mapping", "public-key-not-a-mapping", "hint-not-text", "signatures-a-number",
        "signatures-a-mapping"])
def test_a_hostile_bundle_is_a_signature_error_not_a_crash(doc):
    """A bundle is read from the store, which anyone with bucket write access can fill: any shape of it is a
    SignatureError (verify says "not a valid signed statement"), never an AttributeError/TypeError traceback."""
    payload = base64.b64encode(json.dumps({"_type": STATEMENT_TYPE, "subject": []}).encode()).decode()
    envelope = {"payloadType": "application/vnd.in-toto+json", "payload": payload, "signatures": []}
    if "signatures" in doc:
        envelope["signatures"] = doc["signatures"]
    bundle = {"dsseEnvelope": envelope, **({"verificationMaterial": doc["verificationMaterial"]}
                                           if "verificationMaterial" in doc else {})}
    with pytest.raises(SignatureError):
        open_bundle(json.dumps(bundle).encode())


# Issue 34: a signature policy that cannot be half-set.


def _no_trust_env(monkeypatch) -> None:
    for var in ("ENGINEFOUNDRY_SIGNING_KEY", "ENGINEFOUNDRY_SIGNING_KEY_FILE", "ENGINEFOUNDRY_SIGNER",
                "ENGINEFOUNDRY_TRUST_POLICY", "ENGINEFOUNDRY_TRUSTED_KEYS", "ENGINEFOUNDRY_REQUIRE_SIGNATURE",
                "ENGINEFOUNDRY_SIGNER_NAME"):
        monkeypatch.delenv(var, raising=False)


def _problems(spec) -> dict[str, str]:
    from enginefoundry.errors import SpecError
    from enginefoundry.planning.validate import validate_deep

    with pytest.raises(SpecError) as err:
        validate_deep(spec)
    return dict(err.value.problems)


def test_require_signature_without_a_trusted_key_is_refused_by_validate(tmp_path, monkeypatch):
    _no_trust_env(monkeypatch)
    key, _ = keygen(tmp_path / "keys" / "ci")
    monkeypatch.setenv("ENGINEFOUNDRY_SIGNING_KEY_FILE", str(key))
    _, spec = _spec_with(tmp_path, require_signature=True)
    problems = _problems(spec)
    assert "trusts no key" in problems["publish.require_signature"], problems
    assert "publish.trusted_keys" in problems["publish.require_signature"]
    # The same through a trust policy file with `require_signature: true` and no keys.
    (tmp_path / "trust.yaml").write_text("require_signature: true\nkeys: []\n")
    _, spec = _spec_with(tmp_path, trust_policy="trust.yaml")
    assert "trusts no key" in _problems(spec)["publish.require_signature"]


def test_a_signing_key_the_spec_does_not_trust_is_refused(tmp_path, monkeypatch):
    from enginefoundry.planning.validate import validate_deep

    _no_trust_env(monkeypatch)
    key, _ = keygen(tmp_path / "keys" / "ci")
    keygen(tmp_path / "keys" / "other")
    monkeypatch.setenv("ENGINEFOUNDRY_SIGNING_KEY_FILE", str(key))
    _, spec = _spec_with(tmp_path, trusted_keys=["keys/other.pub"])
    assert "is not among the spec's trusted keys" in _problems(spec)["publish.trusted_keys"]
    _, spec = _spec_with(tmp_path, trusted_keys=["keys/other.pub", "keys/ci.pub"])
    validate_deep(spec)
    # Listed, but outside its period: its signatures would be refused (and every run would rebuild).
    (tmp_path / "trust.yaml").write_text("keys:\n  - {name: ci, public_key_file: keys/ci.pub, "
                                         "expires_at: '2020-01-01T00:00:00Z'}\n")
    _, spec = _spec_with(tmp_path, trust_policy="trust.yaml")
    assert "may sign only" in _problems(spec)["publish.trust_policy"]


def test_a_key_listed_twice_is_refused(tmp_path, monkeypatch):
    from enginefoundry.evidence.signing import consumer_policy

    _no_trust_env(monkeypatch)
    _, pub = keygen(tmp_path / "keys" / "ci")
    (tmp_path / "twice.yaml").write_text(
        "keys:\n  - {name: a, public_key_file: keys/ci.pub, expires_at: '2020-01-01T00:00:00Z'}\n"
        "  - {name: b, public_key_file: keys/ci.pub}\n")
    with pytest.raises(InputError, match=r"keys\[0\] and keys\[1\] are the same key"):
        load_trust_policy(tmp_path / "twice.yaml")
    _, spec = _spec_with(tmp_path, trusted_keys=["keys/ci.pub", str(pub)])
    assert "publish.trusted_keys[0] and publish.trusted_keys[1] are the same key" in \
        _problems(spec)["publish.trusted_keys"]
    # From several places: the same key with the same (no) period is one entry; with another period, refused.
    monkeypatch.setenv("ENGINEFOUNDRY_TRUSTED_KEYS", str(pub))
    assert len(consumer_policy([str(pub)]).keys) == 1
    (tmp_path / "windowed.yaml").write_text("keys:\n  - {name: a, public_key_file: keys/ci.pub, "
                                            "expires_at: '2020-01-01T00:00:00Z'}\n")
    with pytest.raises(InputError, match="different validity periods"):
        consumer_policy([str(pub)], str(tmp_path / "windowed.yaml"))


def test_without_trusted_keys_a_run_trusts_exactly_its_own_key_and_says_so(tmp_path, monkeypatch):
    from enginefoundry.cli.signing import signing_line
    from enginefoundry.evidence.signing import run_policy

    _no_trust_env(monkeypatch)
    key, _ = keygen(tmp_path / "keys" / "ci")
    keygen(tmp_path / "keys" / "other")
    _, spec = _spec_with(tmp_path)
    assert run_policy(spec, None).keys == []
    monkeypatch.setenv("ENGINEFOUNDRY_SIGNING_KEY_FILE", str(key))
    signer = signer_from_env()
    assert [k.key_id for k in run_policy(spec, signer).keys] == [signer.key_id]
    assert "trusts exactly this key" in signing_line(spec)
    _, spec = _spec_with(tmp_path, trusted_keys=["keys/ci.pub", "keys/other.pub"])
    assert len(run_policy(spec, signer).keys) == 2 and "trusts exactly" not in signing_line(spec)


def test_text_from_the_store_is_printed_with_its_control_characters_escaped():
    from enginefoundry.confine import printable

    assert printable("ci\x1b[2J\r\nroot\u202etxt.exe Zoë") == "ci\\x1b[2J\\r\\nroot\\u202etxt.exe Zoë"
    assert printable("x" * 300, 10) == "x" * 10 + "…"
