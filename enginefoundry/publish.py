"""The publish protocol on a content-addressed store, like an OCI registry or git's objects
(docs/architecture.md#store-layout):

    <store>/blobs/sha256/<ab>/<digest>                 every file, written once (conditional create), never changed
    <store>/manifests/<model>/<key>/<build-id>.json    one immutable manifest per build: (path, size, sha256)
    <store>/manifests/<model>/<key>/current.json       pointer to the current build (+ its manifest's sha256),
                                                       moved only by compare-and-swap

Blobs first, manifest next, pointer last: a build nobody points at does not exist to readers, and an earlier
build stays complete after a rebuild (`--force`) moves the pointer. Converted checkpoints use the same blobs,
so a bundle that contains its checkpoint's files stores them once.

Version 1 layout (`artifacts/<model>/<key>/manifest.json` + files beside it, `checkpoints/<model>/<key>/…`)
is still read: a key published that way is a cache hit and can be verified and pulled.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from enginefoundry.errors import InputError, StoreError
from enginefoundry.identity import list_files
from enginefoundry.manifest import FileEntry, Manifest, validate_against_schema
from enginefoundry.store import Store, blob_key, relative_posix, store_key
from enginefoundry.units import key_of

LEGACY_BUILD = "legacy"
Layout = Literal["cas", "legacy"]


def _segment(value: str, what: str) -> str:
    try:
        relative_posix(value, what)
    except ValueError as err:
        raise StoreError(str(err)) from None
    if "/" in value:
        raise StoreError(f"{what}: {value!r} must be one path segment")
    return value


def manifests_prefix(model: str, key: str) -> str:
    return f"manifests/{_segment(model, 'model name')}/{_segment(key, 'key')}"


def pointer_key(model: str, key: str) -> str:
    return f"{manifests_prefix(model, key)}/current.json"


def build_manifest_key(model: str, key: str, build_id: str) -> str:
    return f"{manifests_prefix(model, key)}/{_segment(build_id, 'build id')}.json"


def new_build_id() -> str:
    """Sortable by time (UTC, microseconds), unique by a random suffix."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ") + "-" + uuid.uuid4().hex[:8]


def legacy_unit_prefix(model: str, key: str) -> str:
    return f"artifacts/{_segment(model, 'model name')}/{_segment(key, 'key')}"


def legacy_checkpoint_prefix(model: str, key: str) -> str:
    return f"checkpoints/{_segment(model, 'model name')}/{_segment(key, 'key')}"


class Pointer(BaseModel):
    build_id: str
    manifest_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    updated_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))


class CheckpointManifest(BaseModel):
    key: str
    build_id: str | None = None
    key_components: dict[str, Any]
    model: str
    variant: str
    lane: str
    params: dict[str, Any]
    files: list[FileEntry]
    created_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    def to_json(self) -> bytes:
        return (self.model_dump_json(indent=2) + "\n").encode()


class Problem(BaseModel):
    """One thing wrong with a published build, named so a person can act on it."""

    path: str  # the file's path in the unit, or "manifest"
    problem: str
    expected: str = ""
    actual: str = ""

    def line(self) -> str:
        detail = f" (expected {self.expected}, found {self.actual})" if self.expected or self.actual else ""
        return f"{self.path}: {self.problem}{detail}"


class PublishedBuild(BaseModel):
    """One build of a key as the store holds it: where its manifest is and what it lists."""

    model: str
    key: str
    build_id: str
    layout: Layout
    store_uri: str
    manifest_key: str
    manifest_sha256: str
    manifest: Manifest | None = None  # a unit
    checkpoint: CheckpointManifest | None = None  # a converted checkpoint

    @property
    def uri(self) -> str:
        return f"{self.store_uri}/{self.manifest_key}"

    @property
    def files(self) -> list[FileEntry]:
        doc = self.manifest or self.checkpoint
        return doc.files if doc else []

    @property
    def key_components(self) -> dict[str, Any]:
        doc = self.manifest or self.checkpoint
        return doc.key_components if doc else {}

    def object_key(self, entry: FileEntry) -> str:
        if self.layout == "cas":
            return blob_key(entry.sha256)
        return f"{self.manifest_key.rsplit('/', 1)[0]}/{entry.path}"


