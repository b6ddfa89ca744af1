"""Artifact stores with one contract: streamed writes that hash as they read, content-addressed blobs written
once with a conditional create, a compare-and-swap for small pointers, verified downloads. `file://` and
`s3://` give the same guarantees (docs/architecture.md#store-layout).

Every store key is a relative POSIX path confined under the store root (`store_key`); a `file://` store never
follows a symlink inside its root: a blob, manifest or folder that is a symlink is reported as corrupt.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import socket
import stat
import tempfile
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from pydantic import BaseModel

from enginefoundry.catalog.schemes import SchemeKind, scheme_of, store_forms
from enginefoundry.confine import relative_posix
from enginefoundry.errors import StoreError, naming_full_disk, store_error
from enginefoundry.identity import CHUNK
from enginefoundry.runner import pid_alive
from enginefoundry.store.layout import blob_key, is_blob_key, quarantine_key
from enginefoundry.store.s3 import s3_client, split_s3_uri

if TYPE_CHECKING:
    from botocore.exceptions import ClientError

PART_SIZE = 16 * 1024 * 1024
MAX_PARALLEL_PARTS = 4  # memory in flight is bounded by PART_SIZE × this, whatever the file size


def store_key(key: str) -> str:
    """A store key, confined under the store root; StoreError when it would leave it."""
    try:
        return relative_posix(key, "store key")
    except ValueError as err:
        raise StoreError(str(err)) from None


def current_umask() -> int:
    """The process umask without changing it (Linux ≥ 4.7 reports it in /proc/self/status)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


def file_mode(executable: bool) -> int:
    """Mode of a file this project writes: 0666 (0777 for executables) less the umask, as `open` would give."""
    return (0o777 if executable else 0o666) & ~current_umask()


def link_or_copy(src: str | Path, dst: str | Path) -> None:
    """Hard-link src to dst (same filesystem), else copy it. Usable as shutil.copytree's copy_function. Only
    between files this project owns in its work folder (a work checkpoint and the bundle made from it): never
    from a user's folder (`clone_or_copy`) and never into or out of a store (blobs own their inodes)."""
    try:
        os.link(os.path.realpath(src), dst)
    except OSError as err:
        if err.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
        shutil.copy2(src, dst)


FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int), the reflink ioctl (btrfs, XFS with reflink, bcachefs)


def clone_fd(src: int, dst: int) -> None:
    """Copy the whole of `src` into the empty `dst` without a userspace copy: a reflink where the filesystem
    shares extents copy-on-write (a write to either file never shows in the other), else copy_file_range(2)
    (in-kernel), else read/write. Either way `dst` is its own inode: nothing written through one name reaches
    the other."""
    try:
        fcntl.ioctl(dst, FICLONE, src)
        return
    except OSError as err:
        if err.errno not in (errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.EPERM, errno.ENOSYS):
            raise
    size, done = os.fstat(src).st_size, 0
    try:
        while done < size:
            n = os.copy_file_range(src, dst, size - done, done, done)
            if n == 0:
                break
            done += n
        return
    except OSError as err:
        if err.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM) or done:
            raise
    while chunk := os.pread(src, CHUNK, done):
        os.pwrite(dst, chunk, done)
        done += len(chunk)


def clone_or_copy(src: str | Path, dst: str | Path) -> None:
    """A new file `dst` with `src`'s bytes and permission bits, never a hard link (`clone_fd`): what a work folder
    takes from a user's checkpoint. `dst` must not exist (O_EXCL: never written through an existing name).
    Usable as shutil.copytree's copy_function."""
    with open(os.path.realpath(src), "rb") as fin:
        mode = os.fstat(fin.fileno()).st_mode & 0o777
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode | 0o200)
        try:
            clone_fd(fin.fileno(), fd)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)


class BlobPut(BaseModel):
    digest: str
    size: int
    uploaded: bool  # False when the blob already existed (its size, with `verify_existing` its sha256, checked)
    quarantined: str | None = None  # where a corrupt blob of this digest was moved before this one was written


BLOB_MODE = 0o444  # blobs are read-only on disk: written once, never through any name


