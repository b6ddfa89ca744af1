"""The unit manifest, as the store reads and writes it. The model and its typed parts live in
`enginefoundry.schemas.manifest` (issue 35: one home for every published document); re-exported here for the
store's callers."""

from __future__ import annotations

from enginefoundry.schemas.loose import JsonSchemaDocument
from enginefoundry.schemas.manifest import (
    INPUT_KINDS,
    MANIFEST_SCHEMA_VERSION,
    MAX_COMPONENT_BYTES,
    MAX_PATH_BYTES,
    MAX_PATH_DEPTH,
    SCHEMA_PATH,
    SHA256_HEX,
    BenchPart,
    BuildInput,
    FileEntry,
    InputFile,
    InputKind,
    KeyComponents,
    Manifest,
    SmokePart,
    SourcePart,
    file_list_problems,
    validate_against_schema,
)


def generated_schema() -> JsonSchemaDocument:
    """The JSON Schema of `manifest.json`, versioned by MANIFEST_SCHEMA_VERSION. The committed copy in
    enginefoundry/schemas/ is what readers use; a test keeps the two equal."""
    return Manifest.json_schema()


__all__ = [
    "INPUT_KINDS", "MANIFEST_SCHEMA_VERSION", "MAX_COMPONENT_BYTES", "MAX_PATH_BYTES", "MAX_PATH_DEPTH", "SCHEMA_PATH",
    "SHA256_HEX", "BenchPart", "BuildInput", "FileEntry", "InputFile", "InputKind", "KeyComponents", "Manifest",
    "SmokePart", "SourcePart", "file_list_problems", "generated_schema", "validate_against_schema",
]
