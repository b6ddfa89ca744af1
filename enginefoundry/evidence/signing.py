"""Signing identities and the signature envelope: DSSE over in-toto statements, in a Sigstore bundle.

The format is the one the OpenSSF model-signing tool writes for a key pair (model_signing 1.1.1,
`_signing/sign_ec_key.py` and `_signing/sign_sigstore_pb.py`): a Sigstore bundle
(`application/vnd.dev.sigstore.bundle.v0.3+json`) whose `dsseEnvelope` carries an in-toto Statement v1
(`application/vnd.in-toto+json`), signed over DSSE's pre-authentication encoding
(github.com/secure-systems-lab/dsse protocol.md v1.0.0: `DSSEv1 <len> <type> <len> <payload>`) with ECDSA
P-256/SHA-256; `verificationMaterial.publicKey.hint` is the sha256 of the public key's DER SubjectPublicKeyInfo.
Tools outside this project (model_signing, sigstore-python, cosign's DSSE code, plain `openssl`) can check it.

Signers are pluggable (`Signer`): a key pair from a file or an environment variable works offline; a PKI or
keyless Sigstore signer can be named with ENGINEFOUNDRY_SIGNER=module:factory. The private key is read into
memory only: nothing here writes it, logs it or puts it in an error message.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import json
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

import yaml
from pydantic import BaseModel, Field

from enginefoundry.errors import InputError
from enginefoundry.schemas.base import DocumentError, parse_json
from enginefoundry.schemas.loose import InTotoStatement, SigstoreBundle

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePrivateKey, EllipticCurvePublicKey
    from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes, PublicKeyTypes

    from enginefoundry.spec import BuildSpec

BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
MAX_SIGNED_BYTES = 4 << 20  # a signed bundle and its statement are a few KiB; parsed within this bound

ENV_KEY = "ENGINEFOUNDRY_SIGNING_KEY"  # the PEM text of the private key
ENV_KEY_FILE = "ENGINEFOUNDRY_SIGNING_KEY_FILE"  # a path to it
ENV_KEY_PASSWORD = "ENGINEFOUNDRY_SIGNING_KEY_PASSWORD"  # optional: an encrypted PEM's password
ENV_SIGNER_NAME = "ENGINEFOUNDRY_SIGNER_NAME"  # optional: a readable identity recorded beside the key id
ENV_SIGNER = "ENGINEFOUNDRY_SIGNER"  # optional: module:factory of another Signer (PKI, keyless Sigstore)
ENV_TRUST_POLICY = "ENGINEFOUNDRY_TRUST_POLICY"  # a trust policy file (consumers)
ENV_TRUSTED_KEYS = "ENGINEFOUNDRY_TRUSTED_KEYS"  # public key files, separated by os.pathsep (consumers)
ENV_REQUIRE_SIGNATURE = "ENGINEFOUNDRY_REQUIRE_SIGNATURE"  # 1/true: pull, promote and rollout refuse unsigned


class SignatureError(Exception):
    """A signature or an envelope that does not check; the message names the cause."""


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding (secure-systems-lab/dsse protocol.md)."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: object, what: str) -> bytes:
    try:
        return base64.b64decode(str(text), validate=True)
    except ValueError:
        raise SignatureError(f"{what} is not base64") from None


# Keys


def key_id(public_pem: bytes) -> str:
    """sha256 of the DER SubjectPublicKeyInfo: the bundle's `publicKey.hint` (as model_signing computes it)."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_public_key(public_pem)
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


def _only_p256(what: str) -> InputError:
    return InputError(f"{what}: only ECDSA P-256 keys are supported (make one with `enginefoundry keygen`)")


def _p256_private(key: PrivateKeyTypes, what: str) -> EllipticCurvePrivateKey:
    from cryptography.hazmat.primitives.asymmetric import ec

    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise _only_p256(what)
    return key


def _p256_public(key: PublicKeyTypes, what: str) -> EllipticCurvePublicKey:
    from cryptography.hazmat.primitives.asymmetric import ec

    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
        raise _only_p256(what)
    return key


def public_pem_of(private_key: EllipticCurvePrivateKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return private_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                 serialization.PublicFormat.SubjectPublicKeyInfo)


