"""How many HTTP attempts one MLflow call makes, against a real loopback server (a server: moved out of
tests/unit/test_recording_path.py, the unit tier starts none)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import ClassVar

import pytest

from enginefoundry.records import tracking


class _Unavailable(http.server.BaseHTTPRequestHandler):
    """An MLflow server that is down behind its proxy: every request answers 503, and is counted."""

    requests: ClassVar[list[str]] = []

    def _any(self) -> None:
        _Unavailable.requests.append(self.path)
        body = b"upstream unavailable"
        self.send_response(503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _any

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def unavailable() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Unavailable)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Unavailable.requests.clear()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_one_mlflow_call_makes_at_most_the_stated_number_of_http_attempts(
        unavailable: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.exceptions import MlflowException

    for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(tracking, "MLFLOW_BACKOFF_BASE_S", 0.001)  # the count is the point, not the waits
    monkeypatch.setattr(tracking, "MLFLOW_BACKOFF_CAP_S", 0.002)
    client = tracking.mlflow_client(unavailable)
    with pytest.raises(MlflowException):
        client.get_experiment_by_name("anything")
    assert len(_Unavailable.requests) == tracking.MLFLOW_ATTEMPTS == 6
