"""`stack.py up --owner-pid P`: when P dies, even by SIGKILL, the stack stops and no process of it is left."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from enginefoundry.model_server import free_port
from tests.support.paths import STACK_SCRIPT


def _stack_processes(state: Path) -> list[str]:
    out = subprocess.run(["pgrep", "-af", str(state)], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def test_a_killed_owner_takes_the_stack_down(tmp_path: Path) -> None:
    state = tmp_path / "stack"
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    env = {"PATH": "/usr/bin:/bin", "EF_HUB_PORT": str(free_port())}
    try:
        up = subprocess.run([sys.executable, str(STACK_SCRIPT), "up", "--state-dir", str(state), "--services", "hub",
                             "--owner-pid", str(owner.pid)], env=env, capture_output=True, text=True, timeout=120)
        assert up.returncode == 0, up.stdout + up.stderr
        assert (state / "pids" / "owner-watch.pid").is_file() and _stack_processes(state)
        owner.kill()
        owner.wait()
        deadline = time.monotonic() + 60
        while _stack_processes(state) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _stack_processes(state), _stack_processes(state)
        assert "stopping the stack" in (state / "logs" / "owner-watch.log").read_text()
        assert sorted(p.name for p in (state / "pids").iterdir()) == []
    finally:
        owner.kill()
        subprocess.run([sys.executable, str(STACK_SCRIPT), "down", "--state-dir", str(state)], capture_output=True)
