"""The publish protocol on a content-addressed store, like an OCI registry or git's objects
(docs/architecture.md#store-layout):

    <store>/blobs/sha256/<ab>/<digest>                 every file, written once (conditional create), never changed
    <store>/manifests/<model>/<key>/<build-id>.json    one immutable manifest per build: (path, size, sha256)
    <store>/manifests/<model>/<key>/current.json       pointer to the current build (+ its manifest's sha256),
                                                       moved only by compare-and-swap

Blobs first, manifest next, its signed attestations (enginefoundry.evidence.attest) after it, pointer last: a build
nobody points at does not exist to readers, a current build is never unsigned when a key is configured, and an earlier
build stays complete after a rebuild (`--force`) moves the pointer. Converted checkpoints use the same blobs,
so a bundle that contains its checkpoint's files stores them once.

Version 1 layout (`artifacts/<model>/<key>/manifest.json` + files beside it, `checkpoints/<model>/<key>/…`)
is still read: a key published that way is a cache hit and can be verified and pulled.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from enginefoundry.errors import InputError, StoreError
from enginefoundry.identity import list_files, sha256_json
from enginefoundry.schemas.base import DocumentError, parse_json
from enginefoundry.schemas.checkpoint import CheckpointManifest
from enginefoundry.schemas.pointer import Pointer
from enginefoundry.store.backends import CorruptObject, Store, store_key
from enginefoundry.store.layout import (
    BUILD_URI_SHAPE,
    LEGACY_URI_SHAPE,
    MANIFESTS,
    POINTER_NAME,
    blob_key,
    build_manifest_key,
    legacy_checkpoint_prefix,
    legacy_manifest_key,
    legacy_unit_prefix,
    pointer_key,
    split_build_uri,
)
from enginefoundry.store.manifest import FileEntry, Manifest, validate_against_schema

LEGACY_BUILD = "legacy"
Layout = Literal["cas", "legacy"]


def new_build_id() -> str:
    """Sortable by time (UTC, microseconds), unique by a random suffix."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ") + "-" + uuid.uuid4().hex[:8]


class Problem(BaseModel):
    """One thing wrong with a published build, named so a person can act on it."""

    path: str  # the file's path in the unit, or "manifest"
    problem: str
    expected: str = ""
    actual: str = ""
    corrupt: bool = False  # the object under the file's name holds other bytes (or is no regular file): quarantine it

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
    anchor_sha256: str | None = None  # the manifest digest recorded where this build was referenced from
    anchor_source: str = ""  # that reference (a registry version, an MLflow run), for messages

    @property
    def uri(self) -> str:
        return f"{self.store_uri}/{self.manifest_key}"

    @property
    def files(self) -> list[FileEntry]:
        doc = self.manifest or self.checkpoint
        return doc.files if doc else []

    @property
    def key_components(self) -> dict[str, Any]:  # JSON edge: the key components as hashed (build.units.key_of)
        doc = self.manifest or self.checkpoint
        return doc.key_components.as_json() if doc else {}

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
    manifest_sha256: str = ""  # of the current build's manifest bytes: recorded on the MLflow run and version
    quarantined: list[str] = Field(default_factory=list, description="corrupt blobs moved aside, then written afresh")


# Reading


def _parse(store: Store, mkey: str, data: bytes, kind: Literal["unit", "checkpoint"], model: str, key: str,
           build_id: str, layout: Layout) -> PublishedBuild:
    unit: Manifest | None = None
    checkpoint: CheckpointManifest | None = None
    try:
        raw = parse_json(data, what=store.url(mkey), max_bytes=Manifest.MAX_BYTES)
        if kind == "unit":
            if layout == "cas":
                validate_against_schema(raw)
            unit = Manifest.model_validate(raw)
        else:
            checkpoint = CheckpointManifest.model_validate(raw)
    except (ValueError, ValidationError) as err:
        raise StoreError(f"{store.url(mkey)} is not a valid manifest: {' '.join(str(err).split())[:300]}") from None
    except Exception as err:  # jsonschema.ValidationError
        raise StoreError(f"{store.url(mkey)} is not a valid manifest: {' '.join(str(err).split())[:300]}") from None
    return PublishedBuild(model=model, key=key, build_id=build_id, layout=layout, store_uri=store.uri,
                          manifest_key=mkey, manifest_sha256=hashlib.sha256(data).hexdigest(),
                          manifest=unit, checkpoint=checkpoint)


