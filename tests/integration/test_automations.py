"""A rejected unit fires the shipped automation on a real Prefect server: automations.yaml is installed with
`enginefoundry automations create`, a custom-webhook notification block points at a receiver in this test, the
pipeline's own emitter sends `enginefoundry.unit.rejected`, and the server's action service delivers the
notification. The server comes from scripts/stack.py (its own state dir and port)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from enginefoundry.model_server import free_port
from tests.support.private_stack import private_stack

pytestmark = pytest.mark.services


@pytest.fixture
def prefect_api(tmp_path: Path) -> Iterator[dict[str, str]]:
    env = {**os.environ, "EF_PREFECT_PORT": str(free_port())}
    env.pop("PREFECT_API_URL", None)
    with private_stack(tmp_path / "stack", env, [("prefect", "")], timeout_s=600) as stack_env:
        yield {**stack_env, "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}


class _Receiver(BaseHTTPRequestHandler):
    received: ClassVar[list[dict]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).received.append(json.loads(body or b"{}"))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        pass


def _python(code: str, env: dict[str, str]) -> None:
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_rejected_unit_fires_the_shipped_automation(prefect_api: dict[str, str]) -> None:
    _Receiver.received = []
    receiver = HTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{receiver.server_address[1]}/hook"
        _python("from prefect.blocks.notifications import CustomWebhookNotificationBlock as B\n"
                f"B(name='ops', url={url!r}, json_data={{'subject': '{{{{subject}}}}', 'body': '{{{{body}}}}'}})"
                ".save('ops', overwrite=True)", prefect_api)
        created = subprocess.run([sys.executable, "-m", "enginefoundry.cli", "automations", "create", "--notify",
                                  "custom-webhook/ops", "--json"], env=prefect_api, capture_output=True, text=True,
                                 timeout=300)
        assert created.returncode == 0, created.stderr
        names = {a["name"] for a in json.loads(created.stdout)["created"]}
        assert names == {"enginefoundry-unit-rejected", "enginefoundry-build-failed"}

        # The server loads new automations into its trigger service within seconds: emit until one arrives.
        deadline = time.monotonic() + 120
        while not _Receiver.received and time.monotonic() < deadline:
            _python("from enginefoundry.tasks.events import emit_unit_outcome\n"
                    "assert emit_unit_outcome('tiny-chat', 'fp32-tp1.chat.cpu', 'cpu', 'k' * 64, 'rejected', "
                    "reason='smoke gate: agreement 0.50 < 0.95', manifest_uri='file:///store/manifest.json')",
                    prefect_api)
            wait_until = time.monotonic() + 15
            while not _Receiver.received and time.monotonic() < wait_until:
                time.sleep(0.5)
        assert _Receiver.received, "the automation's notification never reached the webhook"
        note = _Receiver.received[0]
        assert "fp32-tp1.chat.cpu rejected" in note["subject"]
        assert "smoke gate: agreement 0.50 < 0.95" in note["body"] and "file:///store/manifest.json" in note["body"]
    finally:
        receiver.shutdown()
