"""Signed evidence per published build: in-toto statements (SLSA v1 build provenance, the smoke gate result,
the benchmark result) whose subject is the build's manifest digest, each in a signed DSSE envelope
(enginefoundry.evidence.signing), stored content-addressed beside the build:

    <store>/blobs/sha256/<ab>/<digest>                     each signed bundle, written once (conditional create)
    <store>/attestations/<model>/<key>/<build-id>.json     the per-build index: kind, predicate type, digest;
                                                           written once, never edited

Signing covers the manifest's sha256, and the manifest lists every blob's sha256: publishing signs a few KiB
and never re-reads a blob. Verification is the mirror: each bundle's digest, its signature by a trusted key
valid when it signed, its predicate type, and that its subject is this build's manifest as the store holds it.
Without a signing key a build is published unsigned, and `verify`, `pull`, `promote` and `lineage` say so.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from enginefoundry import __version__
from enginefoundry.confine import printable as shown
from enginefoundry.errors import EngineFoundryError, InputError, StoreError
from enginefoundry.evidence.signing import (
    ENV_KEY_FILE,
    STATEMENT_TYPE,
    OpenedBundle,
    SignatureError,
    Signer,
    TrustedKey,
    TrustPolicy,
    check_signature,
    consumer_policy,
    open_bundle,
    sign_statement,
)
from enginefoundry.schemas.attestation_index import AttestationIndex, IndexEntry, Kind, SignerInfo
from enginefoundry.schemas.base import DocumentError, WirePart
from enginefoundry.schemas.loose import InTotoStatement
from enginefoundry.store.backends import Store
from enginefoundry.store.layout import attestation_index_key, blob_key
from enginefoundry.store.publish import PublishedBuild, read_build
from enginefoundry.store.unit_status import UnitStatus

PROVENANCE = "https://slsa.dev/provenance/v1"
GATE = "https://in-toto.io/attestation/test-result/v0.1"
BENCHMARK = "https://enginefoundry.dev/attestation/benchmark/v1"
BUILD_TYPE = "https://enginefoundry.dev/buildtypes/unit/v1"
KINDS: dict[Kind, str] = {"provenance": PROVENANCE, "gate": GATE, "benchmark": BENCHMARK}

# MLflow tags on the unit run and the model version (enginefoundry namespace, as tracking_tags).
TAG_SIGNATURE = "enginefoundry.signature"  # "signed" | "unsigned"
TAG_SIGNER = "enginefoundry.signer"
TAG_SIGNER_KEY_ID = "enginefoundry.signer_key_id"
TAG_INDEX = "enginefoundry.attestations"
TAG_DIGEST = "enginefoundry.attestation.{kind}"

MAX_BUNDLE_BYTES = AttestationIndex.MAX_BYTES  # a signed statement is a few KiB; a model blob is refused unread
UNSIGNED_HINT = f"set ${ENV_KEY_FILE} to a key from `enginefoundry keygen` to sign builds"


def index_key(build: PublishedBuild) -> str:
    return attestation_index_key(build.model, build.key, build.build_id)


# Statements


def _digest(value: object) -> dict[str, str] | None:
    """`sha256:abc…` or a bare hex digest → {"sha256": "abc…"} (in-toto DigestSet); None when absent."""
    if not value or not isinstance(value, str):
        return None
    alg, sep, hexd = value.partition(":")
    return {alg: hexd} if sep else {"sha256": value}


def _canonical_digest(doc: Any) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _statement(build: PublishedBuild, predicate_type: str, predicate: InTotoStatement) -> InTotoStatement:
    return {"_type": STATEMENT_TYPE,
            "subject": [{"name": build.manifest_key, "digest": {"sha256": build.manifest_sha256}}],
            "predicateType": predicate_type, "predicate": predicate}


def provenance_predicate(build: PublishedBuild, signed_at: str) -> InTotoStatement:
    """SLSA v1 (slsa.dev/spec/v1.0/provenance): builder, external parameters (unit key and its components),
    resolved dependencies (source, weights, tokenizer, calibration, prompt set, toolchain image), run ids/times."""
    m = build.manifest
    assert m is not None
    comps = m.key_components.as_json()  # the predicate records the components as hashed
    toolchain = comps.get("toolchain", {}) if isinstance(comps.get("toolchain"), dict) else {}
    deps: list[InTotoStatement] = []  # SLSA ResourceDescriptors (resolvedDependencies)

    def dep(name: str, digest: object, uri: str | None = None, annotations: InTotoStatement | None = None) -> None:
        d = _digest(digest)
        if d or uri:
            deps.append({"name": name, **({"uri": uri} if uri else {}), **({"digest": d} if d else {}),
                         **({"annotations": annotations} if annotations is not None else {})})

    src = m.source.model_dump(mode="json")
    dep("source", None, src.get("uri"), annotations={"revision": src.get("revision"), "kind": src.get("kind")})
    dep("weights", src.get("weights_digest") or comps.get("weights_digest"))
    dep("tokenizer", src.get("tokenizer_digest") or comps.get("tokenizer_digest"))
    calib = comps.get("calibration")
    if calib:
        dep("calibration", calib.get("digest") if isinstance(calib, dict) else None,
            annotations={"calibration": calib})
    dep("prompt-set", m.prompts_digest)
    dep("toolchain-image", toolchain.get("image_digest"), toolchain.get("image"))
    # What the build consumed besides its sources (evidence/inputs.py), each by digest, with how it came by it: a
    # reused input names the trusted signer whose signature over that digest was checked before it was used.
    for given in m.inputs:
        dep(given.kind, given.sha256, given.uri or None,
            annotations={"key": given.key, "origin": given.origin, "proven_by": given.proven_by})
        for f in given.files:
            dep(f"{given.kind}/{f.path}", f.sha256)
    return {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {"model": m.model, "unit": m.unit, "key": m.key, "key_components": comps,
                                   "unit_settings_sha256": _canonical_digest(
                                       {"variant": _wire(m.variant), "profile": _wire(m.profile),
                                        "target": _wire(m.target)})},
            "internalParameters": {"lane": m.lane, "build_params": _wire(m.build_params),
                                   "checkpoint_key": m.checkpoint_key},
            "resolvedDependencies": deps,
        },
        "runDetails": {
            "builder": {"id": f"https://enginefoundry.dev/builders/{m.lane}",
                        "version": {"enginefoundry": __version__, **m.versions},
                        "builderDependencies": [{"name": "device", "annotations": _wire(m.device)},
                                                {"name": "target", "annotations": _wire(m.target)}]},
            "metadata": {"invocationId": m.prefect_flow_run_id or "", "finishedOn": m.created_at,
                         "mlflowRunId": m.mlflow_run_id or ""},
        },
        "signedAt": signed_at,
    }


def _wire(part: WirePart) -> InTotoStatement:
    """A manifest part in the predicate as the manifest holds it (never a model: canonical JSON would stringify it)."""
    return part.model_dump(mode="json")


def gate_predicate(build: PublishedBuild, signed_at: str) -> InTotoStatement:
    """The in-toto test-result predicate (in-toto/attestation spec/predicates/test-result.md v0.1): result,
    configuration (gate policy and prompt set digests), passed/failed tests; the metrics and sample sizes under
    `enginefoundry`."""
    m = build.manifest
    assert m is not None
    passed = m.status == UnitStatus.CANDIDATE
    policy = _canonical_digest(_wire(m.gate))
    config: list[dict[str, object]] = [{"name": "smoke-gate-policy", "digest": {"sha256": policy}}]
    if m.prompts_digest:
        config.append({"name": "prompt-set", "digest": _digest(m.prompts_digest)})
    return {"result": "PASSED" if passed else "FAILED", "configuration": config,
            "passedTests": ["smoke-gate"] if passed else [], "warnedTests": [],
            "failedTests": [] if passed else ["smoke-gate"],
            "enginefoundry": {"policy": _wire(m.gate), "metrics": _wire(m.smoke), "status": m.status,
                              "status_reason": m.status_reason},
            "signedAt": signed_at}


def benchmark_predicate(build: PublishedBuild, signed_at: str) -> InTotoStatement:
    """The benchmark as published in the manifest: tool and version, scenarios, per-point figures, goodput."""
    m = build.manifest
    assert m is not None
    bench = m.benchmark.model_dump(mode="json")
    return {"tool": bench.get("tool"), "toolVersion": bench.get("tool_version") or m.versions.get(str(bench.get(
                "tool"))), "result": bench, "signedAt": signed_at}


PREDICATES: dict[Kind, Callable[[PublishedBuild, str], InTotoStatement]] = {
    "provenance": provenance_predicate, "gate": gate_predicate, "benchmark": benchmark_predicate}


# Writing


def attest_build(store: Store, build: PublishedBuild, signer: Signer,
                 progress: Callable[[str], None] = print) -> AttestationIndex:
    """Sign the three statements of a unit build, store each bundle as a blob, then the index (once). An index
    that exists already (another run attested this build) is returned as it is."""
    ikey = index_key(build)
    existing = read_index(store, build)
    if existing is not None:
        return existing
    signed_at = datetime.now(UTC).isoformat(timespec="seconds")
    entries = []
    for kind, predicate_type in KINDS.items():
        data = sign_statement(_statement(build, predicate_type, PREDICATES[kind](build, signed_at)), signer)
        digest = hashlib.sha256(data).hexdigest()
        store.create_if_absent(blob_key(digest), data)
        entries.append(IndexEntry(kind=kind, predicate_type=predicate_type, sha256=digest, size=len(data)))
    index = AttestationIndex(manifest_key=build.manifest_key, manifest_sha256=build.manifest_sha256,
                             signer=SignerInfo(identity=signer.identity, key_id=signer.key_id,
                                               public_key=signer.public_pem()),
                             signed_at=signed_at, attestations=entries)
    if not store.create_if_absent(ikey, (index.model_dump_json(indent=2) + "\n").encode()):
        return read_index(store, build) or index
    progress(f"publish: signed by {signer.identity}: {', '.join(KINDS)} → {store.url(ikey)}")
    return index


def read_index(store: Store, build: PublishedBuild) -> AttestationIndex | None:
    """The build's attestation index, None when there is none; StoreError for one that is too large (refused by
    its size, unread) or not valid."""
    ikey = index_key(build)
    size = store.size(ikey)
    if size is None:
        return None
    if size > MAX_BUNDLE_BYTES:
        raise StoreError(f"{store.url(ikey)} is {size} bytes: not an attestation index (at most {MAX_BUNDLE_BYTES})")
    got = store.read_versioned(ikey)
    if got is None:
        return None
    try:
        index = AttestationIndex.parse(got[0])
    except DocumentError as err:
        raise StoreError(f"{store.url(ikey)} is not a valid attestation index ({err})") from None
    # Written by whoever can write the store, shown in terminals, logs and MLflow: escaped once, here.
    index.signer.identity = shown(index.signer.identity)
    index.signer.key_id = shown(index.signer.key_id, 64)
    index.signed_at = shown(index.signed_at, 64)
    return index


def mlflow_tags(index: AttestationIndex | None, store: Store, build: PublishedBuild) -> dict[str, str]:
    """What the unit run and the model version carry: signed or not, the signer, each attestation's digest."""
    if index is None:
        return {TAG_SIGNATURE: "unsigned"}
    return {TAG_SIGNATURE: "signed", TAG_SIGNER: index.signer.identity, TAG_SIGNER_KEY_ID: index.signer.key_id,
            TAG_INDEX: store.url(index_key(build)),
            **{TAG_DIGEST.format(kind=e.kind): f"sha256:{e.sha256}" for e in index.attestations}}


