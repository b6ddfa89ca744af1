"""Fetch a checkpoint into the local cache and record exactly what was fetched (source identity)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from enginefoundry.errors import SourceError
from enginefoundry.identity import checkpoint_digests, sha256_json
from enginefoundry.s3 import s3_client, s3_endpoint
from enginefoundry.spec import SourceKind, SourceURI


class SourceSnapshot(BaseModel):
    """A fetched checkpoint: where it lies locally and what it is, independent of where it came from."""

    uri: str
    kind: SourceKind
    local_dir: str
    revision: str | None = Field(default=None, description="hf: the commit sha the revision resolved to")
    requested_revision: str | None = None
    identity: dict[str, Any] = Field(default_factory=dict, description="commit sha, S3 versions/ETags or sha256s")
    weights_digest: str
    tokenizer_digest: str
    files: dict[str, str] = Field(default_factory=dict, description="relative path → sha256")


def cache_root() -> Path:
    return Path(os.environ.get("EF_CACHE_DIR", Path.home() / ".cache" / "enginefoundry"))


def fetch(source: SourceURI, progress: Callable[[str], None] = print) -> SourceSnapshot:
    rev: str | None = None
    if source.kind is SourceKind.HF:
        local, identity, rev = _fetch_hf(source, progress)
    elif source.kind is SourceKind.S3:
        local, identity = _fetch_s3(source, progress)
    else:
        local, identity = _fetch_local(source), {}
    if not (local / "config.json").is_file():
        raise SourceError(f"{source.uri} has no config.json: point the source at a Hugging Face checkpoint folder")
    # Digests are computed once here, streaming; every key downstream uses them.
    weights, tok, files = checkpoint_digests(local)
    if source.kind is SourceKind.LOCAL:
        identity = {"sha256": files}
    return SourceSnapshot(
        uri=source.uri, kind=source.kind, local_dir=str(local), revision=rev,
        requested_revision=source.revision, identity=identity, weights_digest=weights,
        tokenizer_digest=tok, files=files,
    )


def _fetch_local(source: SourceURI) -> Path:
    path = Path(source.location).expanduser()
    if not path.is_dir():
        raise SourceError(f"model.source: local folder {path} does not exist; check the path in the spec")
    return path.resolve()


def _hub_endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def _resolve_hf(source: SourceURI) -> str:
    """The commit sha a revision points at; hub errors become one readable SourceError."""
    import httpx
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo, rev = source.location, source.revision or "main"
    endpoint = _hub_endpoint()
    try:
        sha = HfApi().model_info(repo, revision=rev).sha
    except RevisionNotFoundError:
        raise SourceError(
            f"model.source: revision '{rev}' does not exist in {repo} at {endpoint}; use a branch, tag or commit sha"
        ) from None
    except GatedRepoError:
        raise SourceError(f"model.source: {repo} is gated; accept its licence and set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise SourceError(
            f"model.source: repository {repo} not found at {endpoint} (or it is private: set HF_TOKEN)"
        ) from None
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError, httpx.HTTPError) as err:
        raise SourceError(
            f"model.source: cannot reach the hub at {endpoint} ({type(err).__name__}); "
            "check the network, or set HF_ENDPOINT to a reachable hub or mirror"
        ) from None
    if not sha:
        raise SourceError(f"model.source: the hub at {endpoint} returned no commit sha for {repo}@{rev}")
    return sha


def probe(source: SourceURI) -> str:
    """A cheap check that the source exists and is reachable, before any download or Prefect start.
    Returns what it resolved to (a commit sha, an S3 prefix, a folder)."""
    if source.kind is SourceKind.HF:
        return _resolve_hf(source)
    if source.kind is SourceKind.S3:
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, _, prefix = source.location.partition("/")
        try:
            found = s3_client().list_objects_v2(Bucket=bucket, Prefix=prefix + "/", MaxKeys=1).get("KeyCount", 0)
        except (ClientError, BotoCoreError) as err:
            raise SourceError(
                f"model.source: cannot list s3://{bucket}/{prefix}/ at {s3_endpoint() or 'AWS'}: {_short(err)}; "
                "check the bucket, credentials and AWS_ENDPOINT_URL_S3"
            ) from None
        if not found:
            raise SourceError(f"model.source: s3://{bucket}/{prefix}/ is empty; upload the checkpoint folder there")
        return f"s3://{bucket}/{prefix}/"
    path = _fetch_local(source)
    if not (path / "config.json").is_file():
        raise SourceError(f"model.source: {path} has no config.json; point it at a Hugging Face checkpoint folder")
    return str(path)


def _fetch_hf(source: SourceURI, progress: Callable[[str], None]) -> tuple[Path, dict[str, Any], str]:
    """Resolve the revision to a commit sha first, then download exactly that commit."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    repo, rev = source.location, source.revision or "main"
    endpoint = _hub_endpoint()
    sha = _resolve_hf(source)
    progress(f"fetch: {repo}@{rev} resolved to commit {sha[:12]} at {endpoint}")
    try:
        local = snapshot_download(repo, revision=sha, cache_dir=str(cache_root() / "hf"))
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as err:
        raise SourceError(
            f"model.source: downloading {repo}@{sha[:12]} from {endpoint} failed ({type(err).__name__}); "
            "check the network or HF_ENDPOINT"
        ) from None
    return Path(local), {"repo": repo, "requested_revision": rev, "commit_sha": sha, "endpoint": endpoint}, sha


def _fetch_s3(source: SourceURI, progress: Callable[[str], None]) -> tuple[Path, dict[str, Any]]:
    """Download every object under the prefix into a cache folder named by the objects' versions/ETags."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, _, prefix = source.location.partition("/")
    client = s3_client()
    try:
        objects = _list_objects(client, bucket, prefix + "/")
    except (ClientError, BotoCoreError) as err:
        raise SourceError(
            f"model.source: cannot list s3://{bucket}/{prefix}/ at {s3_endpoint() or 'AWS'}: {_short(err)}; "
            "check the bucket, credentials and AWS_ENDPOINT_URL_S3"
        ) from None
    if not objects:
        raise SourceError(f"model.source: s3://{bucket}/{prefix}/ is empty; upload the checkpoint folder there")
    identity = {o["Key"][len(prefix) + 1 :]: o.get("VersionId") or o["ETag"].strip('"') for o in objects}
    dest = cache_root() / "s3" / bucket / prefix / sha256_json(identity)[:16]
    if not (dest / ".complete").exists():
        tmp = dest.with_name(dest.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        for obj in objects:
            rel = obj["Key"][len(prefix) + 1 :]
            target = tmp / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            progress(f"fetch: s3://{bucket}/{obj['Key']} ({obj['Size']} bytes)")
            client.download_file(bucket, obj["Key"], str(target))
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
        (dest / ".complete").touch()
    return dest, {"bucket": bucket, "prefix": prefix, "objects": identity}


def _list_objects(client: Any, bucket: str, prefix: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        out.extend(page.get("Contents", []))
    return out


def _short(err: Exception) -> str:
    text = str(err)
    return text if len(text) < 200 else text[:200] + "…"
