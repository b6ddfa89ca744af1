"""Fetch a checkpoint into the local cache and record exactly what was fetched (source identity)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from enginefoundry.confine import UnsafePathError, confined_join, normalise_prefix, safe_relpath, symlinks_leaving
from enginefoundry.errors import SourceError, SourceUnreachable
from enginefoundry.identity import checkpoint_digests, list_files, sha256_json
from enginefoundry.inputs.model_config import MAX_CONFIG_BYTES
from enginefoundry.inputs.quantized_source import (
    MAX_QUANT_CONFIG_BYTES,
    MODEL_CONFIG,
    QUANT_CONFIG,
    SourceQuantization,
    quantization_from,
    read_json_bounded,
    read_quantization,
)
from enginefoundry.runner import pid_alive
from enginefoundry.schemas.loose import JsonObject
from enginefoundry.settings import cache_root
from enginefoundry.spec import SourceKind, SourceURI
from enginefoundry.store.s3 import s3_client, s3_endpoint


class SourceSnapshot(BaseModel):
    """A fetched checkpoint: where it lies locally and what it is, independent of where it came from."""

    uri: str
    kind: SourceKind
    local_dir: str
    revision: str | None = Field(default=None, description="hf: the commit sha the revision resolved to")
    requested_revision: str | None = None
    identity: dict[str, Any] = Field(  # JSON edge: recorded in manifests
        default_factory=dict, description="commit sha, S3 versions/ETags or sha256s")
    weights_digest: str
    tokenizer_digest: str
    files: dict[str, str] = Field(default_factory=dict, description="relative path → sha256")
    quantization: SourceQuantization | None = Field(
        default=None, description="a pre-quantized checkpoint's own quantization (build.quantized_source)")


class SourceIdentity(BaseModel):
    """A snapshot without its local folder: what a worker must fetch and match (cluster mode sends it as the
    `build-unit` flow's `source` parameter)."""

    uri: str
    kind: SourceKind
    revision: str | None = None
    requested_revision: str | None = None
    identity: dict[str, Any] = Field(default_factory=dict)  # JSON edge: commit sha, S3 versions/ETags, sha256s
    weights_digest: str
    tokenizer_digest: str
    files: dict[str, str] = Field(default_factory=dict)
    quantization: SourceQuantization | None = None

    @classmethod
    def of(cls, snapshot: SourceSnapshot) -> SourceIdentity:
        return cls.model_validate(snapshot.model_dump(mode="json", exclude={"local_dir"}))

    def at(self, local_dir: str) -> SourceSnapshot:
        """The same source, fetched to `local_dir` on this machine."""
        return SourceSnapshot.model_validate({**self.model_dump(mode="json"), "local_dir": local_dir})


CHECKPOINT_MARKER = "config.json"  # a Hugging Face checkpoint folder has it; a PEFT adapter folder adapter_config.json
# Checked before any weight is fetched: what a pre-quantized source's own quantization allows (the caller's check).
QuantizationCheck = Callable[[SourceQuantization | None], None]
CONFIG_FILES = (MODEL_CONFIG, QUANT_CONFIG)  # fetched first, so that the check runs before the weights come


def fetch(source: SourceURI, progress: Callable[[str], None] = print, check: QuantizationCheck | None = None, *,
          marker: str = CHECKPOINT_MARKER, field: str = "model.source") -> SourceSnapshot:
    """Fetch, pin and digest a source. `check`: called with the checkpoint's own quantization
    (build.quantized_source; None for an unquantized one) once its config files are here and before its weights are
    fetched (a Hub source's config files come alone first; an S3 source's objects come config files first); its
    error stops the fetch. `marker`: the file that makes the folder what the field names (config.json for a
    checkpoint); `field`: the spec field the source came from, named in every refusal."""
    try:
        return _fetch(source, progress, check, marker)
    except SourceError as err:
        if field == "model.source":
            raise
        raise SourceError(str(err).replace("model.source", field)) from None


def _fetch(source: SourceURI, progress: Callable[[str], None], check: QuantizationCheck | None,
           marker: str) -> SourceSnapshot:
    rev: str | None = None
    if source.kind is SourceKind.HF:
        local, identity, rev = _fetch_hf(source, progress, check)
    elif source.kind is SourceKind.S3:
        local, identity = _fetch_s3(source, progress, check)
    else:
        local, identity = _fetch_local(source, marker), {}
    if not (local / marker).is_file():
        raise SourceError(f"model.source: {source.uri} has no {marker}: point the source at a "
                          f"{_folder_kind(marker)} folder")
    quantization = read_quantization(local) if marker == CHECKPOINT_MARKER else None
    if check is not None and source.kind is SourceKind.LOCAL:  # a Hub or S3 fetch checked before its weights came
        check(quantization)
    if quantization is not None:
        progress(f"fetch: {source.uri} is pre-quantized: {quantization.label()}; it is served as it is, never "
                 "quantized again")
    # Digests are computed once here, streaming; every key downstream uses them.
    weights, tok, files = checkpoint_digests(local)
    if source.kind is SourceKind.LOCAL:
        identity = {"sha256": files}
    return SourceSnapshot(
        uri=source.uri, kind=source.kind, local_dir=str(local), revision=rev,
        requested_revision=source.revision, identity=identity, weights_digest=weights,
        tokenizer_digest=tok, files=files, quantization=quantization,
    )


SYSTEM_FOLDERS = frozenset(Path(p) for p in ("/", "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/var", "/proc",
                                              "/sys", "/dev", "/boot", "/run", "/tmp", "/home", "/root", "/opt"))
MAX_SOURCE_ENTRIES = 20_000  # a sharded 405B checkpoint has a few hundred files


def check_local(source: SourceURI) -> Path:
    """A local source folder as `run` takes it (the same checks; `validate` calls it too): its resolved path, or
    SourceError naming the problem and the fix."""
    return _fetch_local(source)


def _folder_kind(marker: str) -> str:
    return "Hugging Face checkpoint" if marker == CHECKPOINT_MARKER else f"Hugging Face PEFT ({marker})"


def _fetch_local(source: SourceURI, marker: str = CHECKPOINT_MARKER) -> Path:
    path = Path(source.location).expanduser()
    if not path.is_dir():
        raise SourceError(f"model.source: local folder {path} does not exist; check the path in the spec")
    path = path.resolve()
    # Refused before anything walks it (`/usr` took 36 s to walk before its refusal): a system folder, a folder
    # without its marker (config.json), or one with more entries than any checkpoint has.
    if path in SYSTEM_FOLDERS or not (path / marker).is_file():
        kind = "Hugging Face checkpoint folder" if marker == CHECKPOINT_MARKER else "folder with " + marker
        raise SourceError(f"model.source: {path} is not a {kind} (no {marker}"
                          f"{', a system folder' if path in SYSTEM_FOLDERS else ''}); point it at one")
    # A symlink leading out of the folder would make us read (and publish) files the spec never named. A
    # Hugging Face cache snapshot (<repo>/snapshots/<sha>) links into its own <repo>/blobs: that is allowed.
    allowed = (path.parent.parent / "blobs",) if path.parent.name == "snapshots" else ()
    try:
        leaving = symlinks_leaving(path, allowed, max_entries=MAX_SOURCE_ENTRIES)
    except UnsafePathError as err:
        raise SourceError(f"model.source: {err}; no checkpoint folder has that many, point it at one") from None
    if leaving:
        shown = ", ".join(str(p.relative_to(path)) for p in leaving[:5])
        raise SourceError(
            f"model.source: {path} has symlinks pointing outside it ({shown}); copy the files in "
            "(cp -L) instead of linking them"
        )
    return path


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

    if _hub_offline():
        return _cached_snapshot(source).name
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
        raise SourceUnreachable(
            f"model.source: cannot reach the hub at {endpoint} ({type(err).__name__}); "
            "check the network, or set HF_ENDPOINT to a reachable hub or mirror"
        ) from None
    if not sha:
        raise SourceError(f"model.source: the hub at {endpoint} returned no commit sha for {repo}@{rev}")
    return sha


def probe(source: SourceURI, *, marker: str = CHECKPOINT_MARKER, field: str = "model.source") -> str:
    """A cheap check that the source exists and is reachable, before any download or Prefect start.
    Returns what it resolved to (a commit sha, an S3 prefix, a folder). `marker` and `field` as for `fetch` (an
    adapter's folder has adapter_config.json; its refusals name `model.adapters.<i>.source`)."""
    try:
        return _probe(source, marker)
    except SourceError as err:
        if field == "model.source":
            raise
        raise SourceError(str(err).replace("model.source", field)) from None


def _probe(source: SourceURI, marker: str) -> str:
    if source.kind is SourceKind.HF:
        return _resolve_hf(source)
    if source.kind is SourceKind.S3:
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, prefix = _bucket_prefix(source)
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
    path = _fetch_local(source, marker)
    if not (path / marker).is_file():
        raise SourceError(f"model.source: {path} has no {marker}; point it at a {_folder_kind(marker)} folder")
    return str(path)


# Repo files a build never reads, skipped unless the spec's model.ignore_patterns says otherwise: second copies of
# the weights in other formats. Meta's `original/` folder alone is a 16 GB duplicate for Llama-3.1-8B-Instruct
# (consolidated.00.pth). Patterns are fnmatch, as huggingface_hub's `filter_repo_objects` applies them ("*" also
# matches "/"). `*.bin` is added when the selection holds safetensors (PyTorch pickles are then a duplicate).
DEFAULT_IGNORE_PATTERNS: tuple[str, ...] = ("original/*", "*.pth", "*.gguf", "onnx/*", "*.msgpack", "*.h5")
BIN_WHEN_SAFETENSORS = "*.bin"


def hf_selection(files: list[str], allow: tuple[str, ...] | None, ignore: tuple[str, ...] | None) -> tuple[
        list[str], tuple[str, ...]]:
    """(the repo files a build reads, the ignore patterns that select them) for a repo listing."""
    # huggingface_hub 1.33.0 re-exports it lazily (utils/__init__.py: a TYPE_CHECKING import without `as`)
    from huggingface_hub.utils import filter_repo_objects  # type: ignore[attr-defined]

    patterns = DEFAULT_IGNORE_PATTERNS if ignore is None else tuple(ignore)
    chosen = list(filter_repo_objects(files, allow_patterns=list(allow) if allow else None,
                                      ignore_patterns=list(patterns)))
    if ignore is None and any(f.endswith(".safetensors") for f in chosen):
        patterns = (*patterns, BIN_WHEN_SAFETENSORS)
        chosen = list(filter_repo_objects(chosen, ignore_patterns=[BIN_WHEN_SAFETENSORS]))
    return sorted(chosen), patterns


def _hub_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _hf_cache_dir() -> Path:
    """The standard Hugging Face cache (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def _fetch_hf(source: SourceURI, progress: Callable[[str], None], check: QuantizationCheck | None = None,
              ) -> tuple[Path, dict[str, Any], str]:  # JSON edge: the source identity, recorded
    """Resolve the revision to a commit sha, then download the selected files of exactly that commit into the
    standard HF cache, with huggingface_hub's progress bars. A download resumes file by file: an interrupted
    fetch keeps the files it finished and the next one downloads only the rest (the progress line says how
    many); within a file, huggingface_hub retries transient network errors from where it stopped (HTTP Range,
    `http_get(resume_size=…)`), but since huggingface_hub PR #4228 a killed process's partial file is not reused.
    With HF_HUB_OFFLINE=1 the revision and files come from the cache alone (a pre-warmed shared cache too)."""
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    repo, rev = source.location, source.revision or "main"
    endpoint = _hub_endpoint()
    cache = _hf_cache_dir()
    allow = source.allow_patterns
    sha = rev
    try:
        if _hub_offline():
            snapshot, files, ignore = _hf_from_cache(source, progress, check)
            sha = snapshot.name
        else:
            sha = _resolve_hf(source)
            snapshot, files, ignore = _hf_download(source, sha, progress, check)
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as err:
        if _hub_offline():
            raise SourceError(
                f"model.source: {repo}@{rev} is not (completely) in the Hugging Face cache {cache} and HF_HUB_OFFLINE "
                f"is set: fetch it once online, or point HF_HUB_CACHE/HF_HOME at a warmed cache ({_short(err)})"
            ) from None
        raise SourceError(
            f"model.source: downloading {repo}@{sha[:12]} from {endpoint} failed ({type(err).__name__}); "
            "check the network or HF_ENDPOINT"
        ) from None
    missing = [f for f in files if not (snapshot / f).is_file()]
    if missing:
        raise SourceError(f"model.source: the cached snapshot of {repo}@{sha[:12]} in {cache} lacks {missing[:3]}; "
                          "fetch it again online")
    local = _selection_view(snapshot, files)
    identity = {"repo": repo, "requested_revision": rev, "commit_sha": sha, "endpoint": endpoint,
                "allow_patterns": list(allow) if allow else None, "ignore_patterns": list(ignore)}
    return local, identity, sha


def _hf_from_cache(source: SourceURI, progress: Callable[[str], None], check: QuantizationCheck | None,
                   ) -> tuple[Path, list[str], list[str]]:
    """HF_HUB_OFFLINE: the cache alone; refs/<rev> gives the commit, the snapshot folder what is there; the second
    call checks the selection against the tree listing cached by the online fetch. The snapshot (named by its
    commit), the selected files, the ignore patterns."""
    from huggingface_hub import snapshot_download

    repo, rev, allow = source.location, source.revision or "main", source.allow_patterns
    snapshot = _cached_snapshot(source)
    sha = snapshot.name
    files, ignore = hf_selection([p.relative_to(snapshot).as_posix() for p in list_files(snapshot)],
                                 allow, source.ignore_patterns)
    snapshot = Path(snapshot_download(repo, revision=sha, allow_patterns=list(allow) if allow else None,
                                      ignore_patterns=list(ignore)))
    progress(f"fetch: {repo}@{rev} is commit {sha[:12]} in the local cache {_hf_cache_dir()} (HF_HUB_OFFLINE)")
    if check is not None:
        check(read_quantization(snapshot))
    return snapshot, files, list(ignore)


def _hf_download(source: SourceURI, sha: str, progress: Callable[[str], None], check: QuantizationCheck | None,
                 ) -> tuple[Path, list[str], list[str]]:
    """The selected files of commit `sha` (the source's revision, resolved) downloaded into the HF cache: the
    snapshot, the selected files, the ignore patterns."""
    from huggingface_hub import HfApi, snapshot_download, try_to_load_from_cache
    from huggingface_hub.hf_api import RepoFile

    repo, rev, allow, cache = source.location, source.revision or "main", source.allow_patterns, _hf_cache_dir()
    listing = {f.path: f.size or 0 for f in HfApi().list_repo_tree(repo, revision=sha, recursive=True)
               if isinstance(f, RepoFile)}
    files, ignore = hf_selection(list(listing), allow, source.ignore_patterns)
    todo = [f for f in files if not isinstance(try_to_load_from_cache(repo, f, revision=sha), str)]
    skipped = sorted(set(listing) - set(files))
    fetching = (f"downloading {len(todo)} ({_gb(sum(listing[f] for f in todo))}) into {cache}" if todo
                else f"all in the cache {cache}")
    progress(f"fetch: {repo}@{rev} resolved to commit {sha[:12]} at {_hub_endpoint()}: {len(files)} files, "
             f"{_gb(sum(listing[f] for f in files))}; {fetching}"
             + (f"; skipped {len(skipped)} by pattern: {', '.join(skipped[:5])}"
                + (" …" if len(skipped) > 5 else "") if skipped else ""))
    if check is not None:  # the config files alone, before any weight
        _check_hub_configs(repo, sha, [f for f in CONFIG_FILES if f in files], check)
    # By the requested revision, so the cache records refs/<rev> → commit for offline use; the commit
    # must be the one resolved above (a branch that moved in between is refused, not mixed).
    snapshot = Path(snapshot_download(repo, revision=rev, allow_patterns=list(allow) if allow else None,
                                      ignore_patterns=list(ignore)))
    if snapshot.name != sha:
        raise SourceError(f"model.source: {repo}@{rev} moved from commit {sha[:12]} to {snapshot.name[:12]} "
                          "during the fetch; run again, or pin the revision to a commit sha")
    return snapshot, files, list(ignore)


def _check_hub_configs(repo: str, sha: str, present: list[str], check: QuantizationCheck) -> None:
    """The repo's config files at commit `sha`, downloaded alone (into the cache the snapshot download reuses), then
    `check` on their quantization."""
    from huggingface_hub import hf_hub_download

    paths = {name: Path(hf_hub_download(repo, name, revision=sha)) for name in present}
    check(quantization_from(
        read_json_bounded(paths[QUANT_CONFIG], MAX_QUANT_CONFIG_BYTES, "model.source") if QUANT_CONFIG in paths
        else None,
        read_json_bounded(paths[MODEL_CONFIG], MAX_CONFIG_BYTES, "model.source") if MODEL_CONFIG in paths
        else None))


def _cached_snapshot(source: SourceURI) -> Path:
    """The snapshot folder of source's revision in the local HF cache (offline; no request is sent)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    repo, rev = source.location, source.revision or "main"
    try:
        return Path(snapshot_download(repo, revision=rev, allow_patterns=["config.json"], local_files_only=True))
    except (LocalEntryNotFoundError, OSError) as err:
        raise SourceError(
            f"model.source: {repo}@{rev} is not in the Hugging Face cache {_hf_cache_dir()} and HF_HUB_OFFLINE is "
            f"set: fetch it once online, or point HF_HUB_CACHE/HF_HOME at a warmed cache ({_short(err)})"
        ) from None


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def _selection_view(snapshot: Path, files: list[str]) -> Path:
    """The folder the build reads: the HF snapshot itself when it holds exactly the selected files, else a folder
    of links to just those files (another fetch of the same commit may have put more into the shared snapshot),
    so the checkpoint digests cover exactly what the build reads."""
    present = sorted(p.relative_to(snapshot).as_posix() for p in list_files(snapshot))
    if present == files:
        return snapshot
    view = cache_root() / "hf-views" / snapshot.parent.parent.name / snapshot.name / sha256_json(files)[:16]
    if view.is_dir() and all((view / f).is_file() for f in files):  # links resolve: the blobs are still cached
        return view
    tmp = view.with_name(f"{view.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    for f in files:
        link = tmp / f
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(snapshot / f)
    shutil.rmtree(view, ignore_errors=True)
    tmp.rename(view)
    return view


def _fetch_s3(source: SourceURI, progress: Callable[[str], None], check: QuantizationCheck | None = None,
              ) -> tuple[Path, dict[str, Any]]:  # JSON edge: the source identity, recorded
    """Download every object under the prefix into a cache folder named by the objects' versions/ETags."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, prefix = _bucket_prefix(source)
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
    # Folder markers ("prefix/sub/", zero bytes, made by S3 consoles) hold no file.
    objects = [o for o in objects if not (o["Key"].endswith("/") and o.get("Size", 0) == 0)]
    for obj in objects:
        _check_key(bucket, prefix, obj["Key"])
    identity = {o["Key"][len(prefix) + 1 :]: o.get("VersionId") or o["ETag"].strip('"') for o in objects}
    root = cache_root() / "s3"
    dest = root / bucket / prefix / sha256_json(identity)[:16]
    if (dest / ".complete").exists() and check is not None:
        check(read_quantization(dest))
    if not (dest / ".complete").exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_partials(dest)
        # Our own partial folder: a concurrent fetch of the same prefix writes its own, never into ours.
        tmp = dest.with_name(f"{dest.name}.partial-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        # The config files first: the check sees them before any weight is downloaded.
        configs = [o for o in objects if o["Key"][len(prefix) + 1 :] in CONFIG_FILES]
        ordered = configs + [o for o in objects if o not in configs]
        for i, obj in enumerate(ordered):
            if check is not None and i == len(configs):
                _check_or_clear(check, tmp)
            rel = obj["Key"][len(prefix) + 1 :]
            try:
                target = confined_join(tmp, rel, f"S3 object key under s3://{bucket}/{prefix}/:")
            except UnsafePathError as err:
                raise SourceError(f"model.source: {err}") from None
            target.parent.mkdir(parents=True, exist_ok=True)
            progress(f"fetch: s3://{bucket}/{obj['Key']} ({obj['Size']} bytes)")
            client.download_file(bucket, obj["Key"], str(target))
        if check is not None and len(configs) == len(ordered):  # config files alone: checked after them
            _check_or_clear(check, tmp)
        (tmp / ".complete").touch()
        if (dest / ".complete").exists():  # another run finished the same download first
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            shutil.rmtree(dest, ignore_errors=True)
            tmp.rename(dest)
    return dest, {"bucket": bucket, "prefix": prefix, "objects": identity}


def _check_or_clear(check: QuantizationCheck, tmp: Path) -> None:
    """`check` on the config files fetched into `tmp` so far; refused, the partial folder goes (nothing is left
    that a later fetch would find)."""
    try:
        check(read_quantization(tmp))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _bucket_prefix(source: SourceURI) -> tuple[str, str]:
    bucket, _, raw = source.location.partition("/")
    try:
        prefix = normalise_prefix(raw, f"model.source prefix of s3://{source.location}")
    except UnsafePathError as err:
        raise SourceError(f"model.source: {err}") from None
    if not prefix:
        raise SourceError(f"model.source: s3://{source.location} has no prefix; use s3://bucket/folder")
    return bucket, prefix


def _check_key(bucket: str, prefix: str, key: str) -> None:
    """A listed key must be a plain relative path under the prefix, or nothing is downloaded."""
    try:
        if not key.startswith(prefix + "/"):
            raise UnsafePathError(f"S3 object key {key!r} is not under the prefix '{prefix}/'")
        safe_relpath(key[len(prefix) + 1 :], f"S3 object key under s3://{bucket}/{prefix}/:")
    except UnsafePathError as err:
        raise SourceError(f"model.source: {err}; nothing was downloaded (rename or remove that object)") from None


def remove_stale_partials(dest: Path) -> list[Path]:
    """Partial download folders of `dest` left by a process that is gone (kill -9, power loss)."""
    removed = []
    for path in dest.parent.glob(f"{dest.name}.partial*"):
        pid = path.name.rpartition("-")[2]
        if pid.isdigit() and pid_alive(int(pid)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _list_objects(client: Any, bucket: str, prefix: str) -> list[JsonObject]:
    out: list[JsonObject] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        out.extend(page.get("Contents", []))
    return out


def _short(err: Exception) -> str:
    text = str(err)
    return text if len(text) < 200 else text[:200] + "…"
