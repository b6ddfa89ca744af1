"""Releasing a parent's units to their pools no faster than the pools take them (issue 40).

In cluster mode the parent sends each unit to its pool's `build-unit/<pool>` deployment, whose concurrency limit
(deployment.yaml: one build per GPU) Prefect's server enforces by refusal: a run beyond the limit is answered
`Scheduled` named `AwaitingConcurrencySlot` when its worker proposes Pending, and tried again 30 s later
(`SecureFlowConcurrencySlots`, prefect/server/orchestration/core_policy.py@3.9.1;
`PREFECT_SERVER_DEPLOYMENTS_CONCURRENCY_SLOT_WAIT_SECONDS`, prefect/settings/models/server/deployments.py@3.9.1).
Creating every unit's run at once therefore made each queued unit refused about every 20 s for as long as the
units ahead of it ran (docs/scale.md: 4.8 refusals a unit at 4 units, 23.8 at 16), and a freed slot sat idle until
the next reschedule came due.

`PoolRelease` is the parent's side of that limit: it keeps at most `limit` of a pool's units submitted and
unfinished, in the units' order, and hands out the next one when one ends, so the server has nothing to refuse.
The server's limit still holds (another parent, a hand-started run); this only stops the parent from asking for
more than a pool can take. Data only: the flow (flows/dispatch.py) submits and waits.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping


def release_limit(deployment_limit: int | None, pool_limit: int | None) -> int | None:
    """How many of a pool's units the parent keeps submitted and unfinished: the smaller of its deployment's
    concurrency limit and its pool's limit (tasks/pool_limits.py), ignoring one that is absent or not positive;
    None (all at once) when neither is. A deployment limit of 0 makes Prefect abort every start (its own
    message: "The flow will deadlock"), which holding units back would not change."""
    positive = [n for n in (deployment_limit, pool_limit) if n is not None and n > 0]
    return min(positive) if positive else None


class PoolRelease:
    """Which units to submit now: per pool at most its limit submitted and unfinished, each pool in the order the
    units were given; pools are independent of each other."""

    def __init__(self, units: Iterable[tuple[str, str]], limits: Mapping[str, int | None]) -> None:
        """`units`: (unit, pool) pairs in dispatch order, each unit once; `limits`: pool → its release limit
        (`release_limit`), None or missing: no limit."""
        self._waiting: dict[str, deque[str]] = {}
        self._pool: dict[str, str] = {}
        for unit, pool in units:
            if unit in self._pool:
                raise ValueError(f"unit {unit} given twice")
            self._pool[unit] = pool
            self._waiting.setdefault(pool, deque()).append(unit)
        for pool, limit in limits.items():
            if limit is not None and limit < 1:
                raise ValueError(f"pool {pool}: a release limit is at least 1 (None: no limit), not {limit}")
        self._limits = {pool: limits.get(pool) for pool in self._waiting}
        self._out: dict[str, set[str]] = {pool: set() for pool in self._waiting}

    def next_units(self) -> list[str]:
        """The units to submit now (in order); each counts as submitted and unfinished until `finished`."""
        ready: list[str] = []
        for pool, waiting in self._waiting.items():
            limit = self._limits[pool]
            while waiting and (limit is None or len(self._out[pool]) < limit):
                unit = waiting.popleft()
                self._out[pool].add(unit)
                ready.append(unit)
        return ready

    def finished(self, unit: str) -> None:
        """The unit ended (or its submission failed): its pool has a place for the next."""
        pool = self._pool.get(unit)
        if pool is None or unit not in self._out[pool]:
            raise ValueError(f"unit {unit} was not released")
        self._out[pool].remove(unit)

    def withhold(self) -> list[str]:
        """Stop releasing (the run was cancelled): the units never released, in order; none is released after."""
        held = [unit for waiting in self._waiting.values() for unit in waiting]
        for waiting in self._waiting.values():
            waiting.clear()
        return held

    def waiting(self, pool: str) -> int:
        """How many of the pool's units are not released yet."""
        return len(self._waiting.get(pool, ()))

    def limit(self, pool: str) -> int | None:
        return self._limits.get(pool)

    def pools(self) -> list[str]:
        """The pools of the units, in the order they first appear."""
        return list(self._waiting)

    @property
    def done(self) -> bool:
        """Nothing left to release and nothing submitted that has not finished."""
        return not any(self._waiting.values()) and not any(self._out.values())