class PublishResult(BaseModel):
    uri: str  # the manifest's URI
    manifest: Manifest
    created: bool  # False when another run published this key first and we adopted its build
    bytes_uploaded: int  # bytes this publish wrote (blobs that existed already cost nothing)
    bytes_total: int = 0
    build_id: str = ""


# Reading


def _parse(store: Store, mkey: str, data: bytes, kind: Literal["unit", "checkpoint"], model: str, key: str,
           build_id: str, layout: Layout) -> PublishedBuild:
    try:
        raw = json.loads(data)
        if kind == "unit":
            if layout == "cas":
                validate_against_schema(raw)
            doc: Manifest | CheckpointManifest = Manifest.model_validate(raw)
        else:
            doc = CheckpointManifest.model_validate(raw)
    except (ValueError, ValidationError) as err:
        raise StoreError(f"{store.url(mkey)} is not a valid manifest: {' '.join(str(err).split())[:300]}") from None
    except Exception as err:  # jsonschema.ValidationError
        raise StoreError(f"{store.url(mkey)} is not a valid manifest: {' '.join(str(err).split())[:300]}") from None
    return PublishedBuild(model=model, key=key, build_id=build_id, layout=layout, store_uri=store.uri,
                          manifest_key=mkey, manifest_sha256=hashlib.sha256(data).hexdigest(),
                          manifest=doc if kind == "unit" else None,
                          checkpoint=doc if kind == "checkpoint" else None)  # type: ignore[arg-type]


def read_build(store: Store, model: str, key: str, build_id: str,
               kind: Literal["unit", "checkpoint"] = "unit") -> PublishedBuild:
    """One build by id (or LEGACY_BUILD for the version 1 layout); StoreError when absent or invalid."""
    if build_id == LEGACY_BUILD:
        prefix = legacy_unit_prefix(model, key) if kind == "unit" else legacy_checkpoint_prefix(model, key)
        mkey = f"{prefix}/manifest.json"
        return _parse(store, mkey, store.read_bytes(mkey), kind, model, key, build_id, "legacy")
    mkey = build_manifest_key(model, key, build_id)
    return _parse(store, mkey, store.read_bytes(mkey), kind, model, key, build_id, "cas")


def read_pointer(store: Store, model: str, key: str) -> tuple[Pointer, str] | None:
    got = store.read_versioned(pointer_key(model, key))
    if got is None:
        return None
    try:
        return Pointer.model_validate_json(got[0]), got[1]
    except ValidationError:
        raise StoreError(f"{store.url(pointer_key(model, key))} is not a valid build pointer") from None


def _find(store: Store, model: str, key: str, kind: Literal["unit", "checkpoint"]) -> PublishedBuild | None:
    pointer = read_pointer(store, model, key)
    if pointer is not None:
        build = read_build(store, model, key, pointer[0].build_id, kind)
        if build.manifest_sha256 != pointer[0].manifest_sha256:
            raise StoreError(f"{build.uri} was changed after it was published: sha256 {build.manifest_sha256[:12]}… "
                             f"≠ {pointer[0].manifest_sha256[:12]}… recorded in current.json")
        return build
    prefix = legacy_unit_prefix(model, key) if kind == "unit" else legacy_checkpoint_prefix(model, key)
    if store.exists(f"{prefix}/manifest.json"):
        return read_build(store, model, key, LEGACY_BUILD, kind)
    return None


def find_current(store: Store, model: str, key: str) -> PublishedBuild | None:
    """The current build of a unit key (the pointer's, else a version 1 manifest), None when unpublished.
    StoreError when what the store holds is unreadable or tampered: the caller refuses it as a hit."""
    return _find(store, model, key, "unit")


def find_checkpoint_build(store: Store, model: str, key: str) -> PublishedBuild | None:
    return _find(store, model, key, "checkpoint")


def find_checkpoint(store: Store, model: str, key: str) -> CheckpointManifest | None:
    build = find_checkpoint_build(store, model, key)
    return build.checkpoint if build else None


