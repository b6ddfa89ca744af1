"""The issue 9 scenario through the CLI on a file:// store: `run --force` after a run makes a second build and
leaves the first intact (verify passes on both); a hit whose blob was damaged is refused and rebuilt. The forced
rebuild also judges `transformers serve` instead of the scoring server (issue 24: the smoke server option)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.support.paths import REPO, TINY_MODEL, TINY_PROMPTS


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "enginefoundry.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)


def _builds(store: Path) -> dict[str, dict]:
    return {p.as_uri(): json.loads(p.read_text()) for p in store.glob("manifests/*/*/2*.json")
            if "unit" in json.loads(p.read_text())}


def _smoke_report(store: Path, manifest: dict) -> dict:
    """The smoke.json a published build carries, read from its blob."""
    entry = next(f for f in manifest["files"] if f["path"] == "reports/smoke.json")
    return json.loads((store / "blobs" / "sha256" / entry["sha256"][:2] / entry["sha256"]).read_text())


def test_force_keeps_the_earlier_build_and_a_damaged_hit_is_rebuilt(tmp_path: Path):
    spec = yaml.safe_load((REPO / "configs" / "tiny-cpu.yaml").read_text())
    spec["model"]["source"] = str(TINY_MODEL)
    spec["smoke"]["prompts"] = str(TINY_PROMPTS)
    spec["benchmark"]["enabled"] = False  # this is about building and publishing
    store = tmp_path / "store"
    spec["publish"] = {"store": store.as_uri()}
    spec["tracking"] = {"mlflow_uri": f"sqlite:///{tmp_path}/mlflow.db", "experiment": "force"}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "EF_WORK_DIR": str(tmp_path / "work"), "PREFECT_HOME": str(tmp_path / "prefect"),
           "EF_CACHE_DIR": str(tmp_path / "cache"), "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "300"}

    first = _run(["run", str(path)], env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    # The rebuild judges `transformers serve` itself (lane option smoke_server): the same key (the option changes
    # how a build is judged, not what it is), and the log-prob checks are reported as not run (issue 24).
    spec["lane_options"] = {"smoke_server": "transformers"}
    path.write_text(yaml.safe_dump(spec))
    forced = _run(["run", str(path), "--force"], env)
    assert forced.returncode == 0, forced.stdout[-3000:] + forced.stderr[-3000:]
    assert "adopted" not in forced.stdout + forced.stderr
    builds = _builds(store)
    assert len(builds) == 2
    (scored, served) = [_smoke_report(store, builds[uri]) for uri in sorted(builds)]
    assert len({b["key"] for b in builds.values()}) == 1
    assert scored["server"] == "enginefoundry scoring server"
    assert scored["teacher_forced"]["available"] and scored["logprobs"]["available"]
    assert served["server"] == "transformers serve"
    assert not served["teacher_forced"]["available"] and not served["logprobs"]["available"]
    not_run = {r["name"]: r["detail"] for r in served["verdict"]["rules"] if r["detail"].startswith("not run")}
    assert {"log-prob distance", "teacher-forced log-probs"} <= set(not_run), served["verdict"]["rules"]
    for uri in builds:
        check = _run(["verify", uri], env)
        assert check.returncode == 0, check.stdout + check.stderr

    # Damage a blob of the current build (shorter): the next run refuses the hit and rebuilds.
    current = max(builds)  # build ids sort by time
    entry = next(f for f in builds[current]["files"] if f["path"].endswith("model.safetensors"))
    blob = store / "blobs" / "sha256" / entry["sha256"][:2] / entry["sha256"]
    data = blob.read_bytes()
    blob.unlink()  # a hard link of work files: replace it, do not write through it
    blob.write_bytes(data[:-10])
    third = _run(["run", str(path)], env)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    assert "cache hit" not in third.stdout
    assert "refused" in third.stdout + third.stderr
    verify = _run(["verify", "--json", max(_builds(store))], env)
    assert verify.returncode == 0, verify.stdout + verify.stderr
