"""The toolchain probe for real: a child interpreter (this one) says what it can import and what it cannot."""

from __future__ import annotations

import platform
import sys

import pytest

from enginefoundry.errors import ToolError
from enginefoundry.inputs.toolchain import detect_toolchain, installed_version, require_trtllm
from enginefoundry.lanes.trtllm import TrtllmLane
from enginefoundry.lanes.trtllm_engine import TrtllmEngineLane


def test_probe_of_this_interpreter(tmp_path):
    """A real child interpreter: what it can import is reported, what it cannot is an error entry."""
    info = detect_toolchain(sys.executable, log_dir=tmp_path, with_driver=False)
    assert info.python == platform.python_version()
    torch_version = installed_version("torch")
    assert info.torch == torch_version or (torch_version is None and "torch" in info.errors)
    if installed_version("tensorrt-llm") is None:
        assert info.tensorrt_llm is None and "ModuleNotFoundError" in info.errors["tensorrt_llm"]
        with pytest.raises(ToolError, match="lane trtllm-engine needs TensorRT-LLM"):
            require_trtllm(info, "trtllm-engine", "install it")
    assert (tmp_path / "toolchain-probe.log").is_file()


def test_versions_probe_this_interpreter():
    """The real probe (a child interpreter): here TensorRT-LLM is absent, so both lanes say how to get it."""
    if installed_version("tensorrt-llm") is None:
        with pytest.raises(ToolError, match=r"cannot import it .*tensorrt-llm>=1.0,<1.3"):
            TrtllmEngineLane().versions()
        with pytest.raises(ToolError, match=r"lane trtllm needs TensorRT-LLM.*release:<version>"):
            TrtllmLane().versions()
    else:
        assert "tensorrt_llm" in TrtllmLane().versions()
