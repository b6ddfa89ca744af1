"""Verification and pull of published builds.

`verify_build` streams every file of a build and checks its size and sha256 against the manifest, in
parallel, memory flat whatever the file size; the outcome is recorded as a small immutable object
(`verifications/<model>/<key>/<build-id>/<time>.json`) that `lineage` reads as "last verified".
`pull` downloads a build for serving: verified, in parallel, resumable (a file already present with the right
size and sha256 is kept), each file written to a temporary name and renamed into place.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from enginefoundry.errors import InputError, StoreError, is_transient, naming_full_disk
from enginefoundry.identity import sha256_file
from enginefoundry.retry import retry_transient
from enginefoundry.runner import pid_alive
from enginefoundry.schemas.verification import VerificationRecord
from enginefoundry.store import layout
from enginefoundry.store.backends import Store, clone_or_copy, file_mode, open_store
from enginefoundry.store.manifest import FileEntry, file_list_problems
from enginefoundry.store.publish import (
    Problem,
    PublishedBuild,
    check_file,
    check_hit,
    find_checkpoint_build,
    find_current,
    locate,
    quarantine_problems,
    read_build,
)

DEFAULT_WORKERS = 8
PULL_ATTEMPTS = 8  # per file: backoff ceilings 0.5, 1, 2, 4, 8, 8, 8 s ride through a store restart


class VerifyReport(BaseModel):
    uri: str
    build_id: str
    ok: bool
    files: int
    bytes: int
    seconds: float
    problems: list[Problem]
    mode: Literal["full", "cheap"] = "full"
    record: str | None = None  # store key of the verification record
    quarantined: list[str] = Field(default_factory=list, description="corrupt objects moved aside (--repair)")

    @property
    def mib_per_s(self) -> float:
        return self.bytes / 2**20 / self.seconds if self.seconds > 0 else 0.0


class PullReport(BaseModel):
    uri: str
    dest: str
    files: int
    downloaded: int  # files fetched this time
    kept: int  # files already present and verified (a resumed pull)
    bytes_downloaded: int
    seconds: float


# References


def open_build(uri: str, endpoint_url: str | None = None, anchor: tuple[str, str] | None = None,
               ) -> tuple[Store, PublishedBuild]:
    """A store URI of a build (manifest, key folder or pointer; either layout) → (store, build). `anchor`: (where,
    sha256) of the manifest digest recorded where the URI came from (a registry version, an MLflow run), which
    `check_hit` holds the manifest to beside the store's own record."""
    store, build = _open_build(uri, endpoint_url)
    if anchor is not None and anchor[1]:
        build = build.model_copy(update={"anchor_source": anchor[0], "anchor_sha256": anchor[1]})
    return store, build


def _open_build(uri: str, endpoint_url: str | None = None) -> tuple[Store, PublishedBuild]:
    root, folder, model, key, build_id = locate(uri)
    store = open_store(root, endpoint_url)
    kind: Literal["unit", "checkpoint"] = "checkpoint" if folder == layout.LEGACY_CHECKPOINTS else "unit"
    if build_id is None:
        # Units and converted checkpoints share manifests/<model>/: the key folder alone does not say which.
        try:
            build = find_current(store, model, key)
        except StoreError as as_unit:
            try:
                build = find_checkpoint_build(store, model, key)
            except StoreError:
                raise as_unit from None
        if build is None:
            build = find_checkpoint_build(store, model, key)
        if build is None:
            raise InputError(f"nothing is published at {uri}")
        return store, build
    if build_id == "legacy":
        legacy = layout.legacy_unit_prefix if kind == "unit" else layout.legacy_checkpoint_prefix
        mkey = layout.legacy_manifest_key(legacy(model, key))
    else:
        mkey = layout.build_manifest_key(model, key, build_id)
    if not store.exists(mkey):
        raise InputError(f"nothing is published at {uri}")
    try:
        build = read_build(store, model, key, build_id, kind)
    except StoreError:
        if folder != layout.MANIFESTS:
            raise
        try:  # a converted checkpoint's build
            build = read_build(store, model, key, build_id, "checkpoint")
        except StoreError:
            pass
        else:
            return store, build
        raise
    return store, build


