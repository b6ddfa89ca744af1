"""GPU detection on this host, NVML and nvidia-smi (processes: moved out of tests/unit/test_gpu.py, the unit tier
starts none)."""

from __future__ import annotations

import pytest

from enginefoundry.errors import ToolError
from enginefoundry.gpu.detect import (
    QUERY_FIELDS,
    arch_of,
    detect_driver,
    detect_gpus,
    gpu_unavailable_reason,
    parse_nvml_json,
)

NO_GPU = gpu_unavailable_reason()  # None where a GPU is visible


def test_detection_on_this_host_reports_the_truth():
    if NO_GPU is None:
        gpus = detect_gpus()
        assert gpus and all(g.arch == arch_of(g.compute_capability) for g in gpus)
        assert detect_driver()[0]
    else:
        with pytest.raises(ToolError, match=r"no NVIDIA GPU detected: NVML: .*; nvidia-smi: "):
            detect_gpus()
        assert detect_driver() == (None, None)


@pytest.mark.gpu
@pytest.mark.skipif(NO_GPU is not None, reason=f"no GPU: {NO_GPU}")
def test_nvml_and_nvidia_smi_agree_on_a_real_gpu(tmp_path):
    from enginefoundry.gpu.detect import _smi, nvml_snapshot

    assert parse_nvml_json(nvml_snapshot()) == _smi(tmp_path)
    assert set(QUERY_FIELDS) >= {"name", "compute_cap", "memory.total"}
