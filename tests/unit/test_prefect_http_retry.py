"""The test suite's Prefect REST client (tests/support/cluster.py `prefect_http`) sends a request again while the
server answers 503, as Prefect's own client does, and only then: a loopback HTTP server that answers a scripted
list of statuses (a real Prefect server answers 503 only under a race; tests/integration/test_prefect_busy.py
makes one)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.support.cluster import prefect_http


@pytest.fixture
def scripted() -> Iterator[tuple[str, list[int], list[bytes]]]:
    """(base URL, statuses to answer in order (0: close without an answer), bodies received)."""
    statuses: list[int] = []
    bodies: list[bytes] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
            status = statuses.pop(0)
            if status == 0:  # closes the connection without an answer
                self.close_connection = True
                return
            payload = b'{"exception_message": "Service Unavailable"}' if status == 503 else b'{"id": "run"}'
            self.send_response(status)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/api", statuses, bodies
    finally:
        server.shutdown()
        server.server_close()


def test_a_busy_answer_is_sent_again_with_the_same_body(scripted: tuple[str, list[int], list[bytes]]) -> None:
    url, statuses, bodies = scripted
    statuses.extend([503, 503, 201])
    with prefect_http(url, first_wait_s=0.01) as http:
        answer = http.post("/deployments/d/create_flow_run", json={"parameters": {"a": 1}})
    assert answer.status_code == 201 and answer.json() == {"id": "run"}
    assert len(bodies) == 3 and len(set(bodies)) == 1 and b'"a":1' in bodies[0].replace(b" ", b"")


def test_the_last_busy_answer_is_returned_after_the_tries(scripted: tuple[str, list[int], list[bytes]]) -> None:
    url, statuses, bodies = scripted
    statuses.extend([503] * 3)
    with prefect_http(url, tries=3, first_wait_s=0.01) as http:
        answer = http.post("/deployments/d/create_flow_run", json={})
    assert answer.status_code == 503 and len(bodies) == 3 and not statuses


@pytest.mark.parametrize("status", [400, 404, 409, 500])
def test_other_errors_are_not_sent_again(scripted: tuple[str, list[int], list[bytes]], status: int) -> None:
    url, statuses, bodies = scripted
    statuses.extend([status, 201])
    with prefect_http(url, first_wait_s=0.01) as http:
        answer = http.post("/deployments/d/create_flow_run", json={})
    assert answer.status_code == status and len(bodies) == 1


def test_a_connection_closed_without_an_answer_is_sent_again(scripted: tuple[str, list[int], list[bytes]]) -> None:
    url, statuses, bodies = scripted
    statuses.extend([0, 503, 201])
    with prefect_http(url, first_wait_s=0.01) as http:
        answer = http.post("/deployments/d/create_flow_run", json={})
    assert answer.status_code == 201 and len(bodies) == 3


def test_the_budget_ends_the_tries(scripted: tuple[str, list[int], list[bytes]]) -> None:
    url, statuses, bodies = scripted
    statuses.extend([503] * 50)
    with prefect_http(url, budget_s=0.5, first_wait_s=0.05, max_wait_s=0.1) as http:
        answer = http.post("/deployments/d/create_flow_run", json={})
    assert answer.status_code == 503 and 3 <= len(bodies) < 50