def is_published(store: Store, model: str, key: str) -> bool:
    """Cheap: a pointer or a version 1 manifest exists (nothing is read or checked)."""
    return store.exists(pointer_key(model, key)) or store.exists(f"{legacy_unit_prefix(model, key)}/manifest.json")


def check_hit(store: Store, build: PublishedBuild, rehash: bool = False) -> list[Problem]:
    """What must hold before a build is trusted as a cache hit: its key is the hash of its key components
    and the key of its location, and every file it lists exists with its size (with `rehash`: and its sha256).
    An empty list means trusted."""
    problems: list[Problem] = []
    doc = build.manifest or build.checkpoint
    if doc is None:
        return [Problem(path="manifest", problem="no manifest")]
    recomputed = key_of(doc.key_components)
    if doc.key != recomputed:
        problems.append(Problem(path="manifest", problem="key is not the hash of key_components",
                                expected=recomputed, actual=doc.key))
    if doc.key != build.key:
        problems.append(Problem(path="manifest", problem="key differs from the key of its location",
                                expected=build.key, actual=doc.key))
    if doc.model != build.model:
        problems.append(Problem(path="manifest", problem="model differs from the model of its location",
                                expected=build.model, actual=doc.model))
    if build.layout == "cas" and doc.build_id != build.build_id:
        problems.append(Problem(path="manifest", problem="build_id differs from its file name",
                                expected=build.build_id, actual=str(doc.build_id)))
    if build.layout == "cas":
        try:
            pointer = read_pointer(store, build.model, build.key)
        except StoreError as err:
            problems.append(Problem(path="manifest", problem=str(err)))
        else:
            if (pointer is not None and pointer[0].build_id == build.build_id
                    and pointer[0].manifest_sha256 != build.manifest_sha256):
                problems.append(Problem(path="manifest", problem="changed after it was published (sha256 recorded "
                                        "in current.json differs)", expected=pointer[0].manifest_sha256,
                                        actual=build.manifest_sha256))
    for entry in doc.files:
        problems.extend(check_file(store, build, entry, rehash))
    return problems


def check_file(store: Store, build: PublishedBuild, entry: FileEntry, rehash: bool) -> list[Problem]:
    okey = build.object_key(entry)
    try:
        size = store.size(okey)
    except StoreError as err:
        return [Problem(path=entry.path, problem=str(err))]
    if size is None:
        return [Problem(path=entry.path, problem=f"missing: {store.url(okey)} does not exist")]
    if size != entry.size:
        return [Problem(path=entry.path, problem="wrong size", expected=f"{entry.size} bytes", actual=f"{size} bytes")]
    if rehash:
        h = hashlib.sha256()
        try:
            for chunk in store.iter_bytes(okey):
                h.update(chunk)
        except StoreError as err:
            return [Problem(path=entry.path, problem=str(err))]
        if h.hexdigest() != entry.sha256:
            return [Problem(path=entry.path, problem="sha256 differs (corrupted)", expected=entry.sha256,
                            actual=h.hexdigest())]
    return []


# Writing


def upload_folders(
    store: Store, folders: dict[str, Path], progress: Callable[[str], None] = print,
) -> tuple[list[FileEntry], int, int]:
    """Every file of each folder as a blob; entries are `<name>/<relative path>`. Returns (entries, total bytes,
    bytes written): a blob that exists is not written again."""
    entries: list[FileEntry] = []
    total = written = 0
    for name, folder in folders.items():
        files = list_files(folder)
        for i, f in enumerate(files, start=1):
            put = store.put_blob(f)
            entries.append(FileEntry(path=f"{name}/{f.relative_to(folder).as_posix()}", size=put.size,
                                     sha256=put.digest, executable=bool(os.stat(f).st_mode & 0o111)))
            total += put.size
            written += put.size if put.uploaded else 0
            if put.size > 64 * 1024 * 1024 or i == len(files):
                progress(f"publish: {name}: {i}/{len(files)} files, {total / 2**20:.1f} MiB "
                         f"({written / 2**20:.1f} MiB new)")
    return entries, total, written


