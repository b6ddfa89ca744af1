"""The publish protocol: files first, manifest last, created only if absent (docs/architecture.md#store-layout)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from enginefoundry.errors import StoreError
from enginefoundry.identity import list_files
from enginefoundry.manifest import FileEntry, Manifest
from enginefoundry.store import Store


def artifact_prefix(model: str, key: str) -> str:
    return f"artifacts/{model}/{key}"


def manifest_key(model: str, key: str) -> str:
    return f"{artifact_prefix(model, key)}/manifest.json"


class PublishResult(BaseModel):
    uri: str  # the manifest's URI
    manifest: Manifest
    created: bool  # False when another run published this key first and we adopted its manifest
    bytes_uploaded: int


def upload_folders(
    store: Store, prefix: str, folders: dict[str, Path], progress: Callable[[str], None] = print,
) -> tuple[list[FileEntry], int]:
    """Upload every file of each folder under prefix/<name>/; sizes and sha256 come from the upload pass."""
    entries: list[FileEntry] = []
    total = 0
    for name, folder in folders.items():
        files = list_files(folder)
        for i, f in enumerate(files, start=1):
            rel = f"{name}/{f.relative_to(folder).as_posix()}"
            size, digest = store.put_file(f, f"{prefix}/{rel}")
            entries.append(FileEntry(path=rel, size=size, sha256=digest))
            total += size
            if size > 64 * 1024 * 1024 or i == len(files):
                progress(f"publish: {name}: {i}/{len(files)} files, {total / 2**20:.1f} MiB so far")
    return entries, total


def publish_manifest(store: Store, model: str, manifest: Manifest) -> PublishResult:
    """Create the manifest if absent. A loser of the race adopts the winner's manifest."""
    mkey = manifest_key(model, manifest.key)
    created = store.create_if_absent(mkey, manifest.to_json())
    if created:
        return PublishResult(uri=store.url(mkey), manifest=manifest, created=True, bytes_uploaded=0)
    winner = read_manifest(store, mkey)
    return PublishResult(uri=store.url(mkey), manifest=winner, created=False, bytes_uploaded=0)


def read_manifest(store: Store, key: str) -> Manifest:
    try:
        return Manifest.model_validate(json.loads(store.read_bytes(key)))
    except (ValueError, json.JSONDecodeError) as err:
        raise StoreError(f"{store.url(key)} is not a valid manifest: {str(err)[:200]}") from None


def download_verified(store: Store, model: str, manifest: Manifest, dest: Path) -> list[Path]:
    """Download every file of a published unit; refuse, naming the file, when a digest differs."""
    return download_files(store, artifact_prefix(model, manifest.key), manifest.files, dest)


def download_files(store: Store, prefix: str, files: list[FileEntry], dest: Path) -> list[Path]:
    out = []
    for entry in files:
        local = dest / entry.path
        digest = store.download(f"{prefix}/{entry.path}", local)
        if digest != entry.sha256:
            local.unlink(missing_ok=True)
            raise StoreError(
                f"{store.url(prefix + '/' + entry.path)} is corrupted: sha256 {digest[:12]}… "
                f"≠ manifest {entry.sha256[:12]}…; republish the unit with --force"
            )
        out.append(local)
    return out


# Converted checkpoints: published once under their own key and reused by every target that needs them.


def checkpoint_prefix(model: str, key: str) -> str:
    return f"checkpoints/{model}/{key}"


class CheckpointManifest(BaseModel):
    key: str
    key_components: dict[str, Any]
    model: str
    variant: str
    lane: str
    params: dict[str, Any]
    files: list[FileEntry]
    created_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))


def find_checkpoint(store: Store, model: str, key: str) -> CheckpointManifest | None:
    mkey = f"{checkpoint_prefix(model, key)}/manifest.json"
    if not store.exists(mkey):
        return None
    return CheckpointManifest.model_validate(json.loads(store.read_bytes(mkey)))


def publish_checkpoint(
    store: Store, manifest_fields: dict[str, Any], folder: Path, progress: Callable[[str], None] = print,
) -> CheckpointManifest:
    prefix = checkpoint_prefix(manifest_fields["model"], manifest_fields["key"])
    entries, _ = upload_folders(store, prefix, {"checkpoint": folder}, progress)
    manifest = CheckpointManifest.model_validate({**manifest_fields, "files": [e.model_dump() for e in entries]})
    if not store.create_if_absent(f"{prefix}/manifest.json", (manifest.model_dump_json(indent=2) + "\n").encode()):
        return find_checkpoint(store, manifest.model, manifest.key) or manifest
    return manifest