class Store(ABC):
    uri: str

    def url(self, key: str) -> str:
        return f"{self.uri}/{store_key(key)}"

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def size(self, key: str) -> int | None:
        """Size of the object (HEAD / lstat), None when absent; StoreError when it is not a regular object."""

    @abstractmethod
    def read_bytes(self, key: str) -> bytes: ...

    @abstractmethod
    def iter_bytes(self, key: str) -> Iterator[bytes]:
        """The object's bytes in chunks of at most CHUNK: memory stays flat whatever its size."""

    @abstractmethod
    def put_file(self, local: Path, key: str) -> tuple[int, str]:
        """Upload a file; return (size, sha256) computed in the same pass that reads it."""

    def put_blob(self, local: Path, verify_existing: bool = False) -> BlobPut:
        """Store a file as blobs/sha256/<ab>/<digest>, written once with a conditional create. A blob that
        exists already is not written again; its size is checked (with `verify_existing` its sha256 too: `run
        --force`). A blob that is corrupt (wrong size or bytes, a symlink) holds bytes that are not its name's:
        it is quarantined (`quarantine`) and written again from `local`, once."""
        try:
            put = self._put_blob(local)
            if verify_existing and not put.uploaded and self.sha256_of(blob_key(put.digest)) != put.digest:
                raise CorruptObject(blob_key(put.digest), f"{self.url(blob_key(put.digest))} is corrupt: its bytes "
                                    "do not hash to its name")
            return put
        except CorruptObject as err:
            moved = self.quarantine(err.key)
            return self._put_blob(local).model_copy(update={"quarantined": moved and self.url(moved)})

    def sha256_of(self, key: str) -> str | None:
        """The sha256 of an object's bytes, streamed; None when it is absent or not a regular object."""
        h = hashlib.sha256()
        try:
            for chunk in self.iter_bytes(key):
                h.update(chunk)
        except StoreError:
            return None
        return h.hexdigest()

    def quarantine(self, key: str) -> str | None:
        """Move an object that failed verification aside, to `quarantine/<key>.<time>-<random>` (kept for a
        person to look at, never read by a build), so that the next publish writes a fresh one under its name.
        The quarantine key, None when the object was already gone."""
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        return self._move_aside(store_key(key), quarantine_key(store_key(key), f"{stamp}-{os.urandom(3).hex()}"))

    @abstractmethod
    def _move_aside(self, key: str, dest: str) -> str | None: ...

    @abstractmethod
    def _put_blob(self, local: Path) -> BlobPut: ...

    @abstractmethod
    def create_if_absent(self, key: str, data: bytes) -> bool:
        """Write `data` only if `key` does not exist; True when this call created it."""

    @abstractmethod
    def read_versioned(self, key: str) -> tuple[bytes, str] | None:
        """(data, version tag) of a small object, None when absent. The tag feeds `replace_if`. It is a digest of
        the content (the S3 ETag; sha256 on file://), so writers must never write the same bytes twice: a
        pointer names a unique build id, which rules out an A-B-A passing for "unchanged"."""

    @abstractmethod
    def replace_if(self, key: str, data: bytes, version: str | None) -> str | None:
        """Compare-and-swap: write `data` only if the object's version tag is still `version` (None: only if
        absent). The new version tag when this call wrote it (for the next `replace_if`/`delete_if`), else None."""

    @abstractmethod
    def delete_if(self, key: str, version: str) -> bool:
        """Delete the object only if its version tag is still `version`; True when this call deleted it."""

    def download(self, key: str, local: Path) -> str:
        """Download to `local`; return the sha256 of what was written."""
        local.parent.mkdir(parents=True, exist_ok=True)
        h = hashlib.sha256()
        with local.open("wb") as out:
            for chunk in self.iter_bytes(key):
                h.update(chunk)
                out.write(chunk)
        return h.hexdigest()

    @abstractmethod
    def list(self, prefix: str) -> list[str]: ...

    @abstractmethod
    def delete(self, key: str) -> None: ...

    def local_path(self, key: str) -> Path | None:
        """The object as a local regular file (file:// stores), for hard links; None elsewhere."""
        return None