# Verification


class Check(BaseModel):
    kind: str
    ok: bool
    signer: str = ""
    cause: str = ""
    sha256: str = ""
    signed_at: str = ""  # the statement's own signing time (signed content, not the index's copy)
    result: str = ""  # a gate statement's signed result: PASSED or FAILED


class SignatureVerdict(BaseModel):
    """verified: every attestation signed by a trusted key, for this build. unsigned: none published.
    untrusted: signatures consistent, but no trusted key was given. failed: a check failed (see problems)."""

    uri: str
    state: Literal["verified", "unsigned", "untrusted", "failed"]
    required: bool
    signer: str = ""
    signed_at: str = ""
    gate_result: str = ""  # what the signed gate statement says: PASSED or FAILED
    checks: list[Check] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.state == "verified" or (self.state in ("unsigned", "untrusted") and not self.required)

    def line(self) -> str:
        if self.state == "verified" and self.gate_result != "PASSED":
            return (f"signed by {self.signer} at {self.signed_at}: signatures verified, and the signed gate result is "
                    f"{self.gate_result or 'missing'}: this build did not pass its smoke gate")
        if self.state == "verified":
            return f"signed by {self.signer} at {self.signed_at}: provenance, gate and benchmark verified (gate PASSED)"
        if self.state == "unsigned":
            return "UNSIGNED: no attestations were published for this build" + (
                " (signatures are required)" if self.required else "")
        if self.state == "untrusted":
            return (f"signed by {self.signer} (signatures consistent, but the signer is not checked: give "
                    "--trusted-key PUB or --trust-policy FILE)")
        return "signature check FAILED: " + "; ".join(self.problems)


