"""Issue 23, audit finding 3: the installed-release check is preflight. A worker whose TensorRT-LLM is not the
release the spec pins is refused before the source is downloaded (docs/cli.md: refusal before any download or GPU
time), with one clean state message. Real child processes (the fake 1.1 toolchain's `python` and `--help`), the
Prefect ephemeral API; an unreachable hub, so a download attempt would show as a network error instead."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from enginefoundry.errors import PreflightError
from enginefoundry.flows.build_engines import build_engines
from enginefoundry.inputs.units import expand_units
from enginefoundry.lanes.trtllm import TrtllmLane
from enginefoundry.spec import parse_spec

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.fixture(autouse=True)
def _patient_ephemeral_server() -> Iterator[None]:
    from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, temporary_settings

    with temporary_settings(updates={PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: 180}):
        yield


@pytest.fixture
def worker_1_1(monkeypatch, fake_trtllm) -> TrtllmLane:
    """The trtllm lane on a worker whose image ships TensorRT-LLM 1.1.0 (the fake toolchain)."""
    root = fake_trtllm.release_dir("1.1")
    monkeypatch.setenv("PATH", f"{root / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("EF_FAKE_REAL_PYTHON", sys.executable)
    monkeypatch.setenv("EF_MODELOPT_DIR", str(root / "modelopt"))
    return TrtllmLane(python=str(root / "bin" / "python"))


def pinned_spec(tmp_path: Path) -> dict:
    data = yaml.safe_load((CONFIGS / "llama-3.1-8b-multiarch.yaml").read_text())
    data["toolchain"] = {"trtllm_version": "1.2.1"}
    data["model"] = {"source": "hf://nobody/not-downloaded@main", "name": "llama-3.1-8b-instruct"}
    data["variants"] = [{"precision": "bf16"}]
    data["targets"] = data["targets"][-1:]
    data["publish"] = {"store": f"file://{tmp_path / 'store'}"}
    data["tracking"] = {"experiment": "preflight", "mlflow_uri": f"file://{tmp_path / 'mlruns'}"}
    data["smoke"]["prompts"] = str(CONFIGS / "prompts" / "general.jsonl")
    return data


def test_the_lane_refuses_another_release_in_preflight(tmp_path, worker_1_1):
    spec = parse_spec(pinned_spec(tmp_path), base_dir=CONFIGS)
    unit = expand_units(spec)[0]
    with pytest.raises(PreflightError, match=r"pins TensorRT-LLM 1\.2\.1 and the worker has 1\.1\.0 installed"):
        worker_1_1.check_installed(spec, unit)


def test_the_build_is_refused_before_the_source_is_downloaded(tmp_path, monkeypatch, worker_1_1):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: a download would fail loudly
    monkeypatch.setattr("enginefoundry.flows.build_engines.get_lane", lambda name: worker_1_1, raising=False)
    state = build_engines(spec=pinned_spec(tmp_path), validated=True, return_state=True)
    assert state.is_failed()
    assert "pins TensorRT-LLM 1.2.1 and the worker has 1.1.0 installed" in state.message, state.message
    assert "Traceback" not in state.message
    assert not (tmp_path / "mlruns").exists()  # the parent run starts after the download: never reached