def read_build(store: Store, model: str, key: str, build_id: str,
               kind: Literal["unit", "checkpoint"] = "unit") -> PublishedBuild:
    """One build by id (or LEGACY_BUILD for the version 1 layout); StoreError when absent or invalid."""
    if build_id == LEGACY_BUILD:
        prefix = legacy_unit_prefix(model, key) if kind == "unit" else legacy_checkpoint_prefix(model, key)
        mkey = legacy_manifest_key(prefix)
        return _parse(store, mkey, store.read_bytes(mkey), kind, model, key, build_id, "legacy")
    mkey = build_manifest_key(model, key, build_id)
    return _parse(store, mkey, store.read_bytes(mkey), kind, model, key, build_id, "cas")


def read_pointer(store: Store, model: str, key: str) -> tuple[Pointer, str] | None:
    got = store.read_versioned(pointer_key(model, key))
    if got is None:
        return None
    try:
        return Pointer.parse(got[0], what=store.url(pointer_key(model, key))), got[1]
    except DocumentError as err:
        raise StoreError(f"{store.url(pointer_key(model, key))} is not a valid build pointer ({err})") from None


def _find(store: Store, model: str, key: str, kind: Literal["unit", "checkpoint"]) -> PublishedBuild | None:
    pointer = read_pointer(store, model, key)
    if pointer is not None:
        build = read_build(store, model, key, pointer[0].build_id, kind)
        if build.manifest_sha256 != pointer[0].manifest_sha256:
            raise StoreError(f"{build.uri} was changed after it was published: sha256 {build.manifest_sha256[:12]}… "
                             f"≠ {pointer[0].manifest_sha256[:12]}… recorded in {POINTER_NAME}")
        return build
    prefix = legacy_unit_prefix(model, key) if kind == "unit" else legacy_checkpoint_prefix(model, key)
    if store.exists(legacy_manifest_key(prefix)):
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
    return store.exists(pointer_key(model, key)) or store.exists(legacy_manifest_key(legacy_unit_prefix(model, key)))


def check_hit(store: Store, build: PublishedBuild, rehash: bool = False) -> list[Problem]:
    """What must hold before a build is trusted as a cache hit: its key is the hash of its key components
    and the key of its location, and every file it lists exists with its size (with `rehash`: and its sha256).
    An empty list means trusted."""
    problems: list[Problem] = []
    doc = build.manifest or build.checkpoint
    if doc is None:
        return [Problem(path="manifest", problem="no manifest")]
    recomputed = sha256_json(build.key_components)  # the unit key (build.units.key_of) of its components
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
    problems.extend(anchor_problems(store, build))
    for entry in doc.files:
        problems.extend(check_file(store, build, entry, rehash))
    return problems


def anchor_problems(store: Store, build: PublishedBuild) -> list[Problem]:
    """The manifest's bytes against every digest recorded for this build: the key's pointer (current.json, whose
    history keeps every build that was ever current) and the reference the build was reached through
    (`anchor_sha256`: a registry version's or an MLflow run's tag). A content-addressed build that nothing
    anchors cannot be checked and is not trusted; version 1 manifests predate anchors."""
    if build.layout != "cas":
        return []
    try:
        pointer = read_pointer(store, build.model, build.key)
    except StoreError as err:
        return [Problem(path="manifest", problem=str(err))]
    recorded = [(where, sha) for where, sha in ((store.url(pointer_key(build.model, build.key)),
                                                 pointer[0].anchor_of(build.build_id) if pointer else None),
                                                (build.anchor_source, build.anchor_sha256)) if sha]
    if not recorded:
        return [Problem(path="manifest", problem="not anchored: no digest of this build's manifest is recorded (it "
                        "was never the current build, or stopped being current before digests were recorded), so "
                        "its manifest cannot be checked; publish the unit again with `enginefoundry run SPEC "
                        "--force`")]
    return [Problem(path="manifest", problem=f"changed after it was published (sha256 recorded in {where} differs)",
                    expected=sha, actual=build.manifest_sha256) for where, sha in recorded
            if sha != build.manifest_sha256]


