"""Per-pool limits are Prefect global concurrency limits on a real Prefect server (tasks/pool_limits.py): with a
limit of 1, two unit builds of one pool never overlap, across threads that share nothing but the server; a pool
without a limit holds nothing."""

from __future__ import annotations

import contextvars
import threading
import time
import uuid

import pytest

pytestmark = pytest.mark.services


def test_a_pool_limit_of_one_runs_one_build_at_a_time(stack: dict[str, str]) -> None:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from enginefoundry.rollout.fleet import pool_limit_name
    from enginefoundry.tasks.pool_limits import pool_limit, pool_slot, set_pool_limits

    pool = f"test-{uuid.uuid4().hex[:8]}"
    spans: list[tuple[float, float]] = []
    with temporary_settings(updates={PREFECT_API_URL: stack["PREFECT_API_URL"]}):
        assert pool_limit(pool) is None
        with pool_slot(pool):  # no limit on the server: nothing is acquired, nothing waits
            pass
        assert set_pool_limits.fn({pool: 1}) == {pool: 1}
        assert pool_limit(pool) == 1

        def build() -> None:
            with pool_slot(pool):
                start = time.monotonic()
                time.sleep(1.0)  # the build's work, while the slot is held
                spans.append((start, time.monotonic()))

        threads = [threading.Thread(target=contextvars.copy_context().run, args=(build,)) for _ in range(2)]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=120)
            assert not any(t.is_alive() for t in threads)
            with get_client(sync_client=True) as client:
                assert client.read_global_concurrency_limit_by_name(pool_limit_name(pool)).active_slots == 0
        finally:
            with get_client(sync_client=True) as client:
                client.delete_global_concurrency_limit_by_name(pool_limit_name(pool))
    assert len(spans) == 2
    first, second = sorted(spans)
    assert first[1] <= second[0], f"two builds of pool {pool} overlapped under a limit of 1: {spans}"
