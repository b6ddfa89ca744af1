"""The serve lifecycle: health wait, log tail on a failed start, the whole process group stopped."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from enginefoundry.errors import ToolError
from enginefoundry.lanes.base import Command, ServeCommand
from enginefoundry.model_server import free_port, serving, start_server
from enginefoundry.runner import run_tool

# A server that answers /health and spawns a grandchild, so a process-group kill can be checked.
SERVER = r"""
import http.server, subprocess, sys, pathlib
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
pathlib.Path(sys.argv[2]).write_text(str(child.pid))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split()[2] == "Z")


def _cmd(argv: list[str], port: int) -> ServeCommand:
    return ServeCommand(command=Command(argv=[*argv, "--host", "127.0.0.1", "--port", str(port)]),
                        model_name="m", tokenizer_dir=".")


def test_server_and_its_children_are_stopped(tmp_path):
    port = free_port()
    pidfile = tmp_path / "child.pid"
    script = tmp_path / "server.py"
    script.write_text(SERVER.replace("int(sys.argv[1])", str(port)).replace("sys.argv[2]", repr(str(pidfile))))
    with serving(_cmd([sys.executable, str(script)], port), tmp_path / "log") as ep:
        assert ep.base_url == f"http://127.0.0.1:{port}"
        server_pid, child_pid = ep.pid, int(pidfile.read_text())
        assert _alive(server_pid) and _alive(child_pid)
    deadline = time.time() + 5
    while time.time() < deadline and (_alive(server_pid) or _alive(child_pid)):
        time.sleep(0.1)
    assert not _alive(server_pid) and not _alive(child_pid)


def test_failed_start_puts_the_log_tail_in_the_error(tmp_path):
    argv = [sys.executable, "-c", "import sys; print('CUDA out of memory while loading'); sys.exit(3)"]
    with pytest.raises(ToolError, match=r"exited with code 3(.|\n)*CUDA out of memory while loading"):
        start_server(_cmd(argv, free_port()), tmp_path / "log", timeout_s=20)


def test_missing_server_binary_is_named(tmp_path):
    with pytest.raises(ToolError, match="'no-such-server' not found"):
        start_server(_cmd(["no-such-server"], free_port()), tmp_path / "log")


def test_tool_runner_timeout_kills_and_reports(tmp_path):
    with pytest.raises(ToolError, match=r"timed out after 1s(.|\n)*started"):
        run_tool([sys.executable, "-c", "print('started', flush=True); import time; time.sleep(60)"],
                 tmp_path / "t.log", timeout_s=1)
    run = run_tool([sys.executable, "-c", "print('hi')"], tmp_path / "ok.log", timeout_s=30)
    assert run.returncode == 0 and run.wall_s > 0 and (tmp_path / "ok.log").read_text() == "hi\n"
