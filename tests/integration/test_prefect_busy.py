"""The concurrent-create hammer against a real Prefect server on PostgreSQL: several clients create runs of one
deployment at once, each run's state set as it is made (the writes a worker and a running flow make), through a
client that never sends a request again. On SQLite 8 threads got 54 answers of 503 out of 61 creates (SQLite's
"database is locked": docs/facts/infra.md §3.7), so the suite retried them; the stack's server now keeps its
state in PostgreSQL (scripts/stacklib/postgres.py) and every request must succeed the first time.
benchmarks/prefect_hammer.py is the same hammer as a benchmark (and runs it against SQLite for comparison)."""

from __future__ import annotations

import threading
import uuid

import httpx
import pytest

from tests.support.cluster import PrefectServer

pytestmark = pytest.mark.services

THREADS = 8
CREATES = 5  # per thread


def test_every_create_succeeds_at_once_under_concurrent_writes(prefect_server: PrefectServer) -> None:
    name = f"busy-{uuid.uuid4().hex[:8]}"
    with prefect_server.client() as http:
        flow = http.post("/flows/", json={"name": name})
        flow.raise_for_status()
        # No work pool: nothing picks these runs up.
        made = http.post("/deployments/", json={"name": name, "flow_id": flow.json()["id"]})
        made.raise_for_status()
    deployment_id = made.json()["id"]
    answers: list[int | str] = []
    run_ids: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(THREADS)

    def create() -> None:
        with httpx.Client(base_url=prefect_server.api, timeout=60, trust_env=False) as http:  # no retry at all
            start.wait(timeout=60)
            for _ in range(CREATES):
                try:
                    run = http.post(f"/deployments/{deployment_id}/create_flow_run", json={"parameters": {}})
                    state = (http.post(f"/flow_runs/{run.json()['id']}/set_state",
                                       json={"state": {"type": "PENDING"}}) if run.status_code == 201 else run)
                except httpx.HTTPError as err:  # a reset or dropped connection counts as a failure too
                    with lock:
                        answers.append(type(err).__name__)
                    continue
                with lock:
                    answers.extend([run.status_code, state.status_code])
                    if run.status_code == 201:
                        run_ids.append(run.json()["id"])

    threads = [threading.Thread(target=create) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(thread.is_alive() for thread in threads)
    assert answers == [201] * (2 * THREADS * CREATES), answers
    with prefect_server.client() as http:
        listed = http.post("/flow_runs/filter", json={"flow_runs": {"deployment_id": {"any_": [deployment_id]}}})
        listed.raise_for_status()
    # Every run answered is there, and no other.
    assert {r["id"] for r in listed.json()} == set(run_ids) and len(set(run_ids)) == THREADS * CREATES
