"""`stack.py down` stops what a service left outside its process group: a worker's flow run starts in a session of
its own (and may ignore TERM), so stopping the worker's group misses it; it still carries the stack's marker in its
environment (stacklib.supervisor.MARKER_ENV), and `down` stops every process that does. A process without the marker
is left alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from enginefoundry.model_server import free_port
from tests.support.paths import STACK_SCRIPT

# A flow run as a worker leaves it: its own session, the stack's environment, TERM ignored.
STUBBORN = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); "
            "time.sleep(600)")


def _stubborn(**env: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", STUBBORN], start_new_session=True, stdout=subprocess.PIPE,
                            env={**os.environ, **env})
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    return proc


def test_down_stops_a_marked_process_outside_every_service_group_and_nothing_else(tmp_path: Path) -> None:
    state = tmp_path / "stack"
    env = {"PATH": "/usr/bin:/bin", "EF_HUB_PORT": str(free_port())}
    started: list[subprocess.Popen[bytes]] = []
    try:
        up = subprocess.run([sys.executable, str(STACK_SCRIPT), "up", "--state-dir", str(state), "--services",
                             "hub"], env=env, capture_output=True, text=True, timeout=120)
        assert up.returncode == 0, up.stdout + up.stderr
        straggler = _stubborn(EF_STACK_DIR=str(state.resolve()))
        bystander = _stubborn()
        started += [straggler, bystander]
        down = subprocess.run([sys.executable, str(STACK_SCRIPT), "down", "--state-dir", str(state)], env=env,
                              capture_output=True, text=True, timeout=120)
        assert down.returncode == 0, down.stdout + down.stderr
        assert f"stopped 1 process(es) the services started outside their groups: [{straggler.pid}]" in down.stdout
        assert straggler.wait(timeout=10) == -9  # TERM ignored: KILL
        assert bystander.poll() is None  # no marker: not ours
    finally:
        for proc in started:
            proc.kill()
            proc.wait()
        subprocess.run([sys.executable, str(STACK_SCRIPT), "down", "--state-dir", str(state)], capture_output=True)