def _parse_time(text: object) -> datetime | None:
    try:
        t = datetime.fromisoformat(str(text))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def _verifies(bundle: OpenedBundle, public_pem: str) -> bool:
    """A signature check that treats an unreadable or unsupported public key as a failed check."""
    try:
        return check_signature(bundle, public_pem)
    except (ValueError, TypeError, InputError):
        return False


def time_problem(trusted: TrustedKey, predicate: object, signer: str) -> str | None:
    """The key must have been valid when it signed (predicate.signedAt, the signer's clock)."""
    signed_at = _parse_time(predicate.get("signedAt") if isinstance(predicate, dict) else None)
    if signed_at is None:
        return "the statement carries no signing time (predicate.signedAt)"
    if trusted.expires_at and signed_at > trusted.expires_at.astimezone(UTC):
        return f"key {signer} expired at {trusted.expires_at.isoformat()} but signed at {signed_at.isoformat()}"
    if trusted.not_before and signed_at < trusted.not_before.astimezone(UTC):
        return f"key {signer} is valid from {trusted.not_before.isoformat()} but signed at {signed_at.isoformat()}"
    return None


def _subject_problem(build: PublishedBuild, subject: object) -> str | None:
    """The statement's subject must be this build's manifest, at this location (its store key: a signed build copied
    to another key, model or build id is not the build that was signed), with the sha256 the store holds now."""
    subjects = [x for x in subject if isinstance(x, dict)] if isinstance(subject, list) else []
    digests = sorted(str(x["digest"].get("sha256")) for x in subjects if isinstance(x.get("digest"), dict))
    names = [shown(str(x.get("name")), 160) for x in subjects]
    if any(x.get("name") == build.manifest_key and isinstance(x.get("digest"), dict)
           and x["digest"].get("sha256") == build.manifest_sha256 for x in subjects):
        return None
    if build.manifest_sha256 in digests:
        return (f"relocated: the statement was signed for {', '.join(names) or '(no name)'}, not for "
                f"{build.manifest_key} (a signed build copied to another location is not the build that was signed)")
    if build.manifest_key in names:
        return (f"manifest changed after signing: {build.manifest_key} has sha256 {build.manifest_sha256[:16]}…, "
                f"the signed subject is {(digests or ['(none)'])[0][:16]}…")
    return (f"statement belongs to another build: its subject is {', '.join(names) or '(none)'}, "
            f"not {build.manifest_key}")


