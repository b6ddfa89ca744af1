"""An all-hits run decides its hits before it pays for Prefect, model tooling or a server, and records
them in MLflow (in a background process, or before exiting with --wait-for-tracking); `run --force` after
it builds a new build instead of reporting a hit."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]

_PROBE = """
import sys
from enginefoundry.cli import main
rc = main(sys.argv[1:])
print("HEAVY", sorted(m for m in ("prefect", "torch", "transformers") if m in sys.modules))
sys.exit(rc)
"""


def _spec(tmp: Path) -> Path:
    doc = yaml.safe_load((REPO / "configs" / "tiny-cpu.yaml").read_text())
    doc["model"]["source"] = str(REPO / "tests" / "fixtures" / "tiny-chat" / "model")
    doc["smoke"]["prompts"] = str(REPO / "configs" / "prompts" / "tiny-chat.jsonl")
    doc["benchmark"]["enabled"] = False  # this is about what a hit costs, not about a benchmark
    doc["publish"]["store"] = f"file://{tmp / 'store'}"
    doc["tracking"]["mlflow_uri"] = f"sqlite:///{tmp / 'mlflow.db'}"
    path = tmp / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _poll_empty(folder: Path, timeout_s: float = 60) -> bool:
    deadline = time.monotonic() + timeout_s
    while folder.exists() and any(folder.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not folder.exists() or not any(folder.iterdir())


def _run(args: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "EF_WORK_DIR": str(tmp / "work"),
           "EF_CACHE_DIR": str(tmp / "cache"), "PREFECT_HOME": str(tmp / "prefect"),
           # A busy machine starts the ephemeral Prefect server slower than its 20 s default allows.
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"}
    return subprocess.run([sys.executable, "-c", _PROBE, *args], cwd=tmp, env=env, capture_output=True, text=True,
                          timeout=600)


def test_all_hits_run_skips_prefect_and_model_tooling_and_force_rebuilds(tmp_path: Path):
    spec = _spec(tmp_path)
    cold = _run(["run", str(spec)], tmp_path)
    assert cold.returncode == 0, cold.stdout[-3000:] + cold.stderr[-3000:]
    assert "HEAVY ['prefect'" in cold.stdout and "(cache hit)" not in cold.stdout

    t0 = time.monotonic()
    warm = _run(["run", str(spec)], tmp_path)
    wall = time.monotonic() - t0
    assert warm.returncode == 0, warm.stdout[-3000:] + warm.stderr[-3000:]
    assert "(cache hit)" in warm.stdout and "by a background process" in warm.stdout
    assert "HEAVY []" in warm.stdout, warm.stdout[-2000:]
    print(f"all-hits run: {wall:.1f} s wall")

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("enginefoundry-demo")

    def fast_runs() -> list:
        runs = client.search_runs([exp.experiment_id])
        parents = {r.info.run_id for r in runs if r.data.tags.get("enginefoundry.fast_path") == "true"
                   and r.info.status == "FINISHED"}
        return [r for r in runs if r.data.tags.get("mlflow.parentRunId") in parents
                and r.data.tags.get("enginefoundry.cache_hit") == "true" and r.info.status == "FINISHED"]

    deadline = time.monotonic() + 300  # the background recorder, on a busy machine
    while not fast_runs() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len(fast_runs()) == 1
    pending = tmp_path / "work" / "pending-hits"
    assert _poll_empty(pending), list(pending.iterdir())

    waited = _run(["run", str(spec), "--wait-for-tracking"], tmp_path)
    assert waited.returncode == 0 and "HEAVY []" in waited.stdout, waited.stdout[-2000:] + waited.stderr[-2000:]
    assert "MLflow parent run" in waited.stdout and len(fast_runs()) == 2

    forced = _run(["run", str(spec), "--force"], tmp_path)
    assert forced.returncode == 0, forced.stdout[-3000:] + forced.stderr[-3000:]
    assert "(cache hit)" not in forced.stdout and "all 1 unit(s) are published" not in forced.stdout
    built = [r for r in client.search_runs([exp.experiment_id])
             if r.data.tags.get("enginefoundry.cache_hit") == "false"]
    assert len(built) == 2  # the cold run's build and the forced one
