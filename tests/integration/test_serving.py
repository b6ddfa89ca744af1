"""The serve lifecycle: health wait, log tail on a failed start, the whole process group stopped."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from enginefoundry.errors import ToolError
from enginefoundry.lanes import get_lane
from enginefoundry.lanes.base import Command, ServeCommand
from enginefoundry.lanes.reference import ReferenceLane
from enginefoundry.lanes.serve_files import serving_plan, write_serving_files
from enginefoundry.model_server import free_port, serving, start_server
from enginefoundry.runner import run_tool
from tests.support.bundle import build_tiny_bundle

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


def _chat(base_url: str, model: str) -> tuple[int, dict]:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "What is 2 plus 2?"}],
                       "max_tokens": 4}).encode()
    request = urllib.request.Request(f"{base_url}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _wait_healthy(proc: subprocess.Popen[bytes], url: str) -> None:
    deadline = time.monotonic() + 180
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            assert proc.poll() is None, f"serve.sh exited with {proc.returncode}"
            assert time.monotonic() < deadline, "serve.sh did not become healthy in 180 s"
            time.sleep(0.5)


def test_the_model_name_is_the_openai_model_name_in_the_pipeline_and_in_serve_sh(tmp_path: Path) -> None:
    """Issue 25: requests carry `"model": "tiny-chat"` (the spec's model.name), not the bundle's path, both for
    the pipeline's own server (smoke, bench) and for the published serve.sh, on a real `transformers serve`."""
    bundle = build_tiny_bundle(tmp_path / "work")
    cmd = ReferenceLane().named_serve_command(bundle, "127.0.0.1", free_port(), "tiny-chat")
    assert cmd.model_name == "tiny-chat"
    with serving(cmd, tmp_path / "log" / "server.log") as endpoint:
        assert endpoint.model_name == "tiny-chat"
        status, answer = _chat(endpoint.base_url, "tiny-chat")
        assert status == 200, answer
        assert answer["choices"][0]["message"]["content"]
        status, refused = _chat(endpoint.base_url, "another-model")
        assert status == 400, refused  # still pinned: only its own name is answered
    # The published serve.sh, run from an unpacked copy of the unit folder.
    plan = serving_plan(get_lane("reference"), bundle, unit="u", model="tiny-chat", key="k" * 64,
                        artifact_uri="file:///store/u", checkpoint_dir=None, checkpoint_uri=None)
    assert plan.openai_model_name == "tiny-chat"
    unit = tmp_path / "unpacked"
    shutil.copytree(bundle, unit / "bundle", symlinks=False)
    write_serving_files(plan, unit / "serving")
    port = free_port()
    env = {**os.environ, "EF_UNIT_DIR": str(unit), "PORT": str(port), "OMP_NUM_THREADS": "1",
           "TMPDIR": str(tmp_path), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.Popen(["sh", str(unit / "serving" / "serve.sh")], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_healthy(proc, f"http://127.0.0.1:{port}/health")
        status, answer = _chat(f"http://127.0.0.1:{port}", "tiny-chat")
        assert status == 200, answer
        assert answer["choices"][0]["message"]["content"]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_a_name_that_is_not_a_plain_file_name_keeps_the_path(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    (bundle / "model").mkdir(parents=True)
    (bundle / "bundle.json").write_text(json.dumps({"params": {"device": "cpu"}}))
    for name in ("org/model", "../x", "-rf", "a:b.gguf", ".hidden", "x\n"):
        cmd = ReferenceLane().named_serve_command(bundle, "127.0.0.1", 8000, name)
        assert cmd.model_name == str((bundle / "model").resolve()), name
        assert not cmd.links
