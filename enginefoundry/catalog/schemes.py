"""One row per store URI scheme: what `publish.store`, `--store`, `toolchain.channel` and a build reference may be.

The spec's store and channel validation, the settings' relative-path resolution, lineage and the CLI's "is this a
store URI" test, the channel reader and `store.open_store` read their column here. A scheme whose objects live on
an existing kind of backend (a path on this machine; an S3-API bucket) is one row; a new kind of backend is a row
plus its `Store` class in enginefoundry/store/backends.py (`BACKENDS`) and its channel reader
(rollout/toolchain_channel.py `READERS`). tests/unit/test_catalog.py checks every kind has both.

Pure data: this module imports nothing from enginefoundry.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class SchemeKind(StrEnum):
    """Where a scheme's objects live, and so which backend serves it."""

    LOCAL = "local"  # a path on this machine: relative paths resolve against the spec's folder
    OBJECT = "object"  # scheme://bucket/key on an S3-API object store


@dataclass(frozen=True)
class StoreScheme:
    scheme: str  # "s3": the URI starts with "s3://"
    kind: SchemeKind
    store_form: str  # how a store of it is written, for messages ("s3://bucket/prefix")
    object_form: str  # how one object of it is written (a channel file), for messages

    @property
    def prefix(self) -> str:
        return f"{self.scheme}://"

    def body(self, uri: str) -> str:
        """The URI without its `scheme://`."""
        return uri.removeprefix(self.prefix)


SCHEMES: dict[str, StoreScheme] = {s.scheme: s for s in (
    StoreScheme("s3", SchemeKind.OBJECT, store_form="s3://bucket/prefix", object_form="s3://bucket/key"),
    StoreScheme("file", SchemeKind.LOCAL, store_form="file://path", object_form="file:///path"),
)}


def scheme_of(uri: str) -> StoreScheme | None:
    """The row of the scheme `uri` starts with; None for a plain path or any other scheme."""
    for row in SCHEMES.values():
        if uri.startswith(row.prefix):
            return row
    return None


def is_store_uri(uri: str) -> bool:
    return scheme_of(uri) is not None


def store_prefixes() -> tuple[str, ...]:
    return tuple(s.prefix for s in SCHEMES.values())


def store_forms() -> str:
    """"s3://bucket/prefix or file://path": the forms a store URI may take, for messages."""
    return " or ".join(s.store_form for s in SCHEMES.values())


def object_forms() -> str:
    return ", ".join(s.object_form for s in SCHEMES.values())
