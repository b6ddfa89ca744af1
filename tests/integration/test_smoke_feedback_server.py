"""Prompts are asked concurrently of a real loopback server (a server: moved out of tests/unit/test_smoke_feedback.py,
the unit tier starts none)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from enginefoundry.smoke import ask_all, load_prompt_set
from enginefoundry.smoke.client import ChatClient
from tests.support.paths import TINY_PROMPTS


class _Echo(BaseHTTPRequestHandler):
    """An OpenAI-shaped endpoint that answers each prompt with its own text after a pause, counting requests in
    flight: what the client does with concurrency, not what a model says (the e2e tests serve real models)."""

    in_flight = 0
    most = 0
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with _Echo.lock:
            _Echo.in_flight += 1
            _Echo.most = max(_Echo.most, _Echo.in_flight)
        time.sleep(0.3)
        with _Echo.lock:
            _Echo.in_flight -= 1
        text = body["messages"][-1]["content"]
        data = json.dumps({"choices": [{"message": {"content": text}, "finish_reason": "stop"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def echo() -> Iterator[str]:
    _Echo.in_flight = _Echo.most = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_prompts_are_asked_concurrently_and_answers_keep_prompt_order(echo: str):
    cases = load_prompt_set(TINY_PROMPTS).cases[:12]
    answers = ask_all(ChatClient(echo, "m", max_tokens=4), cases, concurrency=6, progress=lambda _: None)
    assert [a.text for a in answers] == [c.chat()[-1]["content"] for c in cases]
    assert _Echo.most > 1  # on main the prompts went one at a time
