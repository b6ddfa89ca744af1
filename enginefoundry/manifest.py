"""`manifest.json`: what a published unit is, how it was made, and every file with its size and sha256.

A unit without a manifest does not exist to readers; the manifest is written last.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

MANIFEST_SCHEMA_VERSION = 1


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str
    size: int
    sha256: str


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: int = MANIFEST_SCHEMA_VERSION
    key: str
    key_components: dict[str, Any]
    checkpoint_key: str | None = None
    model: str
    unit: str
    lane: str
    target: dict[str, Any]
    variant: dict[str, Any]
    profile: dict[str, Any]
    source: dict[str, Any] = Field(description="uri, kind, resolved revision, identity, digests")
    versions: dict[str, str] = Field(default_factory=dict)
    device: dict[str, Any] = Field(default_factory=dict, description="what the unit was built on")
    build_params: dict[str, Any] = Field(default_factory=dict)
    files: list[FileEntry]
    smoke: dict[str, Any] = Field(default_factory=dict)
    benchmark: dict[str, Any] = Field(default_factory=dict)
    status: str = Field(description="candidate | rejected")
    status_reason: str = ""
    mlflow_run_id: str | None = None
    prefect_flow_run_id: str | None = None
    created_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    def to_json(self) -> bytes:
        return (self.model_dump_json(indent=2) + "\n").encode()
