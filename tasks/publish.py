"""Stage: publish the unit to the store: files first, manifest last."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from enginefoundry.manifest import Manifest
from enginefoundry.publish import (
    PublishResult,
    artifact_prefix,
    publish_manifest,
    upload_folders,
)
from enginefoundry.spec import BuildSpec
from enginefoundry.store import open_store
from enginefoundry.tasks._log import progress_logger


@task(name="publish unit", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=3)
def publish_unit(spec: BuildSpec, draft: Manifest, folders: dict[str, str]) -> PublishResult:
    """`draft` is the manifest without `files`; the file list comes from the upload itself."""
    log = progress_logger()
    store = open_store(spec.publish.store, spec.publish.s3_endpoint_url)
    prefix = artifact_prefix(spec.model.name, draft.key)
    entries, total = upload_folders(store, prefix, {k: Path(v) for k, v in folders.items()}, progress=log)
    manifest = draft.model_copy(update={"files": entries})
    result = publish_manifest(store, spec.model.name, manifest)
    if result.created:
        log(f"publish: {result.uri} ({len(entries)} files, {total / 2**20:.1f} MiB)")
    else:
        log(f"publish: another run published {manifest.key[:12]} first; adopted its manifest")
    return result.model_copy(update={"bytes_uploaded": total})