def _check_entry(store: Store, build: PublishedBuild, entry: IndexEntry, index: AttestationIndex,
                 policy: TrustPolicy) -> Check:
    kind = entry.kind

    def fail(cause: str, signer: str = "") -> Check:
        return Check(kind=kind, ok=False, cause=f"{kind}: {cause}", signer=signer, sha256=entry.sha256)
    try:
        size = store.size(blob_key(entry.sha256))
        if size is None:
            return fail(f"attestation missing: {store.url(blob_key(entry.sha256))} does not exist")
        if size > MAX_BUNDLE_BYTES:
            return fail(f"attestation object is {size} bytes: not a signed statement (at most {MAX_BUNDLE_BYTES})")
        data = store.read_bytes(blob_key(entry.sha256))
    except StoreError as err:
        return fail(f"attestation unreadable ({err})")
    if hashlib.sha256(data).hexdigest() != entry.sha256:
        return fail("attestation object replaced: its bytes differ from the digest in the index")
    try:
        bundle = open_bundle(data)
    except SignatureError as err:
        return fail(f"not a valid signed statement ({err})")
    if bundle.statement.get("predicateType") != KINDS[kind]:
        return fail(f"predicate type is {bundle.statement.get('predicateType')!r}, not {KINDS[kind]}")
    kids = [k for k, _ in bundle.signatures]
    trusted = next((t for k in kids if (t := policy.find(k)) is not None), None)
    if trusted is None:  # a bundle without key ids (model_signing leaves keyid empty): try each trusted key
        trusted = next((t for t in policy.keys if _verifies(bundle, t.public_key)), None)
    if trusted is None and policy.keys:
        return fail(f"signed by unknown key {', '.join(shown(k[:16]) for k in kids if k) or '(no key id)'} "
                    f"({shown(index.signer.identity)}): {UNTRUSTED_SIGNER}")
    public = trusted.public_key if trusted else index.signer.public_key
    signer = trusted.label() if trusted else index.signer.identity
    if not public:  # a certificate or keyless signer: its index carries no key to check the statement with
        return fail(f"signed by {signer}, whose index names no public key: give the signer's key with "
                    "--trusted-key PUB (or --trust-policy FILE) to check it", signer)
    if not _verifies(bundle, public):
        return fail(f"signature does not verify with {signer}: the statement was altered after signing", signer)
    problem = (time_problem(trusted, bundle.statement.get("predicate"), signer) if trusted else None) or \
        _subject_problem(build, bundle.statement.get("subject"))
    if problem:
        return fail(problem, signer)
    predicate = bundle.statement.get("predicate")
    predicate = predicate if isinstance(predicate, dict) else {}
    when = _parse_time(predicate.get("signedAt"))
    result = predicate.get("result") if kind == "gate" else None
    return Check(kind=kind, ok=True, signer=signer, sha256=entry.sha256,
                 signed_at=when.isoformat() if when else "", result=result if result in ("PASSED", "FAILED") else "")


