"""kill -9 of the process that started a tool, a model server or the temporary Prefect server leaves no process:
the whole group (grandchildren included) is gone within seconds. Each child carries a marker in its
environment; survivors are found by scanning /proc/*/environ for it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.processes import marked_processes, poll

REPO = Path(__file__).resolve().parents[2]

TOOL = """
import sys
from pathlib import Path
from enginefoundry.runner import run_tool
print("ready", flush=True)
run_tool(["sh", "-c", "sleep 300 & sleep 300 & wait"], Path(sys.argv[1]) / "tool.log", timeout_s=600)
"""

SERVER = """
import sys
from pathlib import Path
from enginefoundry.lanes.base import Command, ServeCommand
from enginefoundry.model_server import free_port, start_server
port = free_port()
code = (
    "import subprocess, sys, http.server as h\\n"
    "subprocess.Popen(['sleep', '300'])\\n"
    "h.HTTPServer(('127.0.0.1', int(sys.argv[sys.argv.index('--port') + 1])), h.SimpleHTTPRequestHandler)"
    ".serve_forever()\\n"
)
cmd = ServeCommand(command=Command(argv=[sys.executable, "-c", code, "--host", "127.0.0.1", "--port", str(port)]),
                   model_name="m", tokenizer_dir="t", health_path="/")
start_server(cmd, Path(sys.argv[1]) / "server.log", timeout_s=120)
print("ready", flush=True)
import time
time.sleep(600)
"""

PREFECT = """
import time
from enginefoundry.cli.common import quiet_prefect_defaults
quiet_prefect_defaults()
from prefect import flow

@flow
def sleeper():
    print("ready", flush=True)
    time.sleep(600)

sleeper()
"""



def marked(marker: str) -> list[str]:
    return marked_processes("EF_ORPHAN_MARK", marker)


@pytest.mark.parametrize(("script", "expected_children"), [(TOOL, 3), (SERVER, 2), (PREFECT, 1)],
                         ids=["tool-group", "model-server", "prefect-server"])
def test_kill_9_leaves_no_child(tmp_path: Path, script: str, expected_children: int) -> None:
    marker = uuid.uuid4().hex
    # Without PREFECT_API_URL (CI exports the stack's), as in embedded mode: the temporary server is the subject.
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env = {**env, "PYTHONPATH": str(REPO), "EF_ORPHAN_MARK": marker, "PREFECT_HOME": str(tmp_path / "p"),
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "300", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip() == "ready":
                break
        else:
            pytest.fail(f"the script ended before it was ready (rc {proc.wait()})")
        # The parent, its reaper, and the children the script started.
        assert poll(lambda: len(marked(marker)) >= 2 + expected_children, 60), marked(marker)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert poll(lambda: not marked(marker), 15), f"survivors: {marked(marker)}"
    finally:
        for line in marked(marker):
            os.kill(int(line.split()[0]), signal.SIGKILL)