def find_by_key(store: Store, key: str, model: str | None = None) -> PublishedBuild:
    """A unit (or checkpoint) key, or an unambiguous prefix of ≥ 12 characters, in one store."""
    if len(key) < 12 or any(c not in "0123456789abcdef" for c in key):
        raise InputError(f"'{key}' is not a key: give at least 12 hex characters")
    if model is not None and len(key) == 64:
        build = find_current(store, model, key) or find_checkpoint_build(store, model, key)
        if build is None:
            raise InputError(f"no build of key {key} for model {model} in {store.uri}")
        return build
    found: set[tuple[str, str, str]] = set()
    for prefix in layout.listing_folders(model):
        for name in store.list(prefix):
            listed = layout.key_of_listing(name, model)
            if listed is not None and listed[2].startswith(key):
                found.add(listed)
    if not found:
        raise InputError(f"no build with key {key} in {store.uri}")
    if len({(m, k) for _, m, k in found}) > 1:
        raise InputError(f"key prefix {key} is ambiguous in {store.uri}; give more characters")
    folder, model_name, full = sorted(found)[0]  # "manifests" sorts after "artifacts": prefer the new layout
    if any(f == layout.MANIFESTS for f, _, _ in found):
        folder = layout.MANIFESTS
    return open_build(layout.build_uri(store.uri, folder, model_name, full))[1]


# Verification


def verify_build(store: Store, build: PublishedBuild, workers: int = DEFAULT_WORKERS,
                 record: bool = True, repair: bool = False) -> VerifyReport:
    """Every file's size and sha256 against the manifest (streamed, in parallel), plus the manifest's own
    consistency (check_hit's checks, its digest against every record of it included). Records the outcome
    beside the build unless `record` is False. With `repair`, every corrupt object is quarantined
    (`publish.quarantine_problems`): the build is then refused as a hit, and the run that rebuilds it writes
    fresh blobs."""
    t0 = time.monotonic()
    problems = [p for p in check_hit(store, build, rehash=False) if p.path == "manifest"]
    with ThreadPoolExecutor(max(1, workers)) as pool:
        for found in pool.map(lambda e: check_file(store, build, e, rehash=True), build.files):
            problems.extend(found)
    report = VerifyReport(uri=build.uri, build_id=build.build_id, ok=not problems, files=len(build.files),
                          bytes=sum(f.size for f in build.files), seconds=time.monotonic() - t0, problems=problems,
                          quarantined=quarantine_problems(store, build, problems) if repair else [])
    if record:
        try:
            report.record = record_verification(store, build, report)
        except (StoreError, OSError) as err:  # a read-only credential or store can verify; it leaves no record
            report.record = f"not recorded ({type(err).__name__}: {err}); the verdict stands"
    return report


def verification_prefix(build: PublishedBuild) -> str:
    return layout.verification_prefix(build.model, build.key, build.build_id)


def record_verification(store: Store, build: PublishedBuild, report: VerifyReport) -> str:
    now = datetime.now(UTC)
    rec = VerificationRecord(uri=report.uri, build_id=report.build_id, ok=report.ok, mode=report.mode,
                             files=report.files, bytes=report.bytes, problems=[p.line() for p in report.problems],
                             verified_at=now.isoformat(timespec="seconds"))
    key = f"{verification_prefix(build)}/{now.strftime('%Y%m%dT%H%M%S%fZ')}-{uuid.uuid4().hex[:6]}.json"
    store.create_if_absent(key, (rec.model_dump_json(indent=2) + "\n").encode())
    return key


def last_verified(store: Store, build: PublishedBuild) -> VerificationRecord | None:
    names = store.list(verification_prefix(build) + "/")
    for name in reversed(names):  # names sort by time
        try:
            return VerificationRecord.parse(store.read_bytes(name), what=store.url(name))
        except (ValueError, StoreError):
            continue
    return None


# Pull


def _fetch_one(store: Store, build: PublishedBuild, entry: FileEntry, dest: Path, clone: bool) -> int | None:
    """Bytes downloaded; None when the file was already there and verified (a resumed pull)."""
    local = dest.joinpath(*entry.path.split("/"))
    mode = file_mode(entry.executable)
    _make_folders(dest, entry.path.split("/")[:-1])
    if (local.is_file() and not local.is_symlink() and local.stat().st_size == entry.size
            and sha256_file(local) == entry.sha256):
        if local.stat().st_mode & 0o777 != mode:
            os.chmod(local, mode)
        return None
    okey = build.object_key(entry)
    if clone and (src := store.local_path(okey)) is not None:
        # A copy of its own (reflinked where the filesystem can), never a hard link: a write to the work file
        # must not reach the blob. It is hashed after the copy, so what is kept is what was checked.
        tmp = local.with_name(f".{local.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.partial")
        try:
            clone_or_copy(src, tmp)
            if tmp.stat().st_size == entry.size and sha256_file(tmp) == entry.sha256:
                os.chmod(tmp, mode)
                os.replace(tmp, local)
                return 0
        finally:
            tmp.unlink(missing_ok=True)
    # A broken stream or a server restarting (connection refused, 500 while its volumes come back) restarts
    # this file's download after a backoff; a wrong digest is not transient and fails at once.
    return retry_transient(lambda: _download_verified(store, okey, entry, local, mode, build.uri),
                           what=f"pulling {entry.path}", attempts=PULL_ATTEMPTS, base_s=0.5, cap_s=8.0,
                           transient=is_transient)


