"""Per-pool limits on concurrent unit builds: Prefect's global concurrency limits, one per work pool
(`enginefoundry-pool-<pool>`, enginefoundry/rollout/fleet.py).

A fleet sets them (`set_pool_limits`); every unit build holds one slot of its pool's limit while it runs
(`pool_slot`), embedded (flows/build_engines.py) or on a worker (flows/build_unit.py). A build over the limit waits
on the Prefect server for a slot: Prefect's own mechanism, not a semaphore of this process, so it holds across
processes, workers and concurrent fleets.

Evidence (prefect 3.9.1, the installed release): `prefect.concurrency.sync.concurrency(names, occupy, ...,
strict)` acquires slots of global concurrency limits and releases them on exit, renewing its lease while held
(prefect/concurrency/sync.py); with `strict=False` a missing limit is skipped with a warning, so this module
asks first (`read_global_concurrency_limit_by_name`, prefect/client/orchestration/_concurrency_limits/client.py)
and holds nothing for a pool without a limit (no warning in `make demo`); `upsert_global_concurrency_limit_by_name`
(same file) creates or updates a limit by name. A slot is a lease (`lease_duration`, 300 s, renewed while held);
a process killed while holding one frees it when the lease expires (prefect/server/services/repossessor.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.exceptions import ObjectNotFound

from enginefoundry.rollout.fleet import pool_limit_name
from enginefoundry.tasks._log import progress_logger


@task(name="set per-pool limits", cache_policy=NO_CACHE)
def set_pool_limits(limits: dict[str, int]) -> dict[str, int]:
    """Create or update each pool's global concurrency limit on the Prefect server; returns what was set."""
    log = progress_logger()
    with get_client(sync_client=True) as client:
        for pool, limit in sorted(limits.items()):
            client.upsert_global_concurrency_limit_by_name(pool_limit_name(pool), limit)
            log(f"pool {pool}: at most {limit} unit build(s) at once (global concurrency limit "
                f"{pool_limit_name(pool)})")
    return dict(limits)


def pool_limit(pool: str) -> int | None:
    """The pool's limit on the Prefect server, or None where it has none (or it is inactive)."""
    with get_client(sync_client=True) as client:
        try:
            found = client.read_global_concurrency_limit_by_name(pool_limit_name(pool))
        except ObjectNotFound:
            return None
    return found.limit if found.active else None


@contextlib.contextmanager
def pool_slot(pool: str) -> Iterator[None]:
    """Hold one slot of the pool's limit for the block (waiting for one when the pool is full); nothing where
    the pool has no limit."""
    limit = pool_limit(pool)
    if limit is None:
        yield
        return
    from prefect.concurrency.sync import concurrency

    progress_logger()(f"pool {pool}: waiting for one of its {limit} build slot(s)")
    with concurrency(pool_limit_name(pool), occupy=1, strict=True):
        yield