WRONG_SIZE = "wrong size"  # a size the manifest claims: evidence only when the manifest itself checks out


def check_file(store: Store, build: PublishedBuild, entry: FileEntry, rehash: bool) -> list[Problem]:
    okey = build.object_key(entry)
    try:
        size = store.size(okey)
    except CorruptObject as err:
        return [Problem(path=entry.path, problem=str(err), corrupt=True)]
    except StoreError as err:
        return [Problem(path=entry.path, problem=str(err))]
    if size is None:
        return [Problem(path=entry.path, problem=f"missing: {store.url(okey)} does not exist")]
    if size != entry.size:
        return [Problem(path=entry.path, problem=WRONG_SIZE, expected=f"{entry.size} bytes", actual=f"{size} bytes",
                        corrupt=True)]
    if rehash:
        h = hashlib.sha256()
        try:
            for chunk in store.iter_bytes(okey):
                h.update(chunk)
        except StoreError as err:
            return [Problem(path=entry.path, problem=str(err))]
        if h.hexdigest() != entry.sha256:
            return [Problem(path=entry.path, problem="sha256 differs (corrupted)", expected=entry.sha256,
                            actual=h.hexdigest(), corrupt=True)]
    return []


def quarantine_problems(store: Store, build: PublishedBuild, problems: list[Problem]) -> list[str]:
    """Move aside every object of `build` that a check found corrupt (`Store.quarantine`), so that the next
    publish of those bytes writes fresh ones and every build that lists them is whole again. The URLs of what
    was moved; a store this credential cannot write to moves nothing (the caller's refusal stands). A blob is named
    by its digest and shared by every build that lists those bytes, so a size is evidence only from a manifest with
    no problem of its own (consistent, and anchored to the digest recorded for it): an edited or unanchored manifest
    moves aside only objects corrupt by themselves (bytes that do not hash to their name, a link in place of a blob)."""
    trusted = not any(p.path == "manifest" for p in problems)
    by_path = {e.path: e for e in build.files}
    moved = []
    for p in problems:
        if p.corrupt and p.path in by_path and (trusted or p.problem != WRONG_SIZE):
            try:
                dest = store.quarantine(build.object_key(by_path[p.path]))
            except (StoreError, OSError):
                continue
            if dest is not None:
                moved.append(store.url(dest))
    return moved


# Writing


def upload_folders(
    store: Store, folders: dict[str, Path], progress: Callable[[str], None] = print, verify_existing: bool = False,
    quarantined: list[str] | None = None,
) -> tuple[list[FileEntry], int, int]:
    """Every file of each folder as a blob; entries are `<name>/<relative path>`. Returns (entries, total bytes,
    bytes written): a blob that exists is not written again (with `verify_existing` it is re-hashed first, and a
    corrupt one is quarantined and written afresh: its URL goes to `quarantined`)."""
    entries: list[FileEntry] = []
    total = written = 0
    for name, folder in folders.items():
        files = list_files(folder)
        for i, f in enumerate(files, start=1):
            put = store.put_blob(f, verify_existing=verify_existing)
            if put.quarantined:
                progress(f"publish: {put.digest[:12]} was corrupt in the store: quarantined to {put.quarantined}, "
                         "written afresh")
                if quarantined is not None:
                    quarantined.append(put.quarantined)
            entries.append(FileEntry(path=f"{name}/{f.relative_to(folder).as_posix()}", size=put.size,
                                     sha256=put.digest, executable=bool(os.stat(f).st_mode & 0o111)))
            total += put.size
            written += put.size if put.uploaded else 0
            if put.size > 64 * 1024 * 1024 or i == len(files):
                progress(f"publish: {name}: {i}/{len(files)} files, {total / 2**20:.1f} MiB "
                         f"({written / 2**20:.1f} MiB new)")
    return entries, total, written


