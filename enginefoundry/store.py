"""Artifact stores with one contract: streamed writes that hash as they read, atomic create-if-absent for
manifests, verified downloads. `file://` and `s3://` give the same guarantees (docs/architecture.md#store-layout)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import threading
from abc import ABC, abstractmethod
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

from enginefoundry.errors import StoreError
from enginefoundry.identity import CHUNK
from enginefoundry.s3 import s3_client, split_s3_uri

PART_SIZE = 16 * 1024 * 1024
MAX_PARALLEL_PARTS = 4  # memory in flight is bounded by PART_SIZE × this, whatever the file size


class Store(ABC):
    uri: str

    def url(self, key: str) -> str:
        return f"{self.uri}/{key}"

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def read_bytes(self, key: str) -> bytes: ...

    @abstractmethod
    def put_file(self, local: Path, key: str) -> tuple[int, str]:
        """Upload a file; return (size, sha256) computed in the same pass that reads it."""

    @abstractmethod
    def create_if_absent(self, key: str, data: bytes) -> bool:
        """Write `data` only if `key` does not exist; True when this call created it."""

    @abstractmethod
    def download(self, key: str, local: Path) -> str:
        """Download to `local`; return the sha256 of what was written."""

    @abstractmethod
    def list(self, prefix: str) -> list[str]: ...

    @abstractmethod
    def delete(self, key: str) -> None: ...


class FileStore(Store):
    def __init__(self, uri: str) -> None:
        self.root = Path(uri.removeprefix("file://")).expanduser().resolve()
        # Absolute, so URIs recorded in manifests and MLflow mean the same thing from any directory.
        self.uri = self.root.as_uri()

    def _path(self, key: str) -> Path:
        return self.root / key

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def read_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise StoreError(f"{self.url(key)} does not exist") from None

    def put_file(self, local: Path, key: str) -> tuple[int, str]:
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        h, size = hashlib.sha256(), 0
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".partial")
        try:
            with os.fdopen(fd, "wb") as out, local.open("rb") as src:
                while chunk := src.read(CHUNK):
                    h.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, dest)  # readers see the old file or the whole new one, never a part
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return size, h.hexdigest()

    def create_if_absent(self, key: str, data: bytes) -> bool:
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".partial")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            try:
                os.link(tmp, dest)  # atomic, and fails if dest exists: the file:// If-None-Match
            except FileExistsError:
                return False
            return True
        finally:
            Path(tmp).unlink(missing_ok=True)

    def download(self, key: str, local: Path) -> str:
        local.parent.mkdir(parents=True, exist_ok=True)
        h = hashlib.sha256()
        try:
            with self._path(key).open("rb") as src, local.open("wb") as out:
                while chunk := src.read(CHUNK):
                    h.update(chunk)
                    out.write(chunk)
        except FileNotFoundError:
            raise StoreError(f"{self.url(key)} does not exist") from None
        return h.hexdigest()

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix)
        if not base.exists():
            return []
        return sorted(p.relative_to(self.root).as_posix() for p in base.rglob("*")
                      if p.is_file() and not p.name.endswith(".partial"))

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)


class S3Store(Store):
    def __init__(self, uri: str, endpoint_url: str | None = None) -> None:
        self.uri = uri.rstrip("/")
        self.bucket, self.prefix = split_s3_uri(uri)
        self.client = s3_client(endpoint_url)
        self._lock = threading.Lock()

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, what: str, fn, **kwargs):
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(**kwargs)
        except ClientError as err:
            code = err.response.get("Error", {}).get("Code", "?")
            raise StoreError(f"{what} failed on {self.uri}: {code}") from None
        except BotoCoreError as err:
            raise StoreError(f"{what} failed on {self.uri}: {type(err).__name__}: {err}") from None

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise StoreError(f"cannot check {self.url(key)}: {err.response.get('Error', {}).get('Code')}") from None

    def read_bytes(self, key: str) -> bytes:
        resp = self._call(f"reading {self.url(key)}", self.client.get_object, Bucket=self.bucket, Key=self._key(key))
        return resp["Body"].read()

    def put_file(self, local: Path, key: str) -> tuple[int, str]:
        size = local.stat().st_size
        if size <= PART_SIZE:
            data = local.read_bytes()
            self._call(f"uploading {self.url(key)}", self.client.put_object, Bucket=self.bucket,
                       Key=self._key(key), Body=data)
            return size, hashlib.sha256(data).hexdigest()
        return self._multipart(local, key)

    def _multipart(self, local: Path, key: str) -> tuple[int, str]:
        """Parts are read (and hashed) in order by this thread and uploaded by a small pool; at most
        MAX_PARALLEL_PARTS parts are in memory. botocore retries each part; a failure aborts the upload."""
        k = self._key(key)
        up = self._call(f"starting upload of {self.url(key)}", self.client.create_multipart_upload,
                        Bucket=self.bucket, Key=k)
        upload_id = up["UploadId"]
        h, size, parts = hashlib.sha256(), 0, []
        pending: set[Future[dict[str, object]]] = set()

        def send(number: int, body: bytes) -> dict[str, object]:
            r = self._call(f"uploading part {number} of {self.url(key)}", self.client.upload_part,
                           Bucket=self.bucket, Key=k, UploadId=upload_id, PartNumber=number, Body=body)
            return {"PartNumber": number, "ETag": r["ETag"]}

        try:
            with ThreadPoolExecutor(MAX_PARALLEL_PARTS) as pool, local.open("rb") as src:
                number = 0
                while body := src.read(PART_SIZE):
                    number += 1
                    h.update(body)
                    size += len(body)
                    if len(pending) >= MAX_PARALLEL_PARTS:
                        done, pending = wait(pending, return_when=FIRST_COMPLETED)
                        parts.extend(f.result() for f in done)
                    pending.add(pool.submit(send, number, body))
                parts.extend(f.result() for f in pending)
            parts.sort(key=lambda p: p["PartNumber"])  # type: ignore[arg-type,return-value]
            self._call(f"completing upload of {self.url(key)}", self.client.complete_multipart_upload,
                       Bucket=self.bucket, Key=k, UploadId=upload_id, MultipartUpload={"Parts": parts})
        except BaseException:
            # The server may be gone; the original error is the one to report.
            with contextlib.suppress(Exception):
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=k, UploadId=upload_id)
            raise
        return size, h.hexdigest()

    def create_if_absent(self, key: str, data: bytes) -> bool:
        from botocore.exceptions import ClientError

        try:
            # Conditional write: two runs racing on one key publish once (docs/architecture.md#store-layout).
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*",
                                   ContentType="application/json")
            return True
        except ClientError as err:
            code = err.response.get("Error", {}).get("Code")
            status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
                return False
            raise StoreError(f"writing {self.url(key)} failed: {code}") from None

    def download(self, key: str, local: Path) -> str:
        local.parent.mkdir(parents=True, exist_ok=True)
        resp = self._call(f"downloading {self.url(key)}", self.client.get_object,
                          Bucket=self.bucket, Key=self._key(key))
        h = hashlib.sha256()
        with local.open("wb") as out:
            for chunk in resp["Body"].iter_chunks(CHUNK):
                h.update(chunk)
                out.write(chunk)
        return h.hexdigest()

    def list(self, prefix: str) -> list[str]:
        out = []
        full = self._key(prefix)
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full)
        for page in pages:
            for obj in page.get("Contents", []):
                out.append(obj["Key"][len(self.prefix) + 1 :] if self.prefix else obj["Key"])
        return sorted(out)


    def delete(self, key: str) -> None:
        self._call(f"deleting {self.url(key)}", self.client.delete_object, Bucket=self.bucket, Key=self._key(key))


def open_store(uri: str, endpoint_url: str | None = None) -> Store:
    if uri.startswith("file://"):
        return FileStore(uri)
    if uri.startswith("s3://"):
        return S3Store(uri, endpoint_url)
    raise StoreError(f"unknown store URI '{uri}': use s3://bucket/prefix or file://path")
