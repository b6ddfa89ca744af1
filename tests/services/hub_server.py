"""A minimal git-backed Hugging Face Hub for offline tests.

It answers the few requests that ``huggingface_hub.snapshot_download`` and ``from_pretrained("org/name")``
send (revision info, tree listing, refs, HEAD/GET of ``/resolve/``) from plain git repositories laid out as
``<root>/<org>/<name>`` (models) and ``<root>/datasets/<org>/<name>`` (datasets). Error responses carry the
``X-Error-Code`` header the client maps to its exception classes, so tests see the same errors as against the
real Hub.

Run standalone:  python tests/services/hub_server.py --root DIR [--host 127.0.0.1] [--port N]
Use in tests:    seed_repo(root, "org/name", src_dir) and ``with serving(root) as base_url: ...``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

REPO_TYPES = {"models": "model", "datasets": "dataset"}
CHUNK = 1 << 20
# Fixed identity and date: seeding works without any git config, and the same files give the same commit sha.
GIT_ENV = {
    "GIT_AUTHOR_NAME": "enginefoundry-tests",
    "GIT_AUTHOR_EMAIL": "tests@enginefoundry.invalid",
    "GIT_COMMITTER_NAME": "enginefoundry-tests",
    "GIT_COMMITTER_EMAIL": "tests@enginefoundry.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+00:00",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+00:00",
}
# Neutralise user/global settings that would change what gets committed or block committing (signing hooks).
GIT_SAFE_CONFIG = ["-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false", "-c", "core.autocrlf=false"]


class HubError(Exception):
    """An error answered with the Hub's X-Error-Code convention."""

    def __init__(self, status: HTTPStatus, code: str, message: str, commit: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.commit = commit


# --- git access ---


@dataclass(frozen=True)
class TreeEntry:
    type: str  # "file" or "directory", as the Hub names them
    oid: str
    size: int
    path: str


class GitRepo:
    """Read-only view of one repository, addressed by --git-dir so git never discovers an enclosing repo."""

    def __init__(self, git_dir: Path) -> None:
        self.git_dir = git_dir

    def _git(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(["git", f"--git-dir={self.git_dir}", *args], capture_output=True, check=check)

    def resolve(self, revision: str) -> str | None:
        """Branch, tag or sha → commit sha, or None if it does not name a commit."""
        if not revision or revision.startswith("-"):  # never let a revision be parsed as an option
            return None
        proc = self._git("rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}", check=False)
        return proc.stdout.decode().strip() if proc.returncode == 0 else None

    def commit_time(self, commit: str) -> datetime:
        # %ct (epoch seconds) instead of %cI: independent of TZ, and we control the output format ourselves.
        out = self._git("log", "-1", "--format=%ct", commit).stdout.decode().strip()
        return datetime.fromtimestamp(int(out), tz=UTC)

    def ls_tree(self, commit: str, path: str = "", recursive: bool = False) -> list[TreeEntry]:
        args = ["ls-tree", "-l", "-z", "--full-tree"]
        if recursive:
            args += ["-r", "-t"]  # -t keeps the directory entries the Hub also lists
        args.append(commit)
        if path:
            args += ["--", path]
        raw = self._git(*args).stdout.decode()
        return [_parse_ls_tree_line(line) for line in raw.split("\0") if line]

    def entry(self, commit: str, path: str) -> TreeEntry | None:
        """The single entry at exactly `path`, or None."""
        matches = [e for e in self.ls_tree(commit, path) if e.path == path]
        return matches[0] if matches else None

    def list_dir(self, commit: str, path: str, recursive: bool) -> list[TreeEntry] | None:
        """Entries below directory `path` ("" = root), or None if it is not a directory at this commit."""
        if not path:
            return self.ls_tree(commit, recursive=recursive)
        node = self.entry(commit, path)
        if node is None or node.type != "directory":
            return None
        # The trailing slash makes ls-tree list the directory's contents rather than the directory itself.
        return self.ls_tree(commit, path + "/", recursive=recursive)

    def refs(self) -> list[tuple[str, str]]:
        """(full ref name, commit sha) for branches and tags; annotated tags are peeled to their commit."""
        fmt = "%(refname)%00%(objectname)%00%(*objectname)"
        raw = self._git("for-each-ref", f"--format={fmt}", "refs/heads", "refs/tags").stdout.decode()
        result = []
        for line in raw.splitlines():
            name, obj, peeled = line.split("\0")
            result.append((name, peeled or obj))
        return result

    def open_blob(self, oid: str) -> subprocess.Popen[bytes]:
        # Streamed rather than read whole, so serving a large checkpoint does not hold it in memory.
        return subprocess.Popen(
            ["git", f"--git-dir={self.git_dir}", "cat-file", "blob", oid], stdout=subprocess.PIPE
        )


def _parse_ls_tree_line(line: str) -> TreeEntry:
    # Format with -l: "<mode> <type> <oid> <size or '-'>\t<path>"
    meta, path = line.split("\t", 1)
    _mode, kind, oid, size = meta.split()
    return TreeEntry(
        type="directory" if kind == "tree" else "file",
        oid=oid,
        size=0 if size == "-" else int(size),
        path=path,
    )


def _git_dir(repo_dir: Path) -> Path | None:
    """The git dir of a non-bare or bare repository at exactly `repo_dir`, else None."""
    if (repo_dir / ".git").is_dir():
        return repo_dir / ".git"
    if (repo_dir / "HEAD").is_file() and (repo_dir / "objects").is_dir():
        return repo_dir
    return None


_SAFE_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def find_repo(root: Path, repo_type: str, org: str, name: str) -> GitRepo | None:
    # Whitelisted segments: a repo id can never climb out of `root`.
    if not (_SAFE_SEGMENT.match(org) and _SAFE_SEGMENT.match(name)):
        return None
    base = root / "datasets" if repo_type == "dataset" else root
    git_dir = _git_dir(base / org / name)
    return GitRepo(git_dir) if git_dir else None


# --- seeding ---


def _run_git(repo_dir: Path, *args: str) -> str:
    proc = subprocess.run(
        ["git", *GIT_SAFE_CONFIG, "-C", str(repo_dir), *args],
        capture_output=True,
        check=True,
        env={**os.environ, **GIT_ENV},
    )
    return proc.stdout.decode().strip()


def _has_head(repo_dir: Path) -> bool:
    probe = ["git", "-C", str(repo_dir), "rev-parse", "--verify", "--quiet", "HEAD"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def _replace_worktree(repo_dir: Path, src_dir: Path) -> None:
    """Make the work tree an exact copy of src_dir (files removed from src disappear from the next commit)."""
    for child in repo_dir.iterdir():
        if child.name == ".git":
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    shutil.copytree(src_dir, repo_dir, dirs_exist_ok=True)


def seed_repo(
    root: str | os.PathLike[str], repo_id: str, src_dir: str | os.PathLike[str], tag: str | None = None
) -> str:
    """Commit the contents of src_dir to branch main of <root>/<org>/<name>; returns the commit sha.

    The first call creates the repo; later calls commit on top of main (a new sha if anything changed, the
    current head otherwise). `tag`, if given, is (re)pointed at the resulting commit.
    """
    org, _, name = repo_id.partition("/")
    if not (org and name) or "/" in name:
        raise ValueError(f"repo_id must look like 'org/name', got {repo_id!r}")
    repo_dir = Path(root) / org / name
    if not (repo_dir / ".git").is_dir():
        repo_dir.mkdir(parents=True, exist_ok=True)
        _run_git(repo_dir, "init", "-q", "--initial-branch=main")
    _replace_worktree(repo_dir, Path(src_dir))
    # -f: a .gitignore shipped inside src_dir must not silently drop files from the served repo.
    _run_git(repo_dir, "add", "-A", "-f", ".")
    # Commit on the first call, or when anything changed; an unchanged tree keeps the current head.
    if not _has_head(repo_dir) or _run_git(repo_dir, "status", "--porcelain"):
        _run_git(repo_dir, "commit", "-q", "-m", f"Upload {repo_id}")
    if tag:
        _run_git(repo_dir, "tag", "-f", tag)
    return _run_git(repo_dir, "rev-parse", "HEAD")


# --- HTTP layer ---


def _format_time(moment: datetime) -> str:
    # huggingface_hub parses lastModified as %Y-%m-%dT%H:%M:%S.%fZ and raises ValueError on anything else
    # (git's %cI included); milliseconds, as the real Hub sends them.
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _split(path: str) -> list[str]:
    """Percent-decoded path segments. The client quotes revisions with safe='', so '/' inside one survives."""
    return [unquote(seg) for seg in path.split("/") if seg]


def _entry_not_found(path: str, revision: str, commit: str) -> HubError:
    # X-Repo-Commit on the 404 lets the client cache the miss in .no_exist/<commit>/ and stop asking.
    return HubError(HTTPStatus.NOT_FOUND, "EntryNotFound", f"{path} does not exist at {revision}", commit)


class HubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], root: Path, verbose: bool = False) -> None:
        super().__init__(address, HubHandler)
        self.root = root
        self.verbose = verbose


class HubHandler(BaseHTTPRequestHandler):
    # HTTP/1.1 keep-alive is what the client expects; it requires Content-Length on every response.
    protocol_version = "HTTP/1.1"
    server: HubServer

    def log_message(self, format: str, *args: object) -> None:
        if self.server.verbose:
            super().log_message(format, *args)

    def do_GET(self) -> None:
        self._dispatch(head=False)

    def do_HEAD(self) -> None:
        self._dispatch(head=True)

    # -- routing

    def _dispatch(self, head: bool) -> None:
        url = urlsplit(self.path)
        segments = _split(url.path)
        query = parse_qs(url.query)
        try:
            if segments[:1] == ["api"] and len(segments) >= 4 and segments[1] in REPO_TYPES:
                self._api(REPO_TYPES[segments[1]], segments[2], segments[3], segments[4:], query, head)
            elif len(segments) >= 5 and segments[0] == "datasets" and segments[3] == "resolve":
                self._resolve("dataset", segments[1], segments[2], segments[4], segments[5:], head)
            elif len(segments) >= 4 and segments[2] == "resolve":
                self._resolve("model", segments[0], segments[1], segments[3], segments[4:], head)
            else:
                # e.g. /api/agent-harnesses: the client treats a plain 404 as "not available".
                raise HubError(HTTPStatus.NOT_FOUND, "NotFound", f"No route for {url.path}")
        except HubError as err:
            self._send_error(err, head)

    def _api(
        self, repo_type: str, org: str, name: str, rest: list[str], query: dict[str, list[str]], head: bool
    ) -> None:
        repo = self._repo(repo_type, org, name)
        if not rest:
            self._send_json(self._info(repo, repo_type, org, name, "main"), head)
        elif rest[0] == "revision" and len(rest) == 2:
            self._send_json(self._info(repo, repo_type, org, name, rest[1]), head)
        elif rest[0] == "tree" and len(rest) >= 2:
            recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
            self._send_json(self._tree(repo, rest[1], "/".join(rest[2:]), recursive), head)
        elif rest == ["refs"]:
            self._send_json(self._refs(repo), head)
        else:
            raise HubError(HTTPStatus.NOT_FOUND, "NotFound", f"Unknown API route {'/'.join(rest)}")

    # -- API handlers

    def _repo(self, repo_type: str, org: str, name: str) -> GitRepo:
        repo = find_repo(self.server.root, repo_type, org, name)
        if repo is None:
            # The Hub answers 401 (not 404) for unknown repos so as not to reveal private ones; mirror that.
            raise HubError(HTTPStatus.UNAUTHORIZED, "RepoNotFound", f"Repository Not Found for {org}/{name}")
        return repo

    @staticmethod
    def _commit(repo: GitRepo, revision: str) -> str:
        commit = repo.resolve(revision)
        if commit is None:
            raise HubError(HTTPStatus.NOT_FOUND, "RevisionNotFound", f"Invalid rev id: {revision}")
        return commit

    def _info(self, repo: GitRepo, repo_type: str, org: str, name: str, revision: str) -> dict[str, object]:
        commit = self._commit(repo, revision)
        repo_id = f"{org}/{name}"
        info: dict[str, object] = {
            "_id": repo_id,
            "id": repo_id,
            "author": org,
            "sha": commit,
            "private": False,
            "gated": False,
            "disabled": False,
            "lastModified": _format_time(repo.commit_time(commit)),
            "tags": [],
            # hub 0.x clients take the file list from here instead of calling the tree endpoint.
            "siblings": [
                {"rfilename": e.path} for e in repo.ls_tree(commit, recursive=True) if e.type == "file"
            ],
        }
        if repo_type == "model":
            info["modelId"] = repo_id
        return info

    def _tree(self, repo: GitRepo, revision: str, path: str, recursive: bool) -> list[dict[str, object]]:
        commit = self._commit(repo, revision)
        entries = repo.list_dir(commit, path, recursive)
        if entries is None:
            raise _entry_not_found(path, revision, commit)
        return [{"type": e.type, "oid": e.oid, "size": e.size, "path": e.path} for e in entries]

    @staticmethod
    def _refs(repo: GitRepo) -> dict[str, object]:
        branches, tags = [], []
        for ref, commit in repo.refs():
            kind, _, short = ref.removeprefix("refs/").partition("/")
            item = {"name": short, "ref": ref, "targetCommit": commit}
            (branches if kind == "heads" else tags).append(item)
        return {"branches": branches, "tags": tags, "converts": []}

    # -- file download

    def _resolve(
        self, repo_type: str, org: str, name: str, revision: str, path_parts: list[str], head: bool
    ) -> None:
        repo = self._repo(repo_type, org, name)
        commit = self._commit(repo, revision)
        path = "/".join(path_parts)
        entry = repo.entry(commit, path) if path else None
        if entry is None or entry.type != "file":
            raise _entry_not_found(path, revision, commit)
        byte_range = self._byte_range(entry.size)
        start, end = byte_range if byte_range else (0, entry.size - 1)
        length = max(0, end - start + 1)
        self.send_response(HTTPStatus.PARTIAL_CONTENT if byte_range else HTTPStatus.OK)
        self.send_header("X-Repo-Commit", commit)
        # The Hub's ETag for a non-LFS file is its git blob sha; the client uses it as the cache blob name.
        self.send_header("ETag", f'"{entry.oid}"')
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        if byte_range:
            self.send_header("Content-Range", f"bytes {start}-{end}/{entry.size}")
        self.end_headers()
        if not head and length:
            self._stream_blob(repo, entry.oid, start, length)

    def _byte_range(self, size: int) -> tuple[int, int] | None:
        """Parse a single 'bytes=a-b' / 'bytes=a-' / 'bytes=-n' range; None means 'send everything'."""
        header = self.headers.get("Range", "")
        match = re.fullmatch(r"bytes=(\d*)-(\d*)", header.strip())
        if not match or not any(match.groups()) or size == 0:
            return None
        first, last = match.groups()
        if first:
            start, end = int(first), min(int(last), size - 1) if last else size - 1
        else:
            start, end = max(0, size - int(last)), size - 1
        if start >= size or start > end:
            status = HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE
            raise HubError(status, "RangeNotSatisfiable", f"Unsatisfiable range {header!r}")
        return start, end

    def _stream_blob(self, repo: GitRepo, oid: str, start: int, length: int) -> None:
        proc = repo.open_blob(oid)
        assert proc.stdout is not None
        try:
            position, end = 0, start + length
            while position < end:
                chunk = proc.stdout.read(CHUNK)
                if not chunk:
                    break
                # Write only the part of this chunk that falls inside [start, end).
                lo, hi = max(start - position, 0), min(end - position, len(chunk))
                if lo < hi:
                    self.wfile.write(chunk[lo:hi])
                position += len(chunk)
        finally:
            proc.stdout.close()
            proc.wait()

    # -- response helpers

    def _send_json(
        self,
        payload: object,
        head: bool,
        status: HTTPStatus = HTTPStatus.OK,
        headers: dict[str, str] | None = None,
    ) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _send_error(self, err: HubError, head: bool) -> None:
        headers = {"X-Error-Code": err.code, "X-Error-Message": err.message}
        if err.commit:
            headers["X-Repo-Commit"] = err.commit
        self._send_json({"error": err.message}, head, err.status, headers)


# --- running it ---


@contextlib.contextmanager
def serving(
    root: str | os.PathLike[str], port: int = 0, host: str = "127.0.0.1", verbose: bool = False
) -> Iterator[str]:
    """Serve `root` from a background thread; yields the base URL (use it as HF_ENDPOINT)."""
    server = HubServer((host, port), Path(root), verbose=verbose)
    thread = threading.Thread(target=server.serve_forever, name="hub-server", daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve git repos under --root as a Hugging Face hub.")
    parser.add_argument("--root", type=Path, required=True, help="holds <org>/<name>, datasets/<org>/<name>")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on the ready line)")
    parser.add_argument("--quiet", action="store_true", help="do not log requests")
    args = parser.parse_args(argv)
    server = HubServer((args.host, args.port), args.root.resolve(), verbose=not args.quiet)
    # Callers wait for this line before pointing HF_ENDPOINT here.
    print(f"ready http://{args.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