def keygen(prefix: Path) -> tuple[Path, Path]:
    """A new ECDSA P-256 key pair: `<prefix>.key` (PEM, mode 0600, created exclusively) and `<prefix>.pub`."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key_path, pub_path = prefix.with_name(prefix.name + ".key"), prefix.with_name(prefix.name + ".pub")
    for p in (key_path, pub_path):
        if p.exists():
            raise InputError(f"{p} exists: choose another --out, a key is never overwritten")
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    prefix.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    pub_path.write_bytes(public_pem_of(key))
    return key_path, pub_path


# Signers


@runtime_checkable
class Signer(Protocol):
    """Signs DSSE's pre-authentication encoding. `identity` is what consumers are shown (never a secret)."""

    identity: str
    key_id: str

    def sign(self, data: bytes) -> bytes: ...

    def verification_material(self) -> SigstoreBundle:
        """The bundle's `verificationMaterial` (a key hint, or a certificate chain)."""
        ...

    def public_pem(self) -> str | None:
        """The public key a verifier needs, None for a certificate signer."""
        ...


class KeyPairSigner:
    """ECDSA P-256 from a PEM private key, offline."""

    def __init__(self, pem: bytes, password: bytes | None = None, name: str | None = None,
                 what: str = "the signing key") -> None:
        from cryptography.hazmat.primitives import serialization

        try:
            loaded = serialization.load_pem_private_key(pem, password)
        except (ValueError, TypeError):
            # Never the key's text: only where it came from and what to do.
            raise InputError(f"{what} is not a readable PEM private key (or its password is wrong); make one "
                             "with `enginefoundry keygen`") from None
        self._key = _p256_private(loaded, what)
        self._public = public_pem_of(self._key)
        self.key_id = key_id(self._public)
        self.identity = f"{name} ({self.key_id[:16]})" if name else f"key {self.key_id[:16]}"

    def sign(self, data: bytes) -> bytes:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec

        return self._key.sign(data, ec.ECDSA(hashes.SHA256()))

    def verification_material(self) -> SigstoreBundle:
        return {"publicKey": {"hint": self.key_id}}

    def public_pem(self) -> str | None:
        return self._public.decode()

    def __repr__(self) -> str:  # never the key
        return f"KeyPairSigner({self.identity})"


def signer_from_env(environ: Mapping[str, str] | None = None) -> Signer | None:
    """The configured signer: ENGINEFOUNDRY_SIGNER (module:factory), else a key pair from
    ENGINEFOUNDRY_SIGNING_KEY (PEM text) or ENGINEFOUNDRY_SIGNING_KEY_FILE (path); None when none is set
    (builds are then published unsigned)."""
    env = os.environ if environ is None else environ
    name = env.get(ENV_SIGNER_NAME) or None
    password = env.get(ENV_KEY_PASSWORD)
    pw = password.encode() if password else None
    if env.get(ENV_SIGNER):
        module, _, factory = env[ENV_SIGNER].partition(":")
        try:
            signer = getattr(importlib.import_module(module), factory or "signer")()
        except (ImportError, AttributeError) as err:
            raise InputError(f"{ENV_SIGNER}={env[ENV_SIGNER]}: cannot load it ({type(err).__name__}); give "
                             "module:factory of a callable returning a Signer") from None
        if not isinstance(signer, Signer):
            raise InputError(f"{ENV_SIGNER}={env[ENV_SIGNER]} did not return a Signer (enginefoundry.evidence.signing)")
        return signer
    if env.get(ENV_KEY):
        return KeyPairSigner(env[ENV_KEY].encode(), pw, name, what=f"${ENV_KEY}")
    if env.get(ENV_KEY_FILE):
        path = Path(env[ENV_KEY_FILE]).expanduser()
        try:
            pem = path.read_bytes()
        except OSError as err:
            raise InputError(f"${ENV_KEY_FILE}: cannot read {path} ({err.strerror}); give the path of the "
                             "private key `enginefoundry keygen` wrote") from None
        return KeyPairSigner(pem, pw, name, what=f"${ENV_KEY_FILE} ({path})")
    return None


# Envelopes


