"""Confinement of names and paths that come from outside (S3 keys, URI prefixes, spec names).

Everything from outside is hostile: a relative path is accepted only as plain POSIX segments (no `..`, no
`.`, no empty segment, no backslash, no control character, not absolute), and a file is written only after
checking that the joined path stays under its root. The rules follow git's path checks (`verify_path` in
git's read-cache.c refuses `.`, `..` and `.git` components) and the OCI distribution spec's repository name
grammar (a safe charset, separators not repeated).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path, PurePosixPath

# A name that becomes one path component (model, variant, profile, target, unit, spec names).
SAFE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
_SAFE_NAME = re.compile(SAFE_NAME)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class UnsafePathError(ValueError):
    """A path or name from outside that would leave its root or is not a plain name."""


def check_name(name: str, what: str = "name") -> str:
    """One path component from outside: letters, digits, `.`, `_`, `-`; not `.`/`..`; at most 100 chars."""
    if not _SAFE_NAME.fullmatch(name) or name in (".", "..") or ".." in name:
        raise UnsafePathError(
            f"{what} '{_show(name)}' is not a safe name: use letters, digits, '.', '_' and '-' "
            "(starting with a letter or digit, no '..', at most 100 characters)"
        )
    return name


def safe_relpath(rel: str, what: str = "path") -> PurePosixPath:
    """A relative POSIX path from outside, checked segment by segment; raises UnsafePathError."""
    reason = _unsafe_reason(rel)
    if reason:
        raise UnsafePathError(f"{what} '{_show(rel)}' is refused: {reason}")
    return PurePosixPath(rel)


def _unsafe_reason(rel: str) -> str | None:
    if not rel:
        return "it is empty"
    if _CONTROL.search(rel):
        return "it contains a control character"
    if "\\" in rel:
        return "it contains a backslash"
    if rel.startswith("/") or re.match(r"^[A-Za-z]:", rel):
        return "it is absolute"
    parts = rel.split("/")
    if any(p == ".." for p in parts):
        return "it contains a '..' segment"
    if any(p == "." for p in parts):
        return "it contains a '.' segment"
    if any(p == "" for p in parts):
        return "it contains an empty segment ('//' or a trailing '/')"
    return None


def confined_join(root: Path, rel: str, what: str = "path") -> Path:
    """root / rel, refused unless rel is a safe relative path and the result (symlinks resolved) stays in root."""
    target = root / safe_relpath(rel, what)
    real_root = os.path.realpath(root)
    real = os.path.realpath(target)
    if os.path.commonpath([real_root, real]) != real_root:
        raise UnsafePathError(f"{what} '{_show(rel)}' is refused: it resolves outside {root}")
    return target


def normalise_prefix(prefix: str, what: str = "prefix") -> str:
    """An S3 prefix or store sub-path: leading/trailing/repeated slashes dropped, `..`/`.`/backslash refused."""
    if _CONTROL.search(prefix) or "\\" in prefix:
        raise UnsafePathError(f"{what} '{_show(prefix)}' is refused: it contains a backslash or control character")
    parts = [p for p in prefix.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise UnsafePathError(f"{what} '{_show(prefix)}' is refused: it contains a '.' or '..' segment")
    return "/".join(parts)


def symlinks_leaving(root: Path, allowed_roots: tuple[Path, ...] = (), max_entries: int | None = None) -> list[Path]:
    """Symlinks under root (not followed while walking) whose target resolves outside root and allowed_roots.
    With `max_entries`, UnsafePathError as soon as the walk meets more entries than that (a folder that is not
    what it claims to be is refused before it is walked)."""
    real_roots = [os.path.realpath(r) for r in (root, *allowed_roots)]
    bad = []
    seen = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        seen += len(dirnames) + len(filenames)
        if max_entries is not None and seen > max_entries:
            raise UnsafePathError(f"{root} holds more than {max_entries} files and folders")
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            if not path.is_symlink():
                continue
            real = os.path.realpath(path)
            if not any(os.path.commonpath([r, real]) == r for r in real_roots):
                bad.append(path)
    return sorted(bad)


_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]")


def printable(text: str, limit: int = 200) -> str:
    """Text someone else wrote (a store object's field, a signer's name), safe to print on one line: every control
    character, line separator and bidirectional override shown as its escape (`\x1b`, `\u202e`), the rest as it
    is, at most `limit` characters."""
    shown = _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))
    return shown if len(shown) <= limit else shown[:limit] + "…"


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of a file a user named, bounded: a regular file (a link to one is fine) of at most `limit` bytes.
    ValueError saying why not: a FIFO or device is refused before any read (no hang on a pipe nobody writes, no
    endless read of /dev/zero), and so is a larger file; OSError when it cannot be opened."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file (a pipe, device or folder)")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"larger than {limit} bytes")
    return data


def _show(text: str) -> str:
    """A hostile value shown in a one-line message: control characters escaped, length limited."""
    shown = text.encode("unicode_escape").decode("ascii")
    return shown if len(shown) <= 200 else shown[:200] + "…"


def relative_posix(path: str, what: str) -> str:
    """`path` if it is a relative POSIX path that stays under its root; else ValueError naming `what`.

    Refused: empty, absolute, backslashes, NUL, empty or `.` segments, `..` anywhere (stricter than
    normalising: a path that needs normalising is not one this project wrote)."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"{what}: empty path")
    problems = []
    if "\x00" in path:
        problems.append("contains NUL")
    if "\\" in path:
        problems.append("contains a backslash")
    if path.startswith("/"):
        problems.append("is absolute")
    parts = path.split("/")
    if any(p == "" for p in (parts[1:] if path.startswith("/") else parts)):
        problems.append("has an empty segment")
    if any(p == "." for p in parts):
        problems.append("has a '.' segment")
    if any(p == ".." for p in parts):
        problems.append("has a '..' segment")
    if problems:
        raise ValueError(f"{what}: {path!r} {' and '.join(dict.fromkeys(problems))}: "
                         "only relative POSIX paths inside the root are allowed")
    return path
