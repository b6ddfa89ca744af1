"""A real Prefect server under concurrent writes: runs created from one deployment by several clients at once,
each run's state set as it is made (the writes a worker and a running flow make). create_flow_run's deferred
SQLite transaction fails with 503 when another write lands between its read and its write (docs/facts/infra.md
§3.7); the suite's client (tests/support/cluster.py `prefect_http`) sends it again, so every run is created once."""

from __future__ import annotations

import threading
import uuid

import pytest

from tests.support.cluster import PrefectServer, prefect_http

pytestmark = pytest.mark.services


def test_every_run_is_created_once_under_concurrent_writes(prefect_server: PrefectServer) -> None:
    name = f"busy-{uuid.uuid4().hex[:8]}"
    with prefect_server.client() as http:
        flow = http.post("/flows/", json={"name": name})
        flow.raise_for_status()
        # No work pool: nothing picks these runs up.
        made = http.post("/deployments/", json={"name": name, "flow_id": flow.json()["id"]})
        made.raise_for_status()
    deployment_id = made.json()["id"]
    answers: list[int] = []
    run_ids: list[str] = []
    lock = threading.Lock()

    def create(count: int) -> None:
        with prefect_http(prefect_server.api) as http:
            for _ in range(count):
                run = http.post(f"/deployments/{deployment_id}/create_flow_run", json={"parameters": {}})
                state = (http.post(f"/flow_runs/{run.json()['id']}/set_state", json={"state": {"type": "PENDING"}})
                         if run.status_code == 201 else run)
                with lock:
                    answers.extend([run.status_code, state.status_code])
                    if run.status_code == 201:
                        run_ids.append(run.json()["id"])

    threads = [threading.Thread(target=create, args=(5,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert answers == [201] * 40, answers
    with prefect_server.client() as http:
        listed = http.post("/flow_runs/filter", json={"flow_runs": {"deployment_id": {"any_": [deployment_id]}}})
        listed.raise_for_status()
    # Every run answered is there (a create sent again after a reset could add one nobody was told of).
    assert set(run_ids) <= {r["id"] for r in listed.json()} and len(set(run_ids)) == 20
