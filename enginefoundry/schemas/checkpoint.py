"""A converted checkpoint's manifest (`manifests/<model>/<key>/<build-id>.json`, kind checkpoint): what a lane's
conversion made from the source, its key components and every file; units of the same variant reuse it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import ClassVar

from pydantic import Field

from enginefoundry.schemas.base import Document, WirePart
from enginefoundry.schemas.manifest import FileEntry, KeyComponents


class ConvertParams(WirePart):
    """What a lane's conversion was run with (the reference lane's below); a lane may add its own, kept as
    written."""

    dtype: str | None = None
    format: str | None = None


class CheckpointManifest(Document):
    """A converted checkpoint: its key and key components, the variant and lane that made it, the conversion's
    parameters and each file with size and sha256."""

    SCHEMA_NAME: ClassVar[str] = "checkpoint-manifest"
    MAX_BYTES: ClassVar[int] = 64 << 20

    key: str
    build_id: str | None = None
    key_components: KeyComponents
    model: str
    variant: str
    lane: str
    params: ConvertParams
    files: list[FileEntry]
    created_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    def to_json(self) -> bytes:
        return (self.model_dump_json(indent=2) + "\n").encode()
