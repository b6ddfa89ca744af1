"""The unit manifest: what a published build is, how it was made, and every file with its size and sha256.

A build without a manifest does not exist to readers; the manifest is written last, once, and never changed
(`manifests/<model>/<key>/<build-id>.json`). File paths are relative POSIX paths confined to the unit folder;
anything else is refused when the manifest is parsed.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from enginefoundry.store import relative_posix
from enginefoundry.unit_status import UnitStatus

# 2: content-addressed layout (build_id, FileEntry.executable). Version 1 manifests (artifacts/<model>/<key>/
# manifest.json) are still read.
MANIFEST_SCHEMA_VERSION = 2
SHA256_HEX = r"^[0-9a-f]{64}$"


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="relative POSIX path inside the unit: no '..', no absolute, no backslash")
    size: int = Field(ge=0)
    sha256: str = Field(pattern=SHA256_HEX, description="the file's content digest; also its blob name")
    executable: bool = False

    @field_validator("path")
    @classmethod
    def _confined(cls, path: str) -> str:
        return relative_posix(path, "files[].path")


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: int = MANIFEST_SCHEMA_VERSION
    key: str
    build_id: str | None = Field(default=None, description="this build of the key (None: a version 1 manifest)")
    key_components: dict[str, Any]
    checkpoint_key: str | None = None
    checkpoint_uri: str | None = None
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
    prompts_digest: str | None = Field(default=None, description="sha256 of the smoke prompt set that gated the unit")
    gate: dict[str, Any] = Field(default_factory=dict, description="the smoke gate settings the unit was judged by")
    status: Literal[UnitStatus.CANDIDATE, UnitStatus.REJECTED] = Field(
        description="candidate | rejected (a failed unit is never published)")
    status_reason: str = ""
    mlflow_run_id: str | None = None
    prefect_flow_run_id: str | None = None
    created_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    def to_json(self) -> bytes:
        """Serialized and checked against the committed JSON Schema: a manifest that readers in other
        languages could not trust is never written."""
        data = self.model_dump(mode="json")
        validate_against_schema(data)
        return (json.dumps(data, indent=2) + "\n").encode()


SCHEMA_PATH = Path(__file__).with_name("schemas") / "manifest.schema.json"


def generated_schema() -> dict[str, Any]:
    """The JSON Schema of `manifest.json`, versioned by MANIFEST_SCHEMA_VERSION. The committed copy in
    enginefoundry/schemas/ is what readers use; a test keeps the two equal."""
    schema = Manifest.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://enginefoundry.dev/schemas/manifest-v{MANIFEST_SCHEMA_VERSION}.json"
    schema["description"] = (
        "A published enginefoundry unit: its cache key and every key component, source identity, tool "
        "versions, the device it was built on, build parameters, each file with size and sha256, smoke and "
        "benchmark summaries, status, and the MLflow/Prefect runs that produced it."
    )
    return schema


@cache
def _committed_schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())


def validate_against_schema(data: dict[str, Any]) -> None:
    import jsonschema

    jsonschema.validate(data, _committed_schema())
