"""A build's verification record (`verifications/…/<time>-<nonce>.json`): when `verify` last checked a published
build, how (sizes or a full re-hash) and what it found (store/verify.py writes and reads it)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from enginefoundry.schemas.base import Document


class VerificationRecord(Document):
    """One verification of a published build: its URI and build id, the mode, the files and bytes checked, and
    each problem found (none: `ok`)."""

    SCHEMA_NAME: ClassVar[str] = "verification"
    MAX_BYTES: ClassVar[int] = 4 << 20

    uri: str
    build_id: str
    ok: bool
    mode: str
    files: int
    bytes: int
    problems: list[str] = Field(default_factory=list)
    verified_at: str