def verify_attestations(store: Store, build: PublishedBuild, policy: TrustPolicy) -> SignatureVerdict:
    """Check a build's attestations against a trust policy (reads a few KiB; never a blob of the build)."""
    verdict = SignatureVerdict(uri=build.uri, state="unsigned", required=policy.require_signature)
    try:
        index = read_index(store, build)
    except StoreError as err:
        return verdict.model_copy(update={"state": "failed", "problems": [str(err)]})
    if index is None:
        if policy.require_signature:
            verdict.problems.append(f"unsigned: no attestations at {store.url(index_key(build))}")
        return verdict
    checks = [_check_entry(store, build, e, index, policy) for e in index.attestations]
    present = {e.kind for e in index.attestations}
    checks += [Check(kind=k, ok=False, cause=f"{k}: no attestation in the index") for k in KINDS if k not in present]
    problems = [c.cause for c in checks if not c.ok]
    state = "failed" if problems else ("verified" if policy.keys else "untrusted")
    if state == "untrusted" and policy.require_signature:
        problems.append("signatures are required but no trusted key was given (--trusted-key PUB or "
                        "--trust-policy FILE)")
    signer = next((c.signer for c in checks if c.ok and state == "verified"), index.signer.identity)
    # Times and results from the signed statements themselves (the index is anyone's to write).
    ok = {c.kind: c for c in checks if c.ok}
    signed_at = next((c.signed_at for c in (ok.get("provenance"), *ok.values()) if c is not None and c.signed_at), "")
    return verdict.model_copy(update={"state": state, "signer": signer, "signed_at": signed_at,
                                      "gate_result": ok["gate"].result if "gate" in ok else "",
                                      "checks": checks, "problems": problems})


