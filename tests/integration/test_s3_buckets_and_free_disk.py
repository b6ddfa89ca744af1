"""The test SeaweedFS (scripts/stacklib/s3.py) takes more buckets than the disk has free GiB.

`weed mini` sizes its volume count from the free disk (free GiB over a 1 GiB volume) and gives every bucket a
volume of its own, so on a host with 6 GiB free the 7th bucket's first PutObject failed with an InternalError
("failed to find writable volumes for collection"): a fresh-clone CI run on this host failed seven hostile-key
tests that way. The stack now fixes the count (`-volume.max`); this creates one bucket more than the disk has
free GiB (at most 120), each with an object, against the session's real server.
"""

from __future__ import annotations

import shutil
import tempfile

import pytest

pytestmark = pytest.mark.services


def test_more_buckets_than_free_gib_each_take_an_object(s3, unique: str) -> None:
    free_gib = shutil.disk_usage(tempfile.gettempdir()).free / 2**30
    n = min(int(free_gib) + 2, 120)
    made: list[str] = []
    try:
        for i in range(n):
            name = f"vols-{unique}-{i:03d}"
            s3.create_bucket(Bucket=name)
            made.append(name)
            s3.put_object(Bucket=name, Key="k", Body=b"one object")
        assert all(s3.get_object(Bucket=b, Key="k")["Body"].read() == b"one object" for b in made)
    finally:
        for name in made:
            s3.delete_object(Bucket=name, Key="k")
            s3.delete_bucket(Bucket=name)