def current_build_id(store: Store, model: str, key: str) -> str:
    """The build id the key's pointer names now ("" when none, or unreadable): what a publish `replaces`."""
    try:
        pointer = read_pointer(store, model, key)
    except StoreError:
        return ""
    return pointer[0].build_id if pointer else ""


def _moved_pointer(current: tuple[bytes, str] | None, build_id: str, digest: str) -> Pointer:
    """The pointer to this build, carrying the earlier builds' anchors forward (an unreadable pointer has none)."""
    try:
        return Pointer.parse(current[0]).moved_to(build_id, digest) if current else Pointer(
            build_id=build_id, manifest_sha256=digest)
    except DocumentError:
        return Pointer(build_id=build_id, manifest_sha256=digest)


@dataclass(frozen=True)
class PublishOptions:
    """How a publish meets the builds already there. `replace` (a rebuild with --force) makes this build current
    even when another is; otherwise a healthy current build is adopted (with `replaces`, the build id that was
    current when this build was decided on, "" for none, only one that another run made current since then).
    `verify_blobs` re-hashes every blob that exists already and quarantines a corrupt one (`--force`);
    `before_current` runs on the new build after its manifest is written and before the pointer moves."""

    replace: bool = False
    replaces: str | None = None
    verify_blobs: bool = False
    before_current: Callable[[PublishedBuild], None] | None = None


@dataclass(frozen=True)
class _Written:
    """A build about to be committed: where its manifest goes (model, key, build id, kind) and its bytes."""

    model: str
    key: str
    build_id: str
    data: bytes
    kind: Literal["unit", "checkpoint"]


def _commit(store: Store, build: _Written, options: PublishOptions) -> PublishedBuild:
    """Write the build's manifest (once), call `before_current` on the written build (signing: a build is never
    current unsigned; killed here, it is a manifest nobody points at), then move the pointer to it by
    compare-and-swap; the pointer keeps every earlier build's manifest digest in its history. Without
    `replace`, a healthy build that another run made current first wins and is returned instead; with `replaces`
    (the build id that was current when this build was decided on, "" for none) only one that another run made
    current since then: the build this run refused is never adopted back."""
    mkey = build_manifest_key(build.model, build.key, build.build_id)
    if not store.create_if_absent(mkey, build.data):
        raise StoreError(f"{store.url(mkey)} exists already: build ids must be unique")
    digest = hashlib.sha256(build.data).hexdigest()
    if options.before_current is not None:
        options.before_current(read_build(store, build.model, build.key, build.build_id, build.kind))
    pkey = pointer_key(build.model, build.key)
    for _ in range(50):
        current = store.read_versioned(pkey)
        if current is not None and not options.replace:
            try:
                winner = _find(store, build.model, build.key, build.kind)
                if winner is not None and winner.build_id != options.replaces and not check_hit(store, winner):
                    return winner
            except StoreError:
                pass  # the current build is broken: ours replaces it
        mine = _moved_pointer(current, build.build_id, digest)
        if store.replace_if(pkey, mine.model_dump_json(indent=2).encode() + b"\n", current[1] if current else None):
            return read_build(store, build.model, build.key, build.build_id, build.kind)
    raise StoreError(f"{store.url(pkey)}: could not move the pointer (too many concurrent publishers)")


