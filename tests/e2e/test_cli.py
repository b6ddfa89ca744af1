"""CLI exit codes and messages: 0 success, 1 pipeline failure, 2 invalid input; no tracebacks for mistakes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from tests.support.paths import REPO


def _cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "enginefoundry.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_validate_ok_and_plan_lists_units():
    ok = _cli("validate", "configs/tiny-cpu.yaml")
    assert ok.returncode == 0 and "is valid" in ok.stdout
    plan = _cli("plan", "configs/tiny-cpu.yaml")
    assert plan.returncode == 0, plan.stderr
    assert "fp32-tp1.chat.cpu" in plan.stdout and "transformers serve" in plan.stdout
    assert "[smoke serve" in plan.stdout and "-m enginefoundry.smoke.serve" in plan.stdout  # the smoke stage's server


def test_invalid_spec_is_exit_2_with_field_paths_and_no_traceback(tmp_path):
    spec = yaml.safe_load((REPO / "configs" / "tiny-cpu.yaml").read_text())
    spec["variants"][0]["precission"] = "fp16"
    spec["model"]["source"] = "ftp://x"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(spec))
    for command in ("validate", "run", "plan"):
        result = _cli(command, str(path))
        assert result.returncode == 2, (command, result.stderr)
        assert "variants.0.precission: unknown key" in result.stderr
        assert "model.source: unknown source scheme 'ftp://'" in result.stderr
        assert "Traceback" not in result.stderr


def test_missing_local_source_is_exit_2_before_any_work(tmp_path):
    spec = yaml.safe_load((REPO / "configs" / "tiny-cpu.yaml").read_text())
    spec["model"]["source"] = str(tmp_path / "no-such-model")
    spec["smoke"]["prompts"] = str(REPO / "configs" / "prompts" / "tiny-chat.jsonl")
    spec["publish"] = {"store": f"file://{tmp_path}/store"}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = _cli("run", str(path))
    assert result.returncode == 2
    assert "does not exist" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "store").exists()


def test_reference_lane_refuses_quantized_precision_with_the_fix(tmp_path):
    spec = yaml.safe_load((REPO / "configs" / "tiny-cpu.yaml").read_text())
    spec["variants"] = [{"precision": "fp8"}]
    spec["smoke"]["prompts"] = str(REPO / "configs" / "prompts" / "tiny-chat.jsonl")
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = _cli("validate", str(path))
    assert result.returncode == 2
    assert "fp8 is not available on the reference lane" in result.stderr


def test_missing_prompt_set_is_an_input_error(tmp_path):
    spec = yaml.safe_load((REPO / "configs" / "tiny-cpu.yaml").read_text())
    spec["smoke"]["prompts"] = "nowhere.jsonl"
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = _cli("validate", str(path))
    assert result.returncode == 2 and "smoke.prompts" in result.stderr and "does not exist" in result.stderr