def _sha256_of(path: Path) -> tuple[int, str, os.stat_result]:
    h, size = hashlib.sha256(), 0
    with path.open("rb") as src:
        before = os.fstat(src.fileno())
        while chunk := src.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest(), before


TEMP_DIR = ".tmp"


class FileStore(Store):
    def __init__(self, uri: str) -> None:
        row = scheme_of(uri)
        self.root = Path(row.body(uri) if row else uri).expanduser().resolve()
        # Absolute, so URIs recorded in manifests and MLflow mean the same thing from any directory.
        self.uri = self.root.as_uri()
        self._swept = False

    def _path(self, key: str) -> Path:
        """The key's path; StoreError if the key leaves the root or any folder on the way is a symlink."""
        parts = store_key(key).split("/")
        at = self.root
        for part in parts[:-1]:
            at = at / part
            try:
                if stat.S_ISLNK(os.lstat(at).st_mode):
                    raise StoreError(f"{self.url(key)} is corrupt: {at} is a symlink (a store never follows one)")
            except FileNotFoundError:
                break
        return self.root.joinpath(*parts)

    def _lstat(self, key: str) -> os.stat_result | None:
        path = self._path(key)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(st.st_mode):
            kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            raise CorruptObject(key, f"{self.url(key)} is corrupt: it is {kind} (a store never follows one)")
        return st

    def _open(self, key: str) -> int:
        try:
            return os.open(self._path(key), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise StoreError(f"{self.url(key)} does not exist") from None
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise StoreError(f"{self.url(key)} is corrupt: it is a symlink (a store never follows one)") from None
            raise

    def exists(self, key: str) -> bool:
        return self._lstat(key) is not None

    def size(self, key: str) -> int | None:
        st = self._lstat(key)
        return None if st is None else st.st_size

    def local_path(self, key: str) -> Path | None:
        return self._path(key) if self._lstat(key) is not None else None

    def read_bytes(self, key: str) -> bytes:
        return b"".join(self.iter_bytes(key))

    def iter_bytes(self, key: str) -> Iterator[bytes]:
        fd = self._open(key)
        with os.fdopen(fd, "rb") as src:
            if not stat.S_ISREG(os.fstat(src.fileno()).st_mode):
                raise StoreError(f"{self.url(key)} is corrupt: not a regular file")
            while chunk := src.read(CHUNK):
                yield chunk

    def _temp_dir(self) -> Path:
        """Where writers stage files: `<root>/.tmp`, on the store's filesystem (so link/rename into place is
        atomic) but outside every published folder. Temp files are named `<host>.<pid>.<random>.partial`; the
        first write of each FileStore removes those of dead processes of this host (a kill -9 mid-write)."""
        tmp_dir = self.root / TEMP_DIR
        if not self._swept:
            tmp_dir.mkdir(parents=True, exist_ok=True)
            host = socket.gethostname()
            for leftover in tmp_dir.glob(f"{host}.*.partial"):
                pid = leftover.name[len(host) + 1:].split(".", 1)[0]
                if pid.isdigit() and not pid_alive(int(pid)):
                    leftover.unlink(missing_ok=True)
            self._swept = True
        return tmp_dir

    def _write_temp(self, dest: Path, chunks: Iterator[bytes], mode: int) -> tuple[str, int, str]:
        """Write to a temp file in the store's temp folder (fsync'd, mode set); return (temp path, size, sha256)."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self._temp_dir(), prefix=f"{socket.gethostname()}.{os.getpid()}.",
                                   suffix=".partial")
        h, size = hashlib.sha256(), 0
        try:
            with naming_full_disk(dest, f"free space in {self.root}'s filesystem"), os.fdopen(fd, "wb") as out:
                for chunk in chunks:
                    h.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
                out.flush()
                os.fchmod(out.fileno(), mode)
                os.fsync(out.fileno())
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return tmp, size, h.hexdigest()

    def put_file(self, local: Path, key: str) -> tuple[int, str]:
        dest = self._path(key)
        with local.open("rb") as src:
            tmp, size, digest = self._write_temp(dest, iter(lambda: src.read(CHUNK), b""), file_mode(False))
        try:
            os.replace(tmp, dest)  # readers see the old file or the whole new one, never a part
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return size, digest

    def _put_blob(self, local: Path) -> BlobPut:
        """Hash the file; a blob that exists costs nothing more. Else copy it into the store's temp folder
        (`clone_fd`: a reflink where the filesystem offers one, an in-kernel copy otherwise), read-only, and link
        the temp file into place: the final name appears atomically and only if absent (link(2) fails on an
        existing name). The blob is its own inode, never a link to `local`: a write to the user's file cannot
        change a published blob, nor a write to a blob the user's file. A file that changed between the hash
        and the copy (its inode's size, mtime or ctime moved) is copied again, hashing as it is read."""
        size, digest, before = _sha256_of(local)
        key = blob_key(digest)
        if (existing := self.size(key)) is not None:
            put = self._existing(key, digest, size, existing)
            self._own(key, digest)
            return put
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._clone_temp(local, before)
        if tmp is None:  # changed while hashing: a copy that hashes what it writes
            with local.open("rb") as src:
                tmp, size, copied_digest = self._write_temp(dest, iter(lambda: src.read(CHUNK), b""), BLOB_MODE)
            if copied_digest != digest:
                Path(tmp).unlink(missing_ok=True)
                raise StoreError(f"{local} changed while it was being published; publish again")
        try:
            try:
                os.link(tmp, dest)
            except FileExistsError:
                return self._existing(key, digest, size, self.size(key))
        finally:
            Path(tmp).unlink(missing_ok=True)
        return BlobPut(digest=digest, size=size, uploaded=True)

    def _own(self, key: str, digest: str) -> None:
        """A blob with other names (hard-linked into work folders by releases before issue 21) becomes a private
        read-only copy: copied, hashed, renamed over the shared name (same bytes, so readers see no change)."""
        dest = self._path(key)
        st = os.lstat(dest)
        if st.st_nlink == 1:
            if stat.S_IMODE(st.st_mode) != BLOB_MODE:
                os.chmod(dest, BLOB_MODE)
            return
        tmp = self._clone_temp(dest, st)
        if tmp is None or _sha256_of(Path(tmp))[1] != digest:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
            return  # changed under us: the next check of the blob reports it
        os.replace(tmp, dest)

    def _clone_temp(self, local: Path, before: os.stat_result) -> str | None:
        """A read-only, fsync'd copy of `local` in the temp folder, or None when `local` is not the file that was
        hashed any more (another inode, size, mtime or ctime: ctime cannot be set back by a writer)."""
        fd, tmp = tempfile.mkstemp(dir=self._temp_dir(), prefix=f"{socket.gethostname()}.{os.getpid()}.",
                                   suffix=".partial")
        try:
            with open(local, "rb") as src:
                clone_fd(src.fileno(), fd)
                after = os.fstat(src.fileno())
            same = [(s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns) for s in (before, after)]
            if same[0] != same[1] or os.fstat(fd).st_size != before.st_size:
                os.close(fd)
                Path(tmp).unlink(missing_ok=True)
                return None
            os.fchmod(fd, BLOB_MODE)
            os.fsync(fd)
            os.close(fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            Path(tmp).unlink(missing_ok=True)
            raise
        return tmp

    def _existing(self, key: str, digest: str, size: int, existing: int | None) -> BlobPut:
        if existing != size:
            raise CorruptObject(key, f"{self.url(key)} is corrupt: {existing} bytes, but content with this sha256 "
                                f"has {size}")
        return BlobPut(digest=digest, size=size, uploaded=False)

    def create_if_absent(self, key: str, data: bytes) -> bool:
        dest = self._path(key)
        blob = is_blob_key(store_key(key))  # a signed bundle: read-only like every blob
        tmp, _, _ = self._write_temp(dest, iter([data]), BLOB_MODE if blob else file_mode(False))
        try:
            try:
                os.link(tmp, dest)  # atomic, and fails if dest exists: the file:// If-None-Match
            except FileExistsError:
                return False
            return True
        finally:
            Path(tmp).unlink(missing_ok=True)

    def read_versioned(self, key: str) -> tuple[bytes, str] | None:
        if self._lstat(key) is None:
            return None
        data = self.read_bytes(key)
        return data, hashlib.sha256(data).hexdigest()

    @contextlib.contextmanager
    def _cas_lock(self, key: str) -> Iterator[Path]:
        """An exclusive flock on a hidden lock file beside the object: the kernel drops it when its holder
        dies, so it never goes stale. Every compare-and-swap of a `file://` store runs under it."""
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        lock = dest.with_name(f".{dest.name}.lock")
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield dest
        finally:
            os.close(fd)  # releases the lock

    def replace_if(self, key: str, data: bytes, version: str | None) -> str | None:
        """Under the object's lock: compare the content's sha256, then atomic rename."""
        with self._cas_lock(key) as dest:
            current = self.read_versioned(key)
            if (current[1] if current else None) != version:
                return None
            tmp, _, _ = self._write_temp(dest, iter([data]), file_mode(False))
            try:
                os.replace(tmp, dest)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            return hashlib.sha256(data).hexdigest()

    def delete_if(self, key: str, version: str) -> bool:
        with self._cas_lock(key) as dest:
            current = self.read_versioned(key)
            if current is None or current[1] != version:
                return False
            dest.unlink()
            return True

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix.rstrip("/")) if prefix.strip("/") else self.root
        if not base.is_dir() or base.is_symlink():
            return []
        out = []
        for dirpath, dirnames, filenames in os.walk(base):  # os.walk does not descend into symlinked folders
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for name in filenames:  # regular files only: a symlinked object is corrupt, reading it says so
                if not name.startswith(".") and not os.path.islink(os.path.join(dirpath, name)):
                    out.append((Path(dirpath) / name).relative_to(self.root).as_posix())
        return sorted(out)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def _move_aside(self, key: str, dest: str) -> str | None:
        """rename(2): atomic, and a symlink is moved as the link (never followed)."""
        src, target = self._path(key), self._path(dest)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(src, target)
        except FileNotFoundError:
            return None
        return dest


class _Part(TypedDict):
    """One uploaded part, as CompleteMultipartUpload lists it."""

    PartNumber: int
    ETag: str


class S3Store(Store):
    def __init__(self, uri: str, endpoint_url: str | None = None) -> None:
        self.uri = uri.rstrip("/")
        self.bucket, prefix = split_s3_uri(uri)
        self.prefix = store_key(prefix) if prefix else ""
        self.client = s3_client(endpoint_url)
        self._lock = threading.Lock()

    def _key(self, key: str) -> str:
        key = store_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, what: str, fn: Callable[..., Any], **kwargs: object) -> dict[str, Any]:  # JSON edge: S3 response
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            response: dict[str, Any] = fn(**kwargs)  # JSON edge: an S3 API response (boto3)
            return response
        except ClientError as err:
            code = err.response.get("Error", {}).get("Code", "?")
            raise store_error(f"{what} failed on {self.uri}: {code}", err) from None
        except BotoCoreError as err:
            raise store_error(f"{what} failed on {self.uri}: {type(err).__name__}: {err}", err) from None

    @staticmethod
    def _precondition_failed(err: ClientError) -> bool:
        code = err.response.get("Error", {}).get("Code")
        status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412)

    def _head(self, key: str) -> dict[str, Any] | None:  # JSON edge: HeadObject's response
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            # JSON edge: HeadObject's response
            head: dict[str, Any] = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            return head
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise store_error(
                f"cannot check {self.url(key)}: {err.response.get('Error', {}).get('Code')}", err) from None
        except BotoCoreError as err:
            raise store_error(f"cannot check {self.url(key)}: {type(err).__name__}: {err}", err) from None

    def exists(self, key: str) -> bool:
        return self._head(key) is not None

    def size(self, key: str) -> int | None:
        head = self._head(key)
        return None if head is None else int(head["ContentLength"])

    def read_bytes(self, key: str) -> bytes:
        resp = self._call(f"reading {self.url(key)}", self.client.get_object, Bucket=self.bucket, Key=self._key(key))
        data: bytes = resp["Body"].read()
        return data

    def iter_bytes(self, key: str) -> Iterator[bytes]:
        resp = self._call(f"reading {self.url(key)}", self.client.get_object, Bucket=self.bucket, Key=self._key(key))
        yield from resp["Body"].iter_chunks(CHUNK)

    def put_file(self, local: Path, key: str) -> tuple[int, str]:
        return self._upload(local, key, conditional=False)

    def _upload(self, local: Path, key: str, *, conditional: bool) -> tuple[int, str]:
        """Upload, hashing in the same pass; with `conditional`, If-None-Match: * (PUT or multipart complete;
        SeaweedFS 4.48 honours both, checked against the test server). StoreError('exists') when refused."""
        size = local.stat().st_size
        extra = {"IfNoneMatch": "*"} if conditional else {}
        if size <= PART_SIZE:
            data = local.read_bytes()
            from botocore.exceptions import ClientError

            try:
                self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, **extra)
            except ClientError as err:
                if conditional and self._precondition_failed(err):
                    raise _Exists from None
                raise store_error(f"uploading {self.url(key)} failed on {self.uri}: "
                                  f"{err.response.get('Error', {}).get('Code', '?')}", err) from None
            except Exception as err:
                raise store_error(
                    f"uploading {self.url(key)} failed on {self.uri}: {type(err).__name__}", err) from None
            return len(data), hashlib.sha256(data).hexdigest()
        return self._multipart(local, key, extra)

    def _multipart(self, local: Path, key: str, extra: dict[str, str]) -> tuple[int, str]:
        """Parts are read (and hashed) in order by this thread and uploaded by a small pool; at most
        MAX_PARALLEL_PARTS parts are in memory. botocore retries each part; a failure aborts the upload."""
        from botocore.exceptions import ClientError

        k = self._key(key)
        up = self._call(f"starting upload of {self.url(key)}", self.client.create_multipart_upload,
                        Bucket=self.bucket, Key=k)
        upload_id = up["UploadId"]
        h, size = hashlib.sha256(), 0
        parts: list[_Part] = []
        pending: set[Future[_Part]] = set()

        def send(number: int, body: bytes) -> _Part:
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
            parts.sort(key=lambda p: p["PartNumber"])
            try:
                self.client.complete_multipart_upload(Bucket=self.bucket, Key=k, UploadId=upload_id,
                                                      MultipartUpload={"Parts": parts}, **extra)
            except ClientError as err:
                if extra and self._precondition_failed(err):
                    raise _Exists from None
                raise store_error(f"completing upload of {self.url(key)} failed on {self.uri}: "
                                  f"{err.response.get('Error', {}).get('Code', '?')}", err) from None
        except BaseException:
            # The server may be gone; the original error is the one to report.
            with contextlib.suppress(Exception):
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=k, UploadId=upload_id)
            raise
        return size, h.hexdigest()

    def _put_blob(self, local: Path) -> BlobPut:
        """The name needs the digest, so a first pass hashes; a blob that exists is then only HEADed. A new
        one is uploaded with If-None-Match: *, hashing again in the upload pass: bytes that changed in
        between are refused instead of being stored under the wrong name."""
        size, digest, _ = _sha256_of(local)
        key = blob_key(digest)
        existing = self.size(key)
        if existing is None:
            try:
                sent, sent_digest = self._upload(local, key, conditional=True)
            except _Exists:
                existing = self.size(key)
            else:
                if sent_digest != digest:
                    with contextlib.suppress(Exception):
                        self.client.delete_object(Bucket=self.bucket, Key=self._key(key))
                    raise StoreError(f"{local} changed while it was being published; publish again")
                return BlobPut(digest=digest, size=sent, uploaded=True)
        if existing != size:
            raise CorruptObject(key, f"{self.url(key)} is corrupt: {existing} bytes, but content with this sha256 "
                                f"has {size}")
        return BlobPut(digest=digest, size=size, uploaded=False)

    def create_if_absent(self, key: str, data: bytes) -> bool:
        return self.replace_if(key, data, None) is not None

    def read_versioned(self, key: str) -> tuple[bytes, str] | None:
        from botocore.exceptions import ClientError

        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise store_error(
                f"reading {self.url(key)} failed: {err.response.get('Error', {}).get('Code')}", err) from None
        return resp["Body"].read(), resp["ETag"]

    def replace_if(self, key: str, data: bytes, version: str | None) -> str | None:
        """S3 conditional writes: If-Match on the ETag read, or If-None-Match: * for "only if absent"; the new
        ETag. SeaweedFS 4.48 honours both atomically (8 racing writers, 20 rounds, exactly one winner each;
        seaweedfs/seaweedfs weed/s3api/s3api_object_handlers_put.go, PutObjectHandler → checkConditionalHeaders).
        On AWS S3: https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html"""
        from botocore.exceptions import ClientError

        cond = {"IfMatch": version} if version is not None else {"IfNoneMatch": "*"}
        try:
            resp = self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data,
                                          ContentType="application/json", **cond)
        except ClientError as err:
            if self._precondition_failed(err) or err.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise store_error(
                f"writing {self.url(key)} failed: {err.response.get('Error', {}).get('Code')}", err) from None
        etag: str | None = resp.get("ETag")
        if etag:
            return etag
        found = self.read_versioned(key)  # a server that answers without an ETag: read it back
        return found[1] if found is not None and found[0] == data else ""

    def delete_if(self, key: str, version: str) -> bool:
        """DeleteObject with If-Match: SeaweedFS answers 412 on a mismatch (tests/integration/test_lease_s3.py)."""
        from botocore.exceptions import ClientError

        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key), IfMatch=version)
        except ClientError as err:
            if self._precondition_failed(err) or err.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return False
            raise store_error(
                f"deleting {self.url(key)} failed: {err.response.get('Error', {}).get('Code')}", err) from None
        return True

    def list(self, prefix: str) -> list[str]:
        out = []
        full = self._key(prefix.rstrip("/")) + ("/" if prefix.endswith("/") else "") if prefix.strip("/") else (
            f"{self.prefix}/" if self.prefix else "")
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full)
        for page in pages:
            for obj in page.get("Contents", []):
                out.append(obj["Key"][len(self.prefix) + 1 :] if self.prefix else obj["Key"])
        return sorted(out)

    def delete(self, key: str) -> None:
        self._call(f"deleting {self.url(key)}", self.client.delete_object, Bucket=self.bucket, Key=self._key(key))

    def _move_aside(self, key: str, dest: str) -> str | None:
        """Server-side copy to `dest`, then delete the original only if it is still the object copied (If-Match
        on its ETag): a blob that another publisher wrote again meanwhile is left in place."""
        head = self._head(key)
        if head is None:
            return None
        self._call(f"quarantining {self.url(key)}", self.client.copy,
                   CopySource={"Bucket": self.bucket, "Key": self._key(key)}, Bucket=self.bucket, Key=self._key(dest))
        return dest if self.delete_if(key, head["ETag"]) else None


class CorruptObject(StoreError):
    """An object in the store is not what its name says (wrong size for its digest, a symlink)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


class _Exists(Exception):
    """A conditional create found the object already there."""


# The backend of each kind of scheme (enginefoundry/catalog/schemes.py): a scheme row of an existing kind needs no
# code here; a new kind needs its Store class and a line (tests/unit/test_catalog.py checks every kind has one).
BACKENDS: dict[SchemeKind, Callable[[str, str | None], Store]] = {
    SchemeKind.LOCAL: lambda uri, _endpoint: FileStore(uri),
    SchemeKind.OBJECT: S3Store,
}


def open_store(uri: str, endpoint_url: str | None = None) -> Store:
    row = scheme_of(uri)
    if row is None:
        raise StoreError(f"unknown store URI '{uri}': use {store_forms()}")
    return BACKENDS[row.kind](uri, endpoint_url)