def _download_verified(store: Store, okey: str, entry: FileEntry, local: Path, mode: int, ref: str) -> int:
    fd, tmp_name = tempfile.mkstemp(dir=local.parent, prefix=f".{local.name}.{os.getpid()}.", suffix=".partial")
    tmp = Path(tmp_name)
    try:
        h, size = hashlib.sha256(), 0
        with naming_full_disk(local, "free space there or pull into another folder"), os.fdopen(fd, "wb") as out:
            for chunk in store.iter_bytes(okey):
                if size + len(chunk) > entry.size:  # never more than the manifest says, whatever the server sends
                    raise StoreError(f"{entry.path}: {store.url(okey)} sent more than the manifest's {entry.size} "
                                     "bytes; refused. The store holds other bytes under this name: "
                                     f"`enginefoundry verify --repair {ref}` moves them aside, then `enginefoundry "
                                     "run SPEC` publishes fresh ones")
                h.update(chunk)
                out.write(chunk)
                size += len(chunk)
            os.fchmod(out.fileno(), mode)
        if size != entry.size or h.hexdigest() != entry.sha256:
            raise StoreError(f"{entry.path}: {store.url(okey)} is corrupted: {size} bytes, sha256 "
                             f"{h.hexdigest()[:12]}… ≠ manifest {entry.size} bytes, {entry.sha256[:12]}…; "
                             "`enginefoundry run SPEC --force` publishes a build with fresh blobs (it re-hashes "
                             f"what it reuses); `enginefoundry verify --repair {ref}` moves the bad one aside now")
        os.replace(tmp, local)
    finally:
        tmp.unlink(missing_ok=True)
    return size


def _make_folders(dest: Path, parts: list[str]) -> None:
    """dest/parts…, created one level at a time (no recursion, whatever the depth), never through a symlink: a
    link inside DEST would send the files somewhere DEST's owner never named."""
    folder = dest
    for part in parts:
        folder = folder / part
        try:
            os.mkdir(folder)
        except FileExistsError:
            if folder.is_symlink() or not folder.is_dir():
                raise StoreError(f"{folder} is a symlink or a file, not a folder: pull never writes through a "
                                 "link inside DEST; remove it or pull into an empty folder") from None


_PARTIAL = re.compile(r"^\.(?P<name>.+?)\.(?:(?P<pid>\d+)\.)?[A-Za-z0-9_]{8}\.partial$")
LEGACY_PARTIAL_AGE_S = 600.0  # a partial without a pid (an older pull's): removed once unchanged this long


def _remove_dead_partials(dest: Path, files: list[FileEntry]) -> list[Path]:
    """The hidden `.<name>.<pid>.<random>.partial` files that a killed pull left beside this build's files (a pid
    that is gone; or no pid and unchanged for LEGACY_PARTIAL_AGE_S). A live pull's are left alone."""
    names: dict[Path, set[str]] = {}
    for entry in files:
        *parent, name = entry.path.split("/")
        names.setdefault(dest.joinpath(*parent), set()).add(name)
    removed = []
    for folder, listed in names.items():
        if folder.is_symlink() or not folder.is_dir():
            continue
        for path in folder.glob(".*.partial"):
            m = _PARTIAL.match(path.name)
            if m is None or m["name"] not in listed or path.is_symlink():
                continue
            dead = (not pid_alive(int(m["pid"])) if m["pid"]
                    else time.time() - path.stat().st_mtime > LEGACY_PARTIAL_AGE_S)
            if dead:
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed


def pull(store: Store, build: PublishedBuild, dest: Path, workers: int = DEFAULT_WORKERS,
         clone: bool = False) -> PullReport:
    """Download every file of a build under dest (verified, parallel, resumable). With `clone`, a file:// blob is
    copied by the kernel (a reflink where the filesystem offers one) instead of streamed; never hard-linked."""
    t0 = time.monotonic()
    problems = [p.line() for p in check_hit(store, build) if p.path == "manifest"] + file_list_problems(build.files)
    if problems:
        raise StoreError(f"{build.uri} is not trustworthy: " + "; ".join(problems[:10]))
    dest.mkdir(parents=True, exist_ok=True)
    _remove_dead_partials(dest, build.files)
    with ThreadPoolExecutor(max(1, workers)) as pool:
        sizes = list(pool.map(lambda e: _fetch_one(store, build, e, dest, clone), build.files))
    fetched = [s for s in sizes if s is not None]
    return PullReport(uri=build.uri, dest=str(dest), files=len(build.files), downloaded=len(fetched),
                      kept=len(sizes) - len(fetched), bytes_downloaded=sum(fetched), seconds=time.monotonic() - t0)
