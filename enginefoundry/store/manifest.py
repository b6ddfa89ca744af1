"""The unit manifest: what a published build is, how it was made, and every file with its size and sha256.

A build without a manifest does not exist to readers; the manifest is written last, once, and never changed
(`manifests/<model>/<key>/<build-id>.json`). File paths are relative POSIX paths confined to the unit folder;
anything else is refused when the manifest is parsed.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from enginefoundry.confine import relative_posix
from enginefoundry.store.unit_status import UnitStatus

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
        relative_posix(path, "files[].path")
        reason = _path_refusal(path)
        if reason:
            raise ValueError(f"files[].path {reason}: {_shown(path)}")
        return path


# What a manifest path may not hold beyond `store.relative_posix`'s rules, checked before anything is written:
# C0/C1 control characters and Unicode bidirectional overrides (a newline or a terminal escape shown or written
# literally), VCS folders (a `.git/hooks/…` file runs on the next git command there: git's `verify_path`,
# read-cache.c, refuses `.git` components for the same reason), and depths and lengths no unit has (a 1000-level
# path made `Path.mkdir(parents=True)` recurse past Python's limit).
_DISPLAY_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_VCS_FOLDERS = frozenset({".git", ".hg", ".svn"})
MAX_PATH_DEPTH = 64
MAX_COMPONENT_BYTES = 255  # NAME_MAX on Linux filesystems
MAX_PATH_BYTES = 4000  # below PATH_MAX (4096) with room for the destination folder


def _path_refusal(path: str) -> str | None:
    parts = path.split("/")
    if _DISPLAY_CONTROL.search(path):
        return "contains a control character or a bidirectional override"
    if any(p.lower() in _VCS_FOLDERS for p in parts):
        return "is inside a version-control folder (.git, .hg, .svn)"
    if len(parts) > MAX_PATH_DEPTH:
        return f"has {len(parts)} components (at most {MAX_PATH_DEPTH})"
    if len(path.encode()) > MAX_PATH_BYTES or any(len(p.encode()) > MAX_COMPONENT_BYTES for p in parts):
        return f"is longer than {MAX_PATH_BYTES} bytes or has a component longer than {MAX_COMPONENT_BYTES}"
    return None


def _shown(path: str) -> str:
    """A hostile path in a one-line message: escaped (repr), at most 100 characters of it."""
    return repr(path[:100]) + ("…" if len(path) > 100 else "")


def file_list_problems(files: list[FileEntry]) -> list[str]:
    """A build's file list as a folder tree: no path twice, no path that is both a file and a folder
    (`a` and `a/b`). Empty when the list can be written as it is."""
    problems, seen = [], set()
    for entry in files:
        if entry.path in seen:
            problems.append(f"{_shown(entry.path)} is listed twice")
        seen.add(entry.path)
    folders = {"/".join(e.path.split("/")[:i]) for e in files for i in range(1, e.path.count("/") + 1)}
    problems += [f"{_shown(p)} is both a file and a folder" for p in sorted(seen & folders)]
    return problems


class InputFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str
    sha256: str = Field(pattern=SHA256_HEX)


INPUT_KINDS = ("converted-checkpoint", "reference", "sibling-reference", "spread", "simulation")
InputKind = Literal["converted-checkpoint", "reference", "sibling-reference", "spread", "simulation"]


class BuildInput(BaseModel):
    """Something a build consumed besides its named sources: a converted checkpoint, reference answers (the source's,
    a simulation's or a sibling unit's), their measured spread, a simulated model. Bound by digest in the manifest,
    which the build's signed statements cover: a signature names exactly the bytes the build was made and judged
    with, and how it came by them."""

    model_config = ConfigDict(extra="forbid")

    kind: InputKind
    key: str = Field(description="its cache key (a converted checkpoint's key, a reference's key digest, …)")
    uri: str = Field(default="", description="where it is: its manifest or document in the store, or a local folder")
    sha256: str = Field(pattern=SHA256_HEX, description="of its manifest's bytes (a converted checkpoint), its "
                        "document's bytes (answers, a spread) or its weights (a simulated model)")
    origin: Literal["computed", "store", "local cache"] = Field(
        description="computed: derived from the named sources in this run; store or local cache: reused")
    proven_by: str = Field(default="", description="a reused input of a signed build: the trusted signer whose "
                           "signature over `sha256` was checked before the build used it")
    files: list[InputFile] = Field(default_factory=list, description="a converted checkpoint's files")


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: int = MANIFEST_SCHEMA_VERSION
    key: str
    build_id: str | None = Field(default=None, description="this build of the key (None: a version 1 manifest)")
    key_components: dict[str, Any]  # JSON edge: free-form manifest field, as published
    checkpoint_key: str | None = None
    checkpoint_uri: str | None = None
    model: str
    unit: str
    lane: str
    target: dict[str, Any]  # JSON edge: free-form manifest field, as published
    variant: dict[str, Any]  # JSON edge: free-form manifest field, as published
    profile: dict[str, Any]  # JSON edge: free-form manifest field, as published
    # JSON edge: free-form manifest field, as published
    source: dict[str, Any] = Field(description="uri, kind, resolved revision, identity, digests")
    versions: dict[str, str] = Field(default_factory=dict)
    # JSON edge: free-form manifest field, as published
    device: dict[str, Any] = Field(default_factory=dict, description="what the unit was built on")
    build_params: dict[str, Any] = Field(default_factory=dict)  # JSON edge: free-form manifest field, as published
    files: list[FileEntry]
    smoke: dict[str, Any] = Field(default_factory=dict)  # JSON edge: free-form manifest field, as published
    benchmark: dict[str, Any] = Field(default_factory=dict)  # JSON edge: free-form manifest field, as published
    prompts_digest: str | None = Field(default=None, description="sha256 of the smoke prompt set that gated the unit")
    # JSON edge: free-form manifest field, as published
    gate: dict[str, Any] = Field(default_factory=dict, description="the smoke gate settings the unit was judged by")
    inputs: list[BuildInput] = Field(default_factory=list, description="what the build consumed besides its named "
                                     "sources, each bound by digest (evidence/inputs.py)")
    status: Literal[UnitStatus.CANDIDATE, UnitStatus.REJECTED] = Field(
        description="candidate | rejected (a failed unit is never published)")
    status_reason: str = ""
    mlflow_run_id: str | None = None
    prefect_flow_run_id: str | None = None
    created_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    @field_validator("files")
    @classmethod
    def _a_tree(cls, files: list[FileEntry]) -> list[FileEntry]:
        problems = file_list_problems(files)
        if problems:
            raise ValueError("files: " + "; ".join(problems[:5]))
        return files

    def to_json(self) -> bytes:
        """Serialized and checked against the committed JSON Schema: a manifest that readers in other
        languages could not trust is never written."""
        data = self.model_dump(mode="json")
        validate_against_schema(data)
        return (json.dumps(data, indent=2) + "\n").encode()


SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schemas" / "manifest.schema.json"


def generated_schema() -> dict[str, Any]:  # JSON edge: a JSON Schema document
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
# JSON edge: the committed JSON Schema document
def _committed_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())  # JSON edge: a JSON Schema document
    return schema


def validate_against_schema(data: dict[str, Any]) -> None:  # JSON edge: a manifest's JSON form
    import jsonschema

    jsonschema.validate(data, _committed_schema())
