"""Hostile S3 object keys under a source prefix, against the real SeaweedFS: refused, nothing written outside.

Each key is uploaded beside a valid checkpoint; the fetch must fail naming the key, write nothing outside
the download cache, and leave no partial folder that a later fetch trips over.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from enginefoundry.errors import SourceError
from enginefoundry.inputs import sources
from enginefoundry.inputs.sources import fetch
from enginefoundry.spec import parse_source_uri

pytestmark = pytest.mark.services

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "tests" / "fixtures" / "tiny-chat" / "model"

HOSTILE_KEYS = [
    "../escaped.txt",
    "../../escaped.txt",
    "sub/../../escaped.txt",
    "/escaped-absolute.txt",
    "..\\escaped-backslash.txt",
    "sub\\..\\..\\escaped.txt",
    "a//b.txt",
    "./dot.txt",
    "line\nbreak.txt",
]


def _files_outside(root: Path, before: set[Path]) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()} - before


def _upload_checkpoint(s3, bucket: str, prefix: str) -> None:
    for f in sorted(TINY.rglob("*")):
        if f.is_file():
            s3.upload_file(str(f), bucket, f"{prefix}/{f.relative_to(TINY).as_posix()}")


@pytest.fixture
def bucket(s3, unique: str) -> str:
    name = f"hostile-{unique}"
    s3.create_bucket(Bucket=name)
    return name


@pytest.mark.parametrize("hostile", HOSTILE_KEYS)
def test_hostile_key_is_refused_and_nothing_leaves_the_cache(
    hostile: str, s3, s3_env, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache = tmp_path / "home" / "cache"
    monkeypatch.setenv("EF_CACHE_DIR", str(cache))
    prefix = "models/tiny"
    _upload_checkpoint(s3, bucket, prefix)
    key = f"{prefix}/{hostile}"
    try:
        s3.put_object(Bucket=bucket, Key=key, Body=b"pwned")
        stored = key in [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")["Contents"]]
    except ClientError:
        stored = False
    if not stored:
        # SeaweedFS refuses (or renames) this key, but AWS S3 stores keys with '..' or '\\' verbatim: the listing
        # is the one part a real server here cannot produce, so it alone is extended (the objects stay real).
        real_list = sources._list_objects

        def listing(client, b: str, p: str) -> list[dict]:
            return [*real_list(client, b, p), {"Key": key, "Size": 5, "ETag": '"x"'}]

        monkeypatch.setattr(sources, "_list_objects", listing)
    before = {p for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(SourceError) as err:
        fetch(parse_source_uri(f"s3://{bucket}/{prefix}"), progress=lambda _: None)
    message = str(err.value)
    assert "object key" in message and "\n" not in message
    assert hostile.encode("unicode_escape").decode()[:20] in message
    assert _files_outside(tmp_path, before) == set()  # nothing downloaded at all, let alone outside
    assert not any(p.name.startswith("escaped") for p in tmp_path.rglob("*"))
    # Once the object is gone, the next fetch completes unaided.
    if stored:
        s3.delete_object(Bucket=bucket, Key=key)
    else:
        monkeypatch.undo()
        monkeypatch.setenv("EF_CACHE_DIR", str(cache))
        for k in ("EF_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.setenv(k, s3_env[k])
    snap = fetch(parse_source_uri(f"s3://{bucket}/{prefix}"), progress=lambda _: None)
    assert Path(snap.local_dir).is_relative_to(cache)
    assert (Path(snap.local_dir) / "config.json").is_file()
    assert not list(Path(snap.local_dir).parent.glob("*.partial*"))


def test_listed_prefix_with_dot_segments_is_refused_before_listing() -> None:
    with pytest.raises(ValueError, match=r"'\.\.'"):
        parse_source_uri("s3://bucket/models/../../x")


def test_folder_markers_are_skipped(s3, s3_env, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EF_CACHE_DIR", str(tmp_path / "cache"))
    _upload_checkpoint(s3, bucket, "m")
    s3.put_object(Bucket=bucket, Key="m/empty-folder/", Body=b"")
    snap = fetch(parse_source_uri(f"s3://{bucket}/m"), progress=lambda _: None)
    assert (Path(snap.local_dir) / "config.json").is_file()
    assert os.listdir(Path(snap.local_dir).parent) == [Path(snap.local_dir).name]
