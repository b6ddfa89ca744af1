"""Ctrl-C in the middle of a run: no server process is left, and no manifest exists for the unit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tests.support.paths import REPO, TINY_MODEL, TINY_PROMPTS


def _processes(pattern: str) -> str:
    """Command lines of the running processes that match `pattern` (pgrep -af)."""
    return subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True).stdout


def _servers_for(marker: str) -> list[str]:
    """The unit's model servers: a `serve` process whose command line or working folder is under `marker`. The
    server runs as `transformers serve <model name>` from its `serve-cwd` folder beside its log (where the name
    links to the model), so its command line alone names no work path. AIPerf is not one, though its
    `--no-server-metrics` says "serve" (this check matched AIPerf alone before, and failed when it ran before AIPerf
    had started)."""
    found = []
    for line in _processes("serve").splitlines():
        pid, _, command = line.partition(" ")
        if "pgrep" in command or "aiperf" in command:
            continue
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:  # ended meanwhile
            continue
        if marker in command or cwd.startswith(marker):
            found.append(f"{line} (in {cwd})")
    return found


def test_ctrl_c_during_benchmark_stops_the_server_and_publishes_nothing(tmp_path: Path):
    spec = yaml.safe_load((REPO / "configs" / "tiny-cpu.yaml").read_text())
    spec["model"]["source"] = str(TINY_MODEL)
    spec["smoke"]["prompts"] = str(TINY_PROMPTS)
    spec["benchmark"].update({"concurrency": [1], "request_count": 400})  # long enough to interrupt
    spec["publish"] = {"store": f"file://{tmp_path}/store"}
    spec["tracking"] = {"mlflow_uri": f"sqlite:///{tmp_path}/mlflow.db", "experiment": "interrupt"}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    work = tmp_path / "work"
    env = {**os.environ, "EF_WORK_DIR": str(work), "PREFECT_HOME": str(tmp_path / "prefect"),
           "EF_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "enginefoundry.cli", "run", str(path)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    # Wait until the benchmark runs: its tool log exists and the server is up.
    while time.monotonic() < deadline and not list(work.glob("units/*/reports/bench/*/tool.log")):
        assert proc.poll() is None, proc.stdout.read()[-3000:] if proc.stdout else ""
        time.sleep(0.5)
    assert _servers_for(str(work)), "the unit's server should be running during the benchmark"
    # Interrupt while the benchmark client itself runs, not before it started.
    while time.monotonic() < deadline and str(work) not in _processes("aiperf"):
        assert proc.poll() is None, proc.stdout.read()[-3000:] if proc.stdout else ""
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    gone = time.monotonic() + 30  # the server's process group gets SIGTERM, then SIGKILL
    while _servers_for(str(work)) and time.monotonic() < gone:
        time.sleep(0.2)
    assert not _servers_for(str(work)), out[-2000:]
    docs = [json.loads(p.read_text()) for p in tmp_path.glob("store/manifests/*/*/*.json") if p.name != "current.json"]
    assert [d for d in docs if "unit" in d] == []
    assert [d for d in docs if "unit" not in d], "conversion finished before the interrupt"
    aiperf = _processes("aiperf")
    assert str(work) not in aiperf, aiperf
