"""Stage: publish the unit to the store: blobs first, an immutable manifest next, the current-build pointer last."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from enginefoundry.errors import StoreError
from enginefoundry.manifest import Manifest
from enginefoundry.publish import PublishResult, check_hit, find_current, publish_build
from enginefoundry.spec import BuildSpec
from enginefoundry.store import open_store
from enginefoundry.tasks._log import progress_logger
from enginefoundry.tasks._retry import NETWORK_RETRIES


@task(name="check cache", cache_policy=NO_CACHE, **NETWORK_RETRIES)
def find_published(spec: BuildSpec, key: str, rehash: bool = False) -> Manifest | None:
    """The current build's manifest when it can be trusted as a cache hit (self-consistent, every file present
    with its size; with `rehash` every sha256 too); None for a miss or a refused hit (it is rebuilt)."""
    log = progress_logger()
    store = open_store(spec.publish.store, spec.publish.s3_endpoint_url)
    try:
        build = find_current(store, spec.model.name, key)
    except StoreError as err:
        log(f"cache: {key[:12]}: refused ({err}); rebuilding")
        return None
    if build is None:
        return None
    problems = check_hit(store, build, rehash=rehash)
    if problems:
        log(f"cache: {key[:12]}: build {build.build_id} refused: " + "; ".join(p.line() for p in problems[:5])
            + (f" (+{len(problems) - 5} more)" if len(problems) > 5 else "") + "; rebuilding")
        return None
    return build.manifest


@task(name="publish unit", cache_policy=NO_CACHE, **NETWORK_RETRIES)
def publish_unit(spec: BuildSpec, manifest_fields: dict, folders: dict[str, str], replace: bool = False
                 ) -> PublishResult:
    """`manifest_fields` is everything but `files` and `build_id`; the file list comes from the upload itself.
    `replace` (a --force rebuild) makes this build current even when another build of the key is."""
    log = progress_logger()
    store = open_store(spec.publish.store, spec.publish.s3_endpoint_url)
    result = publish_build(store, spec.model.name, manifest_fields, {k: Path(v) for k, v in folders.items()},
                           progress=log, replace=replace)
    if result.created:
        log(f"publish: {result.uri} ({len(result.manifest.files)} files, {result.bytes_total / 2**20:.1f} MiB, "
            f"{result.bytes_uploaded / 2**20:.1f} MiB new)")
    else:
        log(f"publish: another run made build {result.build_id} of {result.manifest.key[:12]} current first; "
            "adopted it")
    return result