# Hooks for the publish and track stages


def sign_before_current(store: Store, signer: Signer | None,
                        progress: Callable[[str], None] = print) -> Callable[[PublishedBuild], None]:
    """The hook `publish_build` calls between writing a build's manifest and moving the pointer to it: sign the
    build with `signer` (signing.signer_from_env, loaded before the upload so a bad key fails before any byte
    moves), so that no reader ever sees it current and unsigned; or say plainly that it is published unsigned.
    A kill before the pointer moves leaves bundles and an index for a manifest nobody points at (build ids are
    never reused, so no later run reads them)."""

    def sign(build: PublishedBuild) -> None:
        if signer is None:
            progress(f"publish: UNSIGNED build {build.build_id} ({UNSIGNED_HINT})")
        else:
            attest_build(store, build, signer, progress)

    return sign


def sign_published(store: Store, model: str, key: str, build_id: str, signer: Signer | None,
                   progress: Callable[[str], None] = print) -> AttestationIndex | None:
    """Sign a build that is already in the store (tests, benchmarks; the pipeline signs before the pointer moves:
    `sign_before_current`)."""
    build = read_build(store, model, key, build_id)
    sign_before_current(store, signer, progress)(build)
    return read_index(store, build) if signer is not None else None


UNTRUSTED_SIGNER = "not among the trusted keys"


def tags_for(manifest_uri: str, endpoint_url: str | None = None, policy: TrustPolicy | None = None) -> dict[str, str]:
    """MLflow tags for a published build, read from its attestation index in the store ("unknown" when the
    store cannot be read now: registration does not fail for it). `signed` and the signer only when the
    attestations verify under `policy` (the run's: `signing.run_policy`, the spec's trusted keys else the run's own
    key): digests, signatures by a trusted key, subject, a few KiB read. A consistent signature by a key the policy
    does not trust is "untrusted: <why>", anything else "invalid: <why>", so a version page never shows a signer the
    policy does not trust, nor a forged index, as signed evidence."""
    from enginefoundry.store.verify import open_build

    policy = (policy or TrustPolicy()).model_copy(update={"require_signature": False})
    try:
        store, build = open_build(manifest_uri, endpoint_url)
        index = read_index(store, build)
        verdict = verify_attestations(store, build, policy) if index is not None else None
    except EngineFoundryError as err:
        return {TAG_SIGNATURE: f"unknown: {shown(' '.join(str(err).split()))[:200]}"}
    if verdict is not None and verdict.state != "verified":
        checks = [c for c in verdict.checks if not c.ok]
        untrusted = verdict.state == "untrusted" or (checks and all(UNTRUSTED_SIGNER in c.cause for c in checks))
        why = ("no trusted key is configured (publish.trusted_keys), so no signer is trusted"
               if verdict.state == "untrusted" else "; ".join(verdict.problems))
        return {TAG_SIGNATURE: f"{'untrusted' if untrusted else 'invalid'}: "
                               f"{shown(' '.join(why.split()))[:240]}"}
    return mlflow_tags(index, store, build)


def promotion_refusal(manifest_uri: str, policy: TrustPolicy | None = None) -> str | None:
    """Why a candidate must not be promoted on signature grounds (None: it may). Checked when signatures are
    required (--require-signature, $ENGINEFOUNDRY_REQUIRE_SIGNATURE, the trust policy) or trusted keys are
    given: then signatures that fail refuse, and an unsigned candidate refuses when signatures are required."""
    from enginefoundry.store.verify import open_build

    policy = policy or consumer_policy()
    if not policy.require_signature and not policy.keys:
        return None
    store, build = open_build(manifest_uri)
    verdict = verify_attestations(store, build, policy)
    return None if verdict.ok else f"signature: {verdict.line()}"