def sign_statement(statement: InTotoStatement, signer: Signer) -> bytes:
    """A Sigstore bundle (JSON bytes) holding a DSSE envelope over the statement."""
    payload = json.dumps(statement, sort_keys=True, separators=(",", ":")).encode()
    sig = signer.sign(pae(PAYLOAD_TYPE, payload))
    bundle = {
        "mediaType": BUNDLE_MEDIA_TYPE,
        "verificationMaterial": signer.verification_material(),
        "dsseEnvelope": {"payload": _b64(payload), "payloadType": PAYLOAD_TYPE,
                         "signatures": [{"sig": _b64(sig), "keyid": signer.key_id}]},
    }
    return (json.dumps(bundle, indent=2) + "\n").encode()


class OpenedBundle(BaseModel):
    statement: InTotoStatement
    payload: bytes
    signatures: list[tuple[str, bytes]]  # (keyid or hint, signature)


_T = TypeVar("_T")


def _field(doc: SigstoreBundle, name: str, default: _T, kind: type[_T]) -> _T:
    """doc[name] when it has the expected shape, default when absent; SignatureError for any other shape (a
    bundle is read from a store that anyone with write access can fill)."""
    value = doc.get(name)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise SignatureError(f"{name} is not a {'mapping' if kind is dict else kind.__name__}")
    return value


def open_bundle(data: bytes) -> OpenedBundle:
    """Parse a bundle (or a bare DSSE envelope) without checking signatures."""
    try:
        doc = parse_json(data, what="the bundle", max_bytes=MAX_SIGNED_BYTES)
    except DocumentError as err:
        raise SignatureError(str(err)) from None
    if not isinstance(doc, dict):
        raise SignatureError("not a bundle or DSSE envelope")
    env = doc.get("dsseEnvelope", doc)
    material: SigstoreBundle = _field(doc, "verificationMaterial", {}, dict)
    hint = _field(_field(material, "publicKey", {}, dict), "hint", "", str)
    if not isinstance(env, dict) or env.get("payloadType") != PAYLOAD_TYPE:
        raise SignatureError(f"payloadType is not {PAYLOAD_TYPE}")
    payload = _unb64(env.get("payload"), "payload")
    sigs = [(str(s.get("keyid") or hint), _unb64(s.get("sig"), "signature"))
            for s in _field(env, "signatures", [], list) if isinstance(s, dict)]
    try:
        statement = parse_json(payload, what="the payload", max_bytes=MAX_SIGNED_BYTES)
    except DocumentError as err:
        raise SignatureError(str(err)) from None
    if not isinstance(statement, dict) or statement.get("_type") != STATEMENT_TYPE:
        raise SignatureError(f"payload is not an in-toto statement ({STATEMENT_TYPE})")
    return OpenedBundle(statement=statement, payload=payload, signatures=sigs)


# Trust


class TrustedKey(BaseModel):
    """A public key a consumer accepts, with the period it signed in (a rotated-out key keeps verifying the
    builds it signed while valid)."""

    name: str = ""
    public_key: str = Field(description="PEM text of the public key")
    not_before: datetime | None = None
    expires_at: datetime | None = None

    @property
    def key_id(self) -> str:
        return key_id(self.public_key.encode())

    def label(self) -> str:
        return f"{self.name} ({self.key_id[:16]})" if self.name else f"key {self.key_id[:16]}"


class TrustPolicy(BaseModel):
    keys: list[TrustedKey] = Field(default_factory=list)
    require_signature: bool = False

    def find(self, kid: str) -> TrustedKey | None:
        return next((k for k in self.keys if k.key_id == kid), None)


def _pem_file(path: Path, what: str) -> str:
    try:
        text = path.expanduser().read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{what}: cannot read {path} ({type(err).__name__}); give a public key file "
                         "(`enginefoundry keygen` writes <name>.pub)") from None
    if "PRIVATE KEY" in text:
        raise InputError(f"{what}: {path} is a private key; give its .pub file")
    try:
        key_id(text.encode())
    except (ValueError, TypeError):
        raise InputError(f"{what}: {path} is not a PEM public key") from None
    return text


