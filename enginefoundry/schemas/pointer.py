"""A unit or checkpoint key's build pointer (`manifests/<model>/<key>/current.json`): which build is current, the
sha256 of its manifest's bytes, and every build that was current before it (store/publish.py moves it)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import ClassVar

from pydantic import BaseModel, Field

from enginefoundry.schemas.base import Document

SHA256_HEX = r"^[0-9a-f]{64}$"


class BuildAnchor(BaseModel):
    """A build and the sha256 of its manifest's bytes, as recorded when it was made current."""

    build_id: str
    manifest_sha256: str = Field(pattern=SHA256_HEX)


class Pointer(Document):
    """The current build of a key: its id, its manifest's sha256 (a reader refuses a manifest whose bytes differ)
    and the builds current before it, oldest first."""

    SCHEMA_NAME: ClassVar[str] = "pointer"
    MAX_BYTES: ClassVar[int] = 4 << 20

    build_id: str
    manifest_sha256: str = Field(pattern=SHA256_HEX)
    updated_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    history: list[BuildAnchor] = Field(default_factory=list, description="every build that was current before "
                                       "this one, oldest first: a build that `rollback` may restore stays anchored")

    def anchor_of(self, build_id: str) -> str | None:
        """The manifest digest recorded for a build of this key (current or earlier); None when none is."""
        if build_id == self.build_id:
            return self.manifest_sha256
        return next((a.manifest_sha256 for a in reversed(self.history) if a.build_id == build_id), None)

    def moved_to(self, build_id: str, manifest_sha256: str) -> Pointer:
        return Pointer(build_id=build_id, manifest_sha256=manifest_sha256,
                       history=[*self.history, BuildAnchor(build_id=self.build_id,
                                                           manifest_sha256=self.manifest_sha256)])
