"""Rollout policy checks that run a process (GPU detection, the serving scripts): moved out of
tests/unit/test_rollout_policy.py, the unit tier starts none."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from enginefoundry.errors import PreflightError
from enginefoundry.gpu.placement import check_placement
from enginefoundry.lanes import get_lane
from enginefoundry.lanes.serve_files import serve_script, serving_plan, write_serving_files
from enginefoundry.spec import Target


def test_placement_refuses_a_gpu_target_here_and_a_wrong_pool() -> None:
    cpu = Target(name="cpu", arch="cpu", gpu_count=0)
    assert "any machine" in check_placement(cpu, "cpu")
    with pytest.raises(PreflightError, match="belongs to work pool cpu, but this run came from pool gpu-sm90"):
        check_placement(cpu, "gpu-sm90")
    h100 = Target(name="h100", arch="sm90", sku=["H100"])
    if _has_gpu():
        pytest.skip("this machine has a GPU; the refusal is checked on GPU-less machines")
    with pytest.raises(PreflightError, match=r"target h100 needs 1× sm90 .*run this unit on a worker of pool gpu-sm90"):
        check_placement(h100, "gpu-sm90")


def _has_gpu() -> bool:
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def test_serving_files_are_relocatable(tmp_path: Path) -> None:
    bundle = tmp_path / "work" / "units" / "abc" / "bundle"
    (bundle / "model").mkdir(parents=True)
    (bundle / "bundle.json").write_text(json.dumps({"params": {"device": "cpu"}}))
    plan = serving_plan(get_lane("reference"), bundle, unit="fp32-tp1.chat.cpu", model="tiny", key="k" * 64,
                        artifact_uri="s3://b/artifacts/tiny/kkk", checkpoint_dir=tmp_path / "ckpt", checkpoint_uri=None)
    # Served under the model's name, which the server's working folder links to the relocated model (issue 25).
    assert plan.argv == ["transformers", "serve", "tiny", "--host", "${HOST}", "--port", "${PORT}", "--device", "cpu"]
    assert plan.links == {"tiny": "${EF_UNIT_DIR}/bundle/model"}
    assert plan.openai_model_name == "tiny"
    assert set(plan.needs) == {"EF_UNIT_DIR"}  # the reference bundle carries its checkpoint
    script = serve_script(plan)
    assert str(tmp_path) not in script and str(tmp_path) not in json.dumps(plan.model_dump())
    files = write_serving_files(plan, tmp_path / "serving")
    assert [f.name for f in files] == ["serve.sh", "serve.yaml"] and files[0].stat().st_mode & 0o111
    # The script refuses to start without the unit folder, naming what to download.
    run = subprocess.run(["sh", str(files[0])], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert run.returncode != 0 and "EF_UNIT_DIR" in run.stderr and "s3://b/artifacts/tiny/kkk" in run.stderr
    # ... and without its server on PATH, naming it and how to get it (issue 33).
    run = subprocess.run(["sh", str(files[0])], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "EF_UNIT_DIR": str(tmp_path)})
    assert run.returncode == 127 and "transformers is not on PATH" in run.stderr, run.stderr
