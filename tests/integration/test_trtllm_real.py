"""The TensorRT-LLM lanes for real, where TensorRT-LLM and a GPU exist: convert, build and serve the tiny model."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from enginefoundry.gpu.detect import detect_gpus, gpu_unavailable_reason
from enginefoundry.inputs.toolchain import installed_version
from enginefoundry.inputs.units import expand_units
from enginefoundry.lanes import triton
from enginefoundry.lanes.trtllm import BUNDLE_INFO, RUNTIME_CONFIG, TrtllmLane
from enginefoundry.lanes.trtllm_engine import TrtllmEngineLane
from enginefoundry.model_server import free_port
from enginefoundry.spec import BuildSpec, parse_spec
from tests.support.paths import CONFIGS, TINY_MODEL

TINY = TINY_MODEL

# --- the real thing, where TensorRT-LLM and a GPU exist --------------------------------------------------------

def _real_reason() -> str | None:
    why = gpu_unavailable_reason()
    if why:
        return f"no GPU: {why}"
    if installed_version("tensorrt-llm") is None:
        return "TensorRT-LLM is not installed in this interpreter (pip install 'tensorrt-llm>=1.0,<1.3')"
    if not (TINY / "config.json").is_file():
        return f"the tiny test model is missing at {TINY} (scripts/make_tiny_model.py)"
    return None


REAL = _real_reason()


def _serve_until_healthy(argv: list[str], env: dict[str, str], health: str, timeout_s: float = 900) -> None:
    proc = subprocess.Popen(argv, env={**os.environ, **env}, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"{argv[0]} exited with {proc.returncode}"
            try:
                with urllib.request.urlopen(health, timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(2)
        raise AssertionError(f"{argv[0]} not healthy after {timeout_s}s")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def _tiny_spec(lane: str) -> BuildSpec:
    g = detect_gpus()[0]
    version = installed_version("tensorrt-llm")
    data = {
        "name": f"tiny-{lane}", "model": {"source": str(TINY), "name": "tiny-chat"}, "lane": lane,
        "toolchain": {"trtllm_version": version}, "variants": [{"precision": "fp16"}],
        "profiles": [{"name": "p", "max_batch_size": 4, "max_input_len": 64, "max_seq_len": 128,
                      "max_num_tokens": 256}],
        "targets": [{"name": "gpu", "arch": g.arch, "sku": [g.name], "gpu_count": 1}],
        "lane_options": {"triton_dir": os.environ.get("EF_TRITON_DIR", "/app")} if lane == "trtllm-engine" else {},
        "smoke": {"prompts": "prompts/general.jsonl"},
        "benchmark": {"scenarios": [{"name": "s", "input_tokens_mean": 8, "output_tokens_mean": 8}],
                      "concurrency": [1]},
        "publish": {"store": f"file://{tempfile.gettempdir()}/ef-store"},
    }
    return parse_spec(data, base_dir=CONFIGS)


@pytest.mark.gpu
@pytest.mark.skipif(REAL is not None, reason=str(REAL))
def test_real_pytorch_lane_builds_and_serves(tmp_path):
    spec = _tiny_spec("trtllm")
    lane = TrtllmLane()
    [unit] = expand_units(spec)
    assert lane.validate_options(spec) == []
    ckpt = lane.convert(spec, unit.variant, TINY, tmp_path / "convert")
    res = lane.build(spec, unit, Path(ckpt.checkpoint_dir), tmp_path / "build")
    bundle = Path(res.bundle_dir)
    assert (bundle / RUNTIME_CONFIG).is_file() and (bundle / BUNDLE_INFO).is_file()
    serve = lane.serve_command(bundle, "127.0.0.1", free_port())
    port = serve.command.argv[serve.command.argv.index("--port") + 1]
    _serve_until_healthy(serve.command.argv, serve.command.env, f"http://127.0.0.1:{port}{serve.health_path}")


@pytest.mark.gpu
@pytest.mark.skipif(REAL is not None or not os.environ.get("EF_TRTLLM_EXAMPLES_DIR"),
                    reason=str(REAL or "EF_TRTLLM_EXAMPLES_DIR is not set (TensorRT-LLM examples/ of the release)"))
def test_real_engine_lane_converts_builds_and_serves(tmp_path):
    spec = _tiny_spec("trtllm-engine")
    lane = TrtllmEngineLane()
    [unit] = expand_units(spec)
    if lane.validate_options(spec):
        pytest.skip(f"installed TensorRT-LLM cannot run the engine lane: {lane.validate_options(spec)}")
    ckpt = lane.convert(spec, unit.variant, TINY, tmp_path / "convert")
    res = lane.build(spec, unit, Path(ckpt.checkpoint_dir), tmp_path / "build")
    bundle = Path(res.bundle_dir)
    assert (bundle / "engine" / "rank0.engine").is_file() and (bundle / "engine" / "config.json").is_file()
    assert triton.check_repository(bundle / "triton_model_repo") == []
    serve = lane.serve_command(bundle, "127.0.0.1", free_port())
    port = serve.command.argv[serve.command.argv.index("--port") + 1]
    _serve_until_healthy(serve.command.argv, serve.command.env, f"http://127.0.0.1:{port}{serve.health_path}")
