"""The per-build attestation index: `<store>/attestations/<model>/<key>/<build-id>.json` (enginefoundry.evidence).

Written once by the publishing signer, read by every verifier from a store that anyone with write access can fill:
read through `AttestationIndex.parse` (bounded), never `json.loads`.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, Field

from enginefoundry.schemas.base import Document

Kind = Literal["provenance", "gate", "benchmark"]
"""The statements signed per build: SLSA provenance, the smoke gate's test result, the benchmark."""


class IndexEntry(BaseModel):
    """One signed statement: its kind and predicate type, and the content address of its Sigstore bundle."""

    kind: Kind
    predicate_type: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int


class SignerInfo(BaseModel):
    """Who signed: as consumers are shown it, the key's id, and the PEM public key (integrity without a policy)."""

    identity: str
    key_id: str
    public_key: str | None = None


class AttestationIndex(Document):
    """The index of one published build's signed statements; its subject is the build's manifest digest."""

    SCHEMA_NAME: ClassVar[str] = "attestation-index"
    SCHEMA_VERSION: ClassVar[int] = 1
    MAX_BYTES: ClassVar[int] = 4 << 20  # a few KiB; an index naming a model blob is refused unread

    schema_version: int = 1
    manifest_key: str
    manifest_sha256: str
    signer: SignerInfo
    signed_at: str
    attestations: list[IndexEntry]
