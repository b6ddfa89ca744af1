"""Stage: publish the unit to the store: blobs first, an immutable manifest next, the current-build pointer last."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from enginefoundry.evidence.attest import sign_before_current
from enginefoundry.evidence.signing import require_signer_for, signer_from_env
from enginefoundry.runner import exit_if_terminating
from enginefoundry.spec import BuildSpec
from enginefoundry.store.backends import open_store
from enginefoundry.store.manifest import Manifest
from enginefoundry.store.publish import PublishOptions, PublishResult, current_build_id, publish_build
from enginefoundry.tasks._log import progress_logger
from enginefoundry.tasks._retry import NETWORK_RETRIES
from enginefoundry.tasks.cancel_watch import stop_if_cancelled


def build_now_current(spec: BuildSpec, key: str) -> str:
    """The build id the key's pointer names as a unit starts to build ("" for none): what its publish replaces.
    Read before the build, under the run's lease: a different current build at publish time was made by
    another run meanwhile."""
    return current_build_id(open_store(spec.publish.store, spec.publish.s3_endpoint_url), spec.model.name, key)


@task(name="publish unit", cache_policy=NO_CACHE, **NETWORK_RETRIES)
def publish_unit(spec: BuildSpec, draft: Manifest, folders: dict[str, str], replace: bool = False,
                 replaces: str | None = None) -> PublishResult:
    """`draft` is the manifest without `files` and `build_id`: the file list comes from the upload itself, the
    build id from the store. `replace` (a --force rebuild) makes this new build current even when another build
    of the key is, and re-hashes every blob it reuses (a corrupt one is quarantined and written afresh); the
    earlier build stays in the store, verifiable. Without it a healthy build that another run made current
    after `replaces` (`build_now_current`) was current is adopted; the build this run refused never is."""
    exit_if_terminating()  # a cancelled run publishes nothing, whatever its stages made of the cancel
    stop_if_cancelled("publish")  # a cancel of this run or its parent that the watcher has not seen yet
    log = progress_logger()
    signer = signer_from_env()  # a bad key fails here, before any byte is uploaded
    # validate/run checked the process that started the run; in cluster mode this worker publishes, and without
    # a key of its own it must not publish an unsigned build that the spec's own consumers refuse.
    require_signer_for(spec)
    store = open_store(spec.publish.store, spec.publish.s3_endpoint_url)
    fields = draft.model_dump(mode="json", exclude={"files", "build_id"})
    options = PublishOptions(replace=replace, replaces=replaces, verify_blobs=replace,
                             before_current=_unless_cancelled(sign_before_current(store, signer, log)))
    result = publish_build(store, spec.model.name, fields, {k: Path(v) for k, v in folders.items()}, progress=log,
                           options=options)
    if result.created:
        log(f"publish: {result.uri} ({len(result.manifest.files)} files, {result.bytes_total / 2**20:.1f} MiB, "
            f"{result.bytes_uploaded / 2**20:.1f} MiB new)")
    else:
        log(f"publish: another run made build {result.build_id} of {result.manifest.key[:12]} current first; "
            "adopted it")
    return result


def _unless_cancelled(before_current: Callable[..., Any] | None) -> Callable[..., Any]:
    """The last check before the key's pointer moves (the build becomes visible to readers): a cancel that came
    during the upload publishes nothing."""
    def check(*args: Any, **kwargs: Any) -> Any:
        stop_if_cancelled("publish (moving the key's pointer)")
        return before_current(*args, **kwargs) if before_current is not None else None

    return check