def load_trust_policy(path: Path) -> TrustPolicy:
    """YAML or JSON: `keys: [{name, public_key_file | public_key, not_before?, expires_at?}]`,
    `require_signature: bool`. Relative key files are relative to the policy file."""
    try:
        raw = yaml.safe_load(path.expanduser().read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise InputError(f"trust policy {path}: cannot read it ({type(err).__name__})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("keys", []), list):
        raise InputError(f"trust policy {path}: expected a mapping with a `keys` list")
    keys = []
    for i, entry in enumerate(raw.get("keys", [])):
        if not isinstance(entry, dict):
            raise InputError(f"trust policy {path}: keys[{i}] must be a mapping")
        entry = dict(entry)
        if "public_key_file" in entry:
            f = Path(str(entry.pop("public_key_file")))
            entry["public_key"] = _pem_file(f if f.is_absolute() else path.parent / f, f"{path}: keys[{i}]")
        try:
            keys.append(TrustedKey.model_validate(entry))
            keys[-1].key_id  # noqa: B018  (a bad PEM fails here, with the entry named)
        except (ValueError, TypeError) as err:
            raise InputError(f"trust policy {path}: keys[{i}]: {' '.join(str(err).split())[:200]}") from None
    _each_once(keys, f"trust policy {path}")
    return TrustPolicy(keys=keys, require_signature=bool(raw.get("require_signature", False)))


def _each_once(keys: list[TrustedKey], what: str, names: list[str] | None = None) -> None:
    """One entry per key in one policy: a key listed twice would be judged by its first entry alone (its validity
    period hiding the other's), so it is refused, naming both entries."""
    seen: dict[str, int] = {}
    for i, k in enumerate(keys):
        if k.key_id in seen:
            first, again = (names[seen[k.key_id]], names[i]) if names else (f"keys[{seen[k.key_id]}]", f"keys[{i}]")
            raise InputError(f"{what}: {first} and {again} are the same key ({k.key_id[:16]}): list each key once, "
                             "with the one period it may sign in")
        seen[k.key_id] = i


def _merged(keys: list[TrustedKey], what: str) -> list[TrustedKey]:
    """Keys from several places (a policy file, the environment, the command line, the spec): one entry per key.
    The same key given twice with the same period is kept once; with different periods it is refused (no entry
    may widen another's)."""
    out: dict[str, TrustedKey] = {}
    for k in keys:
        have = out.get(k.key_id)
        if have is None:
            out[k.key_id] = k
        elif (have.not_before, have.expires_at) != (k.not_before, k.expires_at):
            raise InputError(f"{what}: key {k.key_id[:16]} is given twice with different validity periods "
                             f"({have.label()}, {k.label()}): give it once")
    return list(out.values())


def truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def consumer_policy(trusted_keys: list[str] | None = None, policy_file: str | None = None,
                    require: bool | None = None, environ: Mapping[str, str] | None = None) -> TrustPolicy:
    """What a consumer trusts: --trust-policy (else $ENGINEFOUNDRY_TRUST_POLICY) plus every --trusted-key (and
    $ENGINEFOUNDRY_TRUSTED_KEYS);
    signatures are required by --require-signature, the policy file or $ENGINEFOUNDRY_REQUIRE_SIGNATURE."""
    env = os.environ if environ is None else environ
    file = policy_file or env.get(ENV_TRUST_POLICY)
    policy = load_trust_policy(Path(file)) if file else TrustPolicy()
    from_env = [k for k in (env.get(ENV_TRUSTED_KEYS) or "").split(os.pathsep) if k]
    named = [(k, f"${ENV_TRUSTED_KEYS}") for k in from_env] + [(k, "--trusted-key") for k in trusted_keys or []]
    for k, what in named:
        policy.keys.append(TrustedKey(name=Path(k).stem, public_key=_pem_file(Path(k), what)))
    policy.keys = _merged(policy.keys, "trusted keys")
    if require or truthy(env.get(ENV_REQUIRE_SIGNATURE)):
        policy.require_signature = True
    return policy


def spec_policy(spec: BuildSpec) -> TrustPolicy:
    """The spec's own signature policy (publish.require_signature, publish.trusted_keys, publish.trust_policy;
    paths relative to the spec). A key or policy file that cannot be read fails here, naming the field."""
    pub = spec.publish
    policy = TrustPolicy()
    if pub.trust_policy:
        try:
            policy = load_trust_policy(spec.resolve_path(pub.trust_policy))
        except InputError as err:
            raise InputError(f"publish.trust_policy: {err}") from None
    names = [f"publish.trust_policy keys[{i}]" for i in range(len(policy.keys))]
    for i, k in enumerate(pub.trusted_keys):
        path = spec.resolve_path(k)
        policy.keys.append(TrustedKey(name=path.stem, public_key=_pem_file(path, f"publish.trusted_keys[{i}]")))
        names.append(f"publish.trusted_keys[{i}]")
    _each_once(policy.keys, "publish.trusted_keys", names)
    policy.require_signature = policy.require_signature or pub.require_signature
    return policy


def run_policy(spec: BuildSpec, signer: Signer | None = None) -> TrustPolicy:
    """What a run trusts (its cache hits' signatures, the inputs it reuses, the signature its registrations record):
    the spec's policy; where the spec names no trusted key, exactly the run's own signing key (`signing_line`
    says so), and no key at all for a run without one."""
    policy = spec_policy(spec)
    own = signer.public_pem() if signer is not None else None
    if not policy.keys and own:
        policy.keys = [TrustedKey(name=os.environ.get(ENV_SIGNER_NAME) or "", public_key=own)]
    return policy


def merged_policy(cli: TrustPolicy, spec: TrustPolicy) -> TrustPolicy:
    """Both sets of keys (each key once); signatures required when either requires them."""
    return TrustPolicy(keys=_merged([*cli.keys, *spec.keys], "the command line's and the spec's trusted keys"),
                       require_signature=cli.require_signature or spec.require_signature)


def require_signer_for(spec: BuildSpec) -> None:
    """The spec's signature policy is whole, checked before any work (`validate`, `run`, and each worker that
    publishes): a spec that requires signatures names the keys it trusts (else a signature by any key would pass)
    and has a signing key configured (its own consumers would refuse every unsigned build it makes); a signing key
    is one the spec trusts, valid now (else the spec's own hits, pulls and promotions refuse every build it signs,
    and every run rebuilds them)."""
    try:
        policy: TrustPolicy | None = spec_policy(spec)
    except InputError:
        policy = None  # a key or policy file that cannot be read: spec_policy's own refusal names it
    requires = policy.require_signature if policy is not None else spec.publish.require_signature
    if policy is not None and requires and not policy.keys:
        raise InputError("publish.require_signature: true, but the spec trusts no key, so a signature by any key "
                         "would pass; list the signing key's public key in publish.trusted_keys (the .pub file "
                         "`enginefoundry keygen` wrote) or keys in publish.trust_policy")
    signer = signer_from_env()
    if requires and signer is None:
        raise InputError(f"publish.require_signature: true, but no signing key is configured; set ${ENV_KEY_FILE} "
                         f"(or ${ENV_KEY}) to a key from `enginefoundry keygen`, or set it to false")
    if signer is None or policy is None or not policy.keys:
        return
    listed = policy.find(signer.key_id)
    field = "publish.trust_policy" if spec.publish.trust_policy and not spec.publish.trusted_keys else \
        "publish.trusted_keys"
    if listed is None:
        raise InputError(f"{field}: the signing key {signer.identity} is not among the spec's trusted keys, so the "
                         "spec's own cache hits, pulls and promotions would refuse every build it signs (and each run "
                         "would rebuild them); add its public key there, or sign with a key it lists")
    now = now_utc()
    if (listed.expires_at and listed.expires_at.astimezone(UTC) <= now) or (
            listed.not_before and listed.not_before.astimezone(UTC) > now):
        raise InputError(f"{field}: the signing key {signer.identity} may sign only "
                         f"{'from ' + listed.not_before.isoformat() if listed.not_before else ''}"
                         f"{' until ' + listed.expires_at.isoformat() if listed.expires_at else ''}; "
                         "sign with a key valid now")


def check_signature(bundle: OpenedBundle, public_pem: str) -> bool:
    """True when one of the bundle's signatures is valid for this public key over the DSSE PAE."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = _p256_public(serialization.load_pem_public_key(public_pem.encode()), "public key")
    message = pae(PAYLOAD_TYPE, bundle.payload)
    for _, sig in bundle.signatures:
        try:
            key.verify(sig, message, ec.ECDSA(hashes.SHA256()))
            return True
        except InvalidSignature:
            continue
    return False


def now_utc() -> datetime:
    return datetime.now(UTC)
