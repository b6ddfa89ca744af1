"""The temporary Prefect API server that `enginefoundry run` starts before it imports Prefect
(orchestration/ephemeral.py: start_early_server, EarlyServer.adopt): Prefect uses it instead of starting its own, and a
kill -9 of the CLI at any moment (while it boots, once adopted) leaves no process behind. Each child carries a
marker in its environment; survivors are found by scanning /proc/*/environ for it."""

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

BOOTING = """
import time
from enginefoundry.cli.common import start_prefect_early
server = start_prefect_early()
assert server is not None
print("ready", flush=True)
time.sleep(600)
"""

ADOPTED = """
import sys
from enginefoundry.cli.common import start_prefect_early
server = start_prefect_early()
assert server is not None
from prefect import flow
from prefect.server.api.server import SubprocessASGIServer
assert server.adopt(300), "the early server was not adopted"

@flow
def answer() -> int:
    return 42

assert answer() == 42
prefects = SubprocessASGIServer()
print(f"server-pid {prefects.server_process.pid} early-pid {server.proc.pid}", flush=True)
if sys.argv[2] == "kill":
    print("ready", flush=True)
    import time
    time.sleep(600)
"""



def marked(marker: str) -> list[str]:
    return marked_processes("EF_ORPHAN_MARK", marker)


def _start(tmp_path: Path, script: str, marker: str, mode: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}  # embedded mode: no Prefect API
    env = {**env, "PYTHONPATH": str(REPO), "EF_ORPHAN_MARK": marker, "PREFECT_HOME": str(tmp_path / "p"),
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "300", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    return subprocess.Popen([sys.executable, "-c", script, str(tmp_path), mode], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


@pytest.mark.parametrize("script", [BOOTING, ADOPTED], ids=["while-booting", "adopted"])
def test_kill_9_leaves_no_prefect_server(tmp_path: Path, script: str) -> None:
    marker = uuid.uuid4().hex
    proc = _start(tmp_path, script, marker, "kill")
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if line.strip() == "ready":
                break
        else:
            pytest.fail(f"the script ended before it was ready (rc {proc.wait()}): {''.join(seen[-20:])}")
        # The parent, its reaper and the temporary server.
        assert poll(lambda: len(marked(marker)) >= 3, 60), marked(marker)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert poll(lambda: not marked(marker), 15), f"survivors: {marked(marker)}"
    finally:
        for line in marked(marker):
            os.kill(int(line.split()[0]), signal.SIGKILL)


def test_prefect_runs_flows_on_the_early_server_and_stops_it(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    proc = _start(tmp_path, ADOPTED, marker, "exit")
    try:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out[-3000:]
        assert "Starting temporary server" not in out, "Prefect started a second server"
        pids = next(line.split() for line in out.splitlines() if line.startswith("server-pid"))
        assert pids[1] == pids[3], f"Prefect's server is not the early one: {pids}"
        assert poll(lambda: not marked(marker), 15), f"left running after a normal exit: {marked(marker)}"
    finally:
        proc.kill()
        for line in marked(marker):
            os.kill(int(line.split()[0]), signal.SIGKILL)