def publish_build(
    store: Store, model: str, manifest_fields: dict[str, Any], folders: dict[str, Path],  # JSON edge: manifest fields
    progress: Callable[[str], None] = print, options: PublishOptions = PublishOptions(),
) -> PublishResult:
    """Publish a unit: blobs, an immutable manifest (a new build id), then the pointer, as `options` says
    (PublishOptions: replace, adopt, verify blobs, sign before the pointer moves; `_commit`)."""
    quarantined: list[str] = []
    entries, total, written = upload_folders(store, folders, progress, options.verify_blobs, quarantined)
    build_id = new_build_id()
    manifest = Manifest.model_validate({**manifest_fields, "build_id": build_id,
                                        "files": [e.model_dump() for e in entries]})
    current = _commit(store, _Written(model, manifest.key, build_id, manifest.to_json(), "unit"), options)
    assert current.manifest is not None
    return PublishResult(uri=current.uri, manifest=current.manifest, created=current.build_id == build_id,
                         bytes_uploaded=written, bytes_total=total, build_id=current.build_id,
                         manifest_sha256=current.manifest_sha256, quarantined=quarantined)


def publish_checkpoint(
    # JSON edge: the checkpoint manifest's fields, validated by CheckpointManifest
    store: Store, manifest_fields: dict[str, Any], folder: Path, progress: Callable[[str], None] = print,
) -> CheckpointManifest:
    current = publish_checkpoint_build(store, manifest_fields, folder, progress)[1]
    assert current.checkpoint is not None
    return current.checkpoint


def publish_checkpoint_build(
    # JSON edge: the checkpoint manifest's fields, validated by CheckpointManifest
    store: Store, manifest_fields: dict[str, Any], folder: Path, progress: Callable[[str], None] = print,
    replaces: str | None = None, before_current: Callable[[PublishedBuild], None] | None = None,
) -> tuple[PublishedBuild, PublishedBuild]:
    """Publish a converted checkpoint: (this build, the current build). The current build is this one, or a healthy
    build that another run made current first (never `replaces`, the build this run refused: `_commit`). This build
    is what the run's own folder holds, whichever is current; `before_current` runs on it before the pointer moves
    (signing: evidence/inputs.py)."""
    entries, _, _ = upload_folders(store, {"checkpoint": folder}, progress)
    build_id = new_build_id()
    manifest = CheckpointManifest.model_validate({**manifest_fields, "build_id": build_id,
                                                  "files": [e.model_dump() for e in entries]})
    current = _commit(store, _Written(manifest.model, manifest.key, build_id, manifest.to_json(), "checkpoint"),
                      PublishOptions(replaces=replaces, before_current=before_current))
    mine = current if current.build_id == build_id else read_build(store, manifest.model, manifest.key, build_id,
                                                                    "checkpoint")
    return mine, current


def read_manifest(store: Store, key: str) -> Manifest:
    """A unit manifest at a store key (either layout)."""
    try:
        return Manifest.parse(store.read_bytes(store_key(key)), what=store.url(key))
    except ValueError as err:
        raise StoreError(f"{store.url(key)} is not a valid manifest: {str(err)[:200]}") from None


def locate(uri: str) -> tuple[str, str, str, str, str | None]:
    """Split a store URI of a build into (store URI, layout folder, model, key, build id or None for current).

    Accepted: `<store>/manifests/<model>/<key>[/<build-id>.json|/current.json]` and the version 1
    `<store>/artifacts/<model>/<key>[/manifest.json]` (also `checkpoints/…`)."""
    found = split_build_uri(uri)
    if found is None:
        raise InputError(f"{uri.rstrip('/')} is not the URI of a published build: expected {BUILD_URI_SHAPE}"
                         f"[/<build-id>.json] (or a version 1 {LEGACY_URI_SHAPE})")
    root, folder, model, key, name = found
    if folder != MANIFESTS:
        return root, folder, model, key, LEGACY_BUILD
    return root, folder, model, key, None if name in (None, POINTER_NAME) else name.removesuffix(".json")
