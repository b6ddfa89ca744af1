"""Inputs a build reuses from the store, proven before a signed build consumes them (docs/architecture.md, signed
evidence; DESIGN §10).

A build consumes more than its named sources: a converted checkpoint published by an earlier run, reference answers
and their spread cached in the store, a sibling unit's served answers. Whoever can write the store can replace any
of them, and rewrite every manifest, pointer and digest beside them to match: a check of bytes against a manifest
the same writer controls proves nothing. What proves an input is a signature by a trusted key over its digest, or
having derived it from the named sources in this run. So a run that signs its build (`InputTrust.required`):

* uses an input from the store only when a trusted key signed its digest (`proven`): a statement by that key
  whose subject is the input's kind and key with that sha256 (the manifest of a converted checkpoint, whose files
  are then pulled and checked against it; the bytes of a reference or spread document);
* computes any other input again from the named sources, publishes what it computed and signs it (`attest`), so
  the next run reuses it;
* binds every input in the unit's manifest by digest (store.manifest.BuildInput): the build's signed provenance
  names exactly what it was made and judged with, and whose signature proved each reused one.

Trusted here: the spec's trusted keys (publish.trusted_keys, publish.trust_policy), else the signer's own key. A
statement is stored at `input-attestations/<kind>/<key>/<key id>/<its sha256>.json` (store.layout), written once;
a writer can add statements there but cannot make one verify under a trusted key. A run without a signing key
publishes unsigned builds and keeps the store's inputs as before (recorded in the manifest, not proven).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from enginefoundry.errors import StoreError
from enginefoundry.evidence.attest import time_problem
from enginefoundry.evidence.signing import (
    ENV_SIGNER_NAME,
    STATEMENT_TYPE,
    SignatureError,
    Signer,
    TrustedKey,
    check_signature,
    open_bundle,
    run_policy,
    sign_statement,
    signer_from_env,
)
from enginefoundry.schemas.loose import InTotoStatement
from enginefoundry.store.backends import Store
from enginefoundry.store.layout import input_attestations_prefix
from enginefoundry.store.manifest import BuildInput, InputKind

if TYPE_CHECKING:
    from enginefoundry.spec import BuildSpec

INPUT_PREDICATE = "https://enginefoundry.dev/attestation/build-input/v1"
MAX_STATEMENT_BYTES = 64 << 10  # a statement over one input is well under 1 KiB
MAX_STATEMENTS = 32  # read per key id and input: a writer can add statements, not make more than these be read
_NAME = re.compile(r"^[0-9a-f]{64}\.json$")


def _subject(kind: str, key: str) -> str:
    return f"{kind}:{key}"


class InputTrust:
    """What a run accepts from the store and what it consumed. `required` (the run signs its build): an input from
    the store must be `proven`, else it is computed again. `consumed`: every input the run used, in order."""

    def __init__(self, signer: Signer | None = None, keys: list[TrustedKey] | None = None,
                 progress: Callable[[str], None] = lambda _: None) -> None:
        self.signer = signer
        self.keys = list(keys or [])
        self.progress = progress
        self.consumed: list[BuildInput] = []
        self.refusals: list[str] = []

    @classmethod
    def of_run(cls, spec: BuildSpec | None = None, progress: Callable[[str], None] = lambda _: None) -> InputTrust:
        """The trust of the run in this process: its signer ($ENGINEFOUNDRY_SIGNING_KEY…, None: unsigned) and the keys
        whose signatures prove an input (the spec's trusted keys, else the signer's own public key)."""
        signer = signer_from_env()
        if signer is None:
            return cls(progress=progress)
        own = signer.public_pem()
        keys = run_policy(spec, signer).keys if spec is not None else (
            [TrustedKey(name=os.environ.get(ENV_SIGNER_NAME) or "", public_key=own)] if own else [])
        return cls(signer, keys, progress)

    @property
    def required(self) -> bool:
        return self.signer is not None

    def record(self, entry: BuildInput) -> BuildInput:
        if entry not in self.consumed:
            self.consumed.append(entry)
        return entry

    def refuse(self, what: str, why: str) -> None:
        """Say (and remember) that an input from the store was not used."""
        line = f"{what} refused: {why}"
        self.refusals.append(line)
        self.progress(line)

    # Proof

    def proven(self, store: Store, kind: InputKind, key: str) -> dict[str, str]:
        """Every sha256 of (kind, key) that a trusted key signed, with that key's label. Reads at most
        MAX_STATEMENTS small statements per trusted key; a statement that does not check is skipped."""
        found: dict[str, str] = {}
        for trusted in self.keys:
            kid = trusted.key_id
            try:
                names = store.list(input_attestations_prefix(kind, key, kid))
            except StoreError:
                continue
            for name in [n for n in names if _NAME.match(n.rsplit("/", 1)[-1])][:MAX_STATEMENTS]:
                digest = _checked(store, name, kind, key, trusted)
                if digest is not None:
                    found.setdefault(digest, trusted.label())
        return found

    def attest(self, store: Store, kind: InputKind, key: str, sha256: str, uri: str = "") -> None:
        """Sign (kind, key, sha256) with the run's signer and store the statement (no-op without a signer)."""
        if self.signer is None:
            return
        predicate = {"kind": kind, "key": key, "uri": uri,
                     "signedAt": datetime.now(UTC).isoformat(timespec="seconds")}
        statement = {"_type": STATEMENT_TYPE, "subject": [{"name": _subject(kind, key), "digest": {"sha256": sha256}}],
                     "predicateType": INPUT_PREDICATE, "predicate": predicate}
        data = sign_statement(statement, self.signer)
        name = f"{input_attestations_prefix(kind, key, self.signer.key_id)}{hashlib.sha256(data).hexdigest()}.json"
        store.create_if_absent(name, data)


def _checked(store: Store, name: str, kind: str, key: str, trusted: TrustedKey) -> str | None:
    """The sha256 a stored statement signs for (kind, key) when it is `trusted`'s valid signature, else None."""
    try:
        size = store.size(name)
        if size is None or size > MAX_STATEMENT_BYTES:
            return None
        data = store.read_bytes(name)
    except StoreError:
        return None
    if hashlib.sha256(data).hexdigest() != name.rsplit("/", 1)[-1].removesuffix(".json"):
        return None  # replaced after it was written
    try:
        bundle = open_bundle(data)
        verified = check_signature(bundle, trusted.public_key)
    except (SignatureError, ValueError, TypeError):
        return None
    statement: InTotoStatement = bundle.statement
    if not verified or statement.get("predicateType") != INPUT_PREDICATE:
        return None
    predicate = statement.get("predicate")
    if not isinstance(predicate, dict) or predicate.get("kind") != kind or predicate.get("key") != key:
        return None
    if time_problem(trusted, predicate, trusted.label()) is not None:
        return None
    subjects = statement.get("subject")
    for s in subjects if isinstance(subjects, list) else []:
        digest = s.get("digest") if isinstance(s, dict) else None
        if s.get("name") == _subject(kind, key) and isinstance(digest, dict):
            value = digest.get("sha256")
            if isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value):
                return value
    return None
