"""The documents enginefoundry persists or exchanges, typed, in one home (issue 35).

Every document that leaves a process (the manifest and its parts, bundle info, leases, the attestation index, the
toolchain channel, pending records, reference sets, search results) is a pydantic model in this package with its
`schema_version`, and its JSON Schema is generated beside it (`*.schema.json`; a unit test keeps them equal). Readers
decide on fields, never on strings looked up in a dict. `loose` names the few loose types that remain (a third
party's free-form JSON), so that they can be counted.

Adding a document: a `Document` subclass (schemas/base.py) in a module of this package, with its SCHEMA_NAME and
SCHEMA_VERSION; readers parse hostile bytes with `Document.parse` (bounded: size, depth, digits); then run
`python scripts/gen_docs.py`, which finds it and writes `<SCHEMA_NAME>.schema.json` (tests/unit/test_docs.py fails,
naming that command, while a schema is stale or missing). A part of a signed document that must be written back
byte for byte as read (the manifest's) is a `WirePart`.

`recorded-db/` holds the recorded database schemas of the MLflow and Prefect releases in use (records/db_templates.py;
not a Python package, so its name is not an identifier and setuptools treats it as package data).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from enginefoundry._face import lazy_face

if TYPE_CHECKING:
    from enginefoundry.schemas.attestation_index import AttestationIndex
    from enginefoundry.schemas.base import Document, DocumentError, WirePart, parse_json
    from enginefoundry.schemas.bundle_info import BundleInfo
    from enginefoundry.schemas.channel import ChannelDocument
    from enginefoundry.schemas.checkpoint import CheckpointManifest
    from enginefoundry.schemas.lease import BrokenLeaseNote, LeaseRecord
    from enginefoundry.schemas.manifest import KeyComponents, Manifest
    from enginefoundry.schemas.outcome import UnitOutcome
    from enginefoundry.schemas.pointer import Pointer
    from enginefoundry.schemas.verification import VerificationRecord

__all__ = [
    "AttestationIndex", "BrokenLeaseNote", "BundleInfo", "ChannelDocument", "CheckpointManifest", "Document",
    "DocumentError", "KeyComponents", "LeaseRecord", "Manifest", "Pointer", "UnitOutcome", "VerificationRecord",
    "WirePart", "parse_json",
]

__getattr__, __dir__ = lazy_face(__name__)