def _commit(store: Store, model: str, key: str, build_id: str, data: bytes, replace: bool,
            kind: Literal["unit", "checkpoint"]) -> PublishedBuild:
    """Write the build's manifest (once), then move the pointer to it by compare-and-swap. Without `replace`,
    a healthy build that another run made current first wins and is returned instead."""
    mkey = build_manifest_key(model, key, build_id)
    if not store.create_if_absent(mkey, data):
        raise StoreError(f"{store.url(mkey)} exists already: build ids must be unique")
    mine = Pointer(build_id=build_id, manifest_sha256=hashlib.sha256(data).hexdigest())
    pkey = pointer_key(model, key)
    for _ in range(50):
        current = store.read_versioned(pkey)
        if current is not None and not replace:
            try:
                winner = _find(store, model, key, kind)
                if winner is not None and not check_hit(store, winner):
                    return winner
            except StoreError:
                pass  # the current build is broken: ours replaces it
        if store.replace_if(pkey, mine.model_dump_json(indent=2).encode() + b"\n", current[1] if current else None):
            return read_build(store, model, key, build_id, kind)
    raise StoreError(f"{store.url(pkey)}: could not move the pointer (too many concurrent publishers)")


def publish_build(
    store: Store, model: str, manifest_fields: dict[str, Any], folders: dict[str, Path],
    progress: Callable[[str], None] = print, replace: bool = False,
) -> PublishResult:
    """Publish a unit: blobs, an immutable manifest (a new build id), then the pointer. `replace` (a rebuild with
    --force) makes this build current even when another is; otherwise a healthy current build is adopted."""
    entries, total, written = upload_folders(store, folders, progress)
    build_id = new_build_id()
    manifest = Manifest.model_validate({**manifest_fields, "build_id": build_id,
                                        "files": [e.model_dump() for e in entries]})
    current = _commit(store, model, manifest.key, build_id, manifest.to_json(), replace, "unit")
    assert current.manifest is not None
    return PublishResult(uri=current.uri, manifest=current.manifest, created=current.build_id == build_id,
                         bytes_uploaded=written, bytes_total=total, build_id=current.build_id)


def publish_checkpoint(
    store: Store, manifest_fields: dict[str, Any], folder: Path, progress: Callable[[str], None] = print,
) -> CheckpointManifest:
    entries, _, _ = upload_folders(store, {"checkpoint": folder}, progress)
    build_id = new_build_id()
    manifest = CheckpointManifest.model_validate({**manifest_fields, "build_id": build_id,
                                                  "files": [e.model_dump() for e in entries]})
    current = _commit(store, manifest.model, manifest.key, build_id, manifest.to_json(), False, "checkpoint")
    assert current.checkpoint is not None
    return current.checkpoint


def read_manifest(store: Store, key: str) -> Manifest:
    """A unit manifest at a store key (either layout)."""
    try:
        return Manifest.model_validate(json.loads(store.read_bytes(store_key(key))))
    except (ValueError, json.JSONDecodeError) as err:
        raise StoreError(f"{store.url(key)} is not a valid manifest: {str(err)[:200]}") from None


def locate(uri: str) -> tuple[str, str, str, str, str | None]:
    """Split a store URI of a build into (store URI, layout folder, model, key, build id or None for current).

    Accepted: `<store>/manifests/<model>/<key>[/<build-id>.json|/current.json]` and the version 1
    `<store>/artifacts/<model>/<key>[/manifest.json]` (also `checkpoints/…`)."""
    uri = uri.rstrip("/")
    for folder in ("/manifests/", "/artifacts/", "/checkpoints/"):
        root, sep, rest = uri.rpartition(folder)
        if not sep:
            continue
        parts = rest.split("/")
        if len(parts) < 2 or len(parts) > 3:
            continue
        model, key = parts[0], parts[1]
        name = parts[2] if len(parts) == 3 else None
        if folder == "/manifests/":
            build = None if name in (None, "current.json") else name.removesuffix(".json")
        else:
            if name not in (None, "manifest.json"):
                continue
            build = LEGACY_BUILD
        return root, folder.strip("/"), model, key, build
    raise InputError(f"{uri} is not the URI of a published build: expected <store>/manifests/<model>/<key>"
                     "[/<build-id>.json] (or a version 1 <store>/artifacts/<model>/<key>)")
