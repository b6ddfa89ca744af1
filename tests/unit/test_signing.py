"""DSSE and the key-pair signer, in memory: the spec's PAE vector, sign/verify, an altered payload, keys
that are not P-256, and a trust policy file."""

from __future__ import annotations

import base64
import json

import pytest

from enginefoundry.errors import InputError
from enginefoundry.signing import (
    BUNDLE_MEDIA_TYPE,
    STATEMENT_TYPE,
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
    from enginefoundry.signing import KeyPairSigner

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
