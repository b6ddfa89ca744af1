"""Build leases on a file:// store: heartbeat, dead-owner takeover (real processes), one winner of a stale
lease, `--force` never adopting, and the `leases` command."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from enginefoundry.cli import main
from enginefoundry.inputs.units import expand_units, key_of
from enginefoundry.planning.cache_plan import CachePlan, plan_cache
from enginefoundry.spec import load_spec
from enginefoundry.store.backends import FileStore
from enginefoundry.store.layout import lease_key
from enginefoundry.store.lease import (
    Lease,
    break_lease,
    list_leases,
    read_lease,
    try_acquire,
    wait_for,
)
from enginefoundry.store.publish import build_manifest_key, pointer_key, publish_build
from tests.support.processes import poll

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    return FileStore(f"file://{tmp_path}/store")


def test_one_holder_until_released(store: FileStore):
    lk = lease_key("m", "k1")
    first = try_acquire(store, lk, "a")
    assert first is not None
    assert try_acquire(store, lk, "b") is None
    first.release()
    assert not store.exists(lk)
    second = try_acquire(store, lk, "b")
    assert second is not None and read_lease(store, lk).owner == "b"
    second.release()


def test_the_stores_compare_and_swap_that_leases_use(store: FileStore):
    first = store.replace_if("leases/m/x.json", b"a", None)  # create only if absent: its version tag
    assert first is not None and store.replace_if("leases/m/x.json", b"b", None) is None
    second = store.replace_if("leases/m/x.json", b"b", first)
    assert second is not None and second != first and store.read_versioned("leases/m/x.json") == (b"b", second)
    assert store.replace_if("leases/m/x.json", b"c", first) is None  # a stale version writes nothing
    assert not store.delete_if("leases/m/x.json", first) and store.exists("leases/m/x.json")
    assert store.delete_if("leases/m/x.json", second) and not store.exists("leases/m/x.json")
    assert not store.delete_if("leases/m/x.json", second)


def test_heartbeat_keeps_a_short_lease_alive(store: FileStore):
    lk = lease_key("m", "k2")
    held = try_acquire(store, lk, "a", ttl_s=0.4)
    assert held is not None
    acquired = read_lease(store, lk).acquired_at
    # Renewed for longer than its TTL: without the heartbeat it would have been stale by now.
    assert poll(lambda: read_lease(store, lk).renewed_at > acquired + 0.8, 10.0, interval_s=0.02)
    assert not read_lease(store, lk).stale()
    assert try_acquire(store, lk, "b", ttl_s=0.4) is None
    held.release()
    assert not held.lost


def test_expired_lease_is_taken_over(store: FileStore):
    lk = lease_key("m", "k3")
    stale = Lease(key=lk, owner="elsewhere:1:x", host="another-host", pid=1, expires_at=time.time() - 1)
    store.create_if_absent(lk, stale.model_dump_json().encode())
    taken = try_acquire(store, lk, "me")
    assert taken is not None and read_lease(store, lk).owner == "me"
    taken.release()


def test_a_reused_pid_does_not_keep_a_lease_alive(store: FileStore):
    lk = lease_key("m", "k5")
    held = try_acquire(store, lk, "a")
    assert held is not None
    held.release()
    lease = Lease.model_validate({**json.loads(held.lease.model_dump_json()), "pid_started": "other-boot:1"})
    assert lease.owner_alive() is False and lease.stale()


def test_two_breakers_of_one_stale_lease_one_wins(store: FileStore):
    lk = lease_key("m", "k6")
    stale = Lease(key=lk, owner="gone", host="another-host", pid=1, expires_at=time.time() - 1)
    store.create_if_absent(lk, stale.model_dump_json().encode())
    winners: list[object] = []
    barrier = threading.Barrier(8)

    def breaker(i: int) -> None:
        barrier.wait()
        got = try_acquire(store, lk, f"breaker-{i}")
        if got is not None:
            winners.append(got)

    threads = [threading.Thread(target=breaker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1
    assert read_lease(store, lk).owner == winners[0].lease.owner
    winners[0].release()


def test_wait_for_sees_the_build_or_a_holder_that_gave_up(store: FileStore):
    lk = lease_key("m", "k7")
    holder = try_acquire(store, lk, "a")
    notes: list[str] = []
    finisher = threading.Timer(0.3, lambda: (store.create_if_absent("done.json", b"{}"), holder.release()))
    finisher.start()
    assert wait_for(store, lambda: store.exists("done.json"), lk, timeout_s=10, poll_s=0.05, progress=notes.append)
    assert notes and "holds the build lease" in notes[0]
    finisher.join()  # wait_for may see done.json a moment before the holder releases its lease
    holder = try_acquire(store, lk, "b")
    assert holder is not None
    threading.Timer(0.3, holder.release).start()
    assert not wait_for(store, lambda: False, lk, timeout_s=10, poll_s=0.05)


def _publish_fake(store: FileStore, model: str) -> str:
    """A build published through the content-addressed store (no files); its key."""
    components = {"unit": "fake"}
    key = key_of(components)
    fields = dict(key=key, key_components=components, model=model, unit="u", lane="reference", target={},
                  variant={}, profile={}, source={}, status="candidate", mlflow_run_id="earlier")
    publish_build(store, model, fields, {}, progress=lambda _: None)
    return key


def test_force_never_adopts_a_published_build_and_waits_for_a_live_holder(store: FileStore):
    spec = load_spec(REPO / "configs" / "tiny-cpu.yaml")
    units = expand_units(spec)
    key = _publish_fake(store, "m")
    keys = {u.name: key for u in units}
    assert set(plan_cache("m", units, keys, store).hits) == {units[0].name}  # without force: a hit

    other = try_acquire(store, lease_key("m", key), "other run")  # another live run holds the key
    threading.Timer(0.5, other.release).start()
    t0 = time.monotonic()
    plan = plan_cache("m", units, keys, store, force=True, progress=lambda _: None)
    try:
        assert plan.hits == {} and [u.name for u in plan.misses] == [units[0].name]
        assert time.monotonic() - t0 >= 0.4  # it waited for the other run instead of adopting its build
        assert read_lease(store, lease_key("m", key)).owner != "other run"
    finally:
        plan.release()
    assert not store.exists(lease_key("m", key))


def test_a_build_that_fails_its_hit_check_is_a_miss(store: FileStore):
    spec = load_spec(REPO / "configs" / "tiny-cpu.yaml")
    units = expand_units(spec)[:1]
    key = _publish_fake(store, "m")
    other = key_of({"unit": "other"})
    # The build of `key` published under another key's pointer: its key does not match its location.
    pointer = store.read_bytes(pointer_key("m", key))
    build = json.loads(pointer)["build_id"]
    store.create_if_absent(build_manifest_key("m", other, build),
                           store.read_bytes(build_manifest_key("m", key, build)))
    store.create_if_absent(pointer_key("m", other), pointer)
    notes: list[str] = []
    plan = plan_cache("m", units, {units[0].name: other}, store, progress=notes.append)
    try:
        assert plan.hits == {} and [u.name for u in plan.misses] == [units[0].name]
        assert any("refused" in n and "key differs from the key of its location" in n for n in notes)
    finally:
        plan.release()


def test_units_of_one_key_take_one_lease(store: FileStore):
    spec = load_spec(REPO / "configs" / "tiny-cpu.yaml")
    unit = expand_units(spec)[0]
    twin = unit.model_copy(update={"target": unit.target.model_copy(update={"name": "cpu2"})})
    plan = plan_cache("m", [unit, twin], {unit.name: "k9", twin.name: "k9"}, store)
    try:
        assert [u.name for u in plan.misses] == [unit.name] and plan.duplicates == {twin.name: unit.name}
        assert list(plan.leases) == ["k9"]
    finally:
        plan.release()


def test_leases_command_lists_and_breaks(store: FileStore, capsys: pytest.CaptureFixture[str]):
    held = try_acquire(store, lease_key("m", "abcdef123"), "a")
    dead = Lease(key=lease_key("m", "0123dead"), owner="gone", host=os.uname().nodename, pid=2**22 + 7,
                 expires_at=time.time() + 100)
    store.create_if_absent(dead.key, dead.model_dump_json().encode())
    assert main(["leases", "--store", store.uri, "--json"]) == 0
    rows = {r["key"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows[held.key]["alive"] == "yes" and not rows[held.key]["stale"]
    assert rows[dead.key]["alive"] == "no" and rows[dead.key]["stale"]
    # A key is matched whole (issue 34: `--break c` cleared a lease by one character of its key).
    assert main(["leases", "--store", store.uri, "--break", "0123"]) == 2
    assert main(["leases", "--store", store.uri, "--break", "0123dea"]) == 2
    assert len(list_leases(store)) == 2
    assert main(["leases", "--store", store.uri, "--break", "0123dead"]) == 0
    assert [r.key for r in list_leases(store)] == [held.key]
    assert main(["leases", "--store", store.uri, "--break", "nothing-like-it"]) == 2
    held.release()
    assert not break_lease(store, held.key)


def test_breaking_a_live_lease_asks_for_force_and_its_holder_is_told(store: FileStore, capsys):
    """`leases --break` on a lease whose holder is alive refuses, naming the holder; with --force it breaks it,
    and the run that lost it is told it was broken by hand, not that its renewals were late."""
    held = try_acquire(store, lease_key("m", "feedface0123"), "host:1:live", ttl_s=60)
    assert held is not None
    try:
        capsys.readouterr()
        assert main(["leases", "--store", store.uri, "--break", "feedface0123"]) == 2
        err = capsys.readouterr().err
        assert "still working" in err and "host:1:live" in err and f"pid {os.getpid()}, alive" in err
        assert "--force" in err and read_lease(store, held.key) is not None
        assert main(["leases", "--store", store.uri, "--break", "feedface0123", "--force"]) == 0
        assert read_lease(store, held.key) is None
        assert not held.renew() and held.lost
        plan = CachePlan(leases={"feedface0123": held})
        said: list[str] = []
        plan.release(said.append)  # what the run that lost it prints
        told = "the build lease of feedface0123 was broken by hand (`enginefoundry leases --break --force`, by "
        assert len(said) == 1 and said[0].startswith(told)
        assert "renewals" not in said[0]
    finally:
        held.release()
    assert [k for k in store.list("leases/")] == []  # the note was read and removed
