"""The parent's release of units to their pools (enginefoundry/planning/release.py, issue 40): never more than a
pool's limit submitted and unfinished, each pool in order, the next released as one ends, pools independent, and
nothing released once the run stops."""

from __future__ import annotations

import pytest

from enginefoundry.planning.release import PoolRelease, release_limit


def test_limit_is_the_smaller_positive_of_the_deployments_and_the_pools() -> None:
    assert release_limit(1, None) == 1
    assert release_limit(None, 3) == 3
    assert release_limit(4, 2) == 2
    assert release_limit(2, 4) == 2
    assert release_limit(None, None) is None
    assert release_limit(0, None) is None  # Prefect aborts every start at 0: holding back changes nothing
    assert release_limit(0, 2) == 2


def test_one_at_a_time_in_order_the_next_as_one_ends() -> None:
    release = PoolRelease([("a", "cpu"), ("b", "cpu"), ("c", "cpu")], {"cpu": 1})
    assert release.next_units() == ["a"]
    assert release.next_units() == []  # nothing more until "a" ends
    assert release.waiting("cpu") == 2
    release.finished("a")
    assert release.next_units() == ["b"]
    release.finished("b")
    assert release.next_units() == ["c"]
    assert not release.done
    release.finished("c")
    assert release.next_units() == [] and release.done


def test_pools_are_independent_and_no_limit_releases_all() -> None:
    units = [("g1", "gpu"), ("c1", "cpu"), ("g2", "gpu"), ("c2", "cpu"), ("g3", "gpu"), ("x1", "other")]
    release = PoolRelease(units, {"gpu": 2, "cpu": 1})  # "other": no limit
    assert release.next_units() == ["g1", "g2", "c1", "x1"]
    release.finished("c1")  # a cpu place frees no gpu unit
    assert release.next_units() == ["c2"]
    release.finished("g2")  # the order holds whichever unit ends first
    assert release.next_units() == ["g3"]
    assert release.limit("gpu") == 2 and release.limit("other") is None


def test_a_simulated_fleet_never_exceeds_its_limits() -> None:
    """16 units over three pools, ended in an adversarial order (newest first): at no step is a pool over its
    limit, every unit is released exactly once, in its pool's order."""
    limits: dict[str, int | None] = {"p0": 1, "p1": 2, "p2": 3}
    units = [(f"u{i:02d}", f"p{i % 3}") for i in range(16)]
    release = PoolRelease(units, limits)
    out: list[str] = []
    released: list[str] = []
    while True:
        ready = release.next_units()
        released += ready
        out += ready
        for pool, limit in limits.items():
            assert limit is not None and sum(1 for u in out if dict(units)[u] == pool) <= limit
        if not out:
            break
        release.finished(out.pop())  # the newest ends first
    assert sorted(released) == [u for u, _ in units] and release.done
    for pool in limits:
        assert [u for u in released if dict(units)[u] == pool] == [u for u, p in units if p == pool]


def test_withhold_stops_the_release() -> None:
    release = PoolRelease([("a", "cpu"), ("b", "cpu"), ("c", "cpu"), ("d", "gpu")], {"cpu": 1, "gpu": 1})
    assert release.next_units() == ["a", "d"]
    assert release.withhold() == ["b", "c"]
    release.finished("a")
    assert release.next_units() == []  # a cancelled run sends nothing more
    release.finished("d")
    assert release.done


def test_misuse_is_refused() -> None:
    with pytest.raises(ValueError, match="given twice"):
        PoolRelease([("a", "cpu"), ("a", "gpu")], {})
    with pytest.raises(ValueError, match="at least 1"):
        PoolRelease([("a", "cpu")], {"cpu": 0})
    release = PoolRelease([("a", "cpu"), ("b", "cpu")], {"cpu": 1})
    release.next_units()
    with pytest.raises(ValueError, match="not released"):
        release.finished("b")  # never released: finishing it would free a place that was never taken
