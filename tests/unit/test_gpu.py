"""GPU parsing on the real H200 fixtures and hand-made variants; target matching; detection on this host."""

from __future__ import annotations

import json

import pytest

from enginefoundry.errors import PreflightError, ToolError
from enginefoundry.gpu.detect import (
    NVIDIA_SMI_ARGV,
    GPUInfo,
    arch_of,
    cuda_driver_text,
    describe_gpus,
    match_target,
    parse_nvml_json,
    parse_smi_csv,
)
from enginefoundry.spec import Arch, Target
from tests.support.paths import FIXTURES

FIX = FIXTURES / "gpu"
H200_UUID = "GPU-37da5665-9c31-db42-5943-febfdcdf87c6"


def smi(folder: str, name: str = "query-gpu-noheader.csv", **kw) -> list[GPUInfo]:
    return parse_smi_csv((FIX / folder / name).read_text(), **kw)


def test_query_is_the_documented_one():
    assert NVIDIA_SMI_ARGV == ["nvidia-smi",
                               "--query-gpu=index,name,uuid,compute_cap,memory.total,driver_version",
                               "--format=csv,noheader,nounits"]


def test_real_h200_query_with_header_and_units():
    [g] = smi("h200", "query-gpu.csv")
    assert (g.index, g.name, g.uuid) == (0, "NVIDIA H200", H200_UUID)
    assert (g.compute_capability, g.arch) == ("9.0", "sm90")
    assert g.memory_total_mib == 143771
    assert g.driver_version == "580.159.04"
    assert round(g.memory_gib) == 140


def test_real_h200_noheader_with_other_columns():
    [g] = smi("h200", fields=("name", "compute_cap", "memory.total", "driver_version"))
    assert (g.index, g.name, g.uuid, g.arch, g.memory_total_mib, g.driver_version) == (
        0, "NVIDIA H200", None, "sm90", 143771, "580.159.04")


def test_real_h200_enginefoundry_query():
    [g] = smi("h200", "query-gpu-enginefoundry.csv")
    assert (g.name, g.arch, g.memory_total_mib, g.driver_version) == ("NVIDIA H200", "sm90", 143771, "580.159.04")
    assert g.uuid and g.uuid.startswith("GPU-")


def test_real_h200_nvml_snapshot_agrees_with_nvidia_smi():
    [g] = parse_nvml_json(json.loads((FIX / "h200" / "nvml.json").read_text()))
    [s] = smi("h200", "query-gpu.csv")
    assert g == s  # same name, uuid, capability, MiB (150754820096 B = 143771 MiB) and driver


@pytest.mark.parametrize(("folder", "name", "cc", "arch", "mib"), [
    ("a100", "NVIDIA A100-SXM4-80GB", "8.0", "sm80", 81920),
    ("l40s", "NVIDIA L40S", "8.9", "sm89", 46068),
    ("b200", "NVIDIA B200", "10.0", "sm100", 183359),
])
def test_handmade_skus(folder, name, cc, arch, mib):
    [g] = smi(folder)
    assert (g.name, g.compute_capability, g.arch, g.memory_total_mib) == (name, cc, arch, mib)


def test_b200_nvml_two_digit_major():
    [g] = parse_nvml_json(json.loads((FIX / "b200" / "nvml.json").read_text()))
    assert (g.compute_capability, g.arch, g.memory_total_mib) == ("10.0", "sm100", 183359)


def test_multi_gpu_and_header_with_two_rows():
    gpus = smi("h100x8")
    assert [g.index for g in gpus] == list(range(8))
    assert {g.arch for g in gpus} == {"sm90"} and len({g.uuid for g in gpus}) == 8
    a100 = smi("a100", "query-gpu.csv")
    assert [g.index for g in a100] == [0, 1] and all(g.memory_total_mib == 81920 for g in a100)


def test_parse_errors_name_the_problem():
    with pytest.raises(ToolError, match="lacks the columns"):
        parse_smi_csv("0, NVIDIA H200\n", fields=("index", "name"))
    with pytest.raises(ToolError, match="row 1 has 2 columns"):
        parse_smi_csv("0, NVIDIA H200\n")
    with pytest.raises(ToolError, match="no compute capability"):
        parse_smi_csv("0, NVIDIA H200, GPU-x, [N/A], 143771, 580.1\n")
    assert parse_smi_csv("\n\n") == []


def test_gpuinfo_derives_and_checks_arch():
    assert GPUInfo(index=0, name="x", compute_capability="12.0", memory_total_mib=1).arch == "sm120"
    with pytest.raises(ValueError, match="does not match"):
        GPUInfo(index=0, name="x", compute_capability="9.0", arch="sm80", memory_total_mib=1)
    with pytest.raises(ValueError, match=r"major\.minor"):
        GPUInfo(index=0, name="x", compute_capability="nine", memory_total_mib=1)
    assert arch_of("8.6") == "sm86"
    assert cuda_driver_text(13000) == "13.0" and cuda_driver_text(12080) == "12.8" and cuda_driver_text(None) is None


def target(**kw) -> Target:
    base = {"name": "h100", "arch": "sm90", "sku": ["H100", "H200", "GH200"], "gpu_count": 1}
    return Target.model_validate({**base, **kw})


def test_h100_target_takes_an_h200_both_sm90():
    [g] = match_target(target(), smi("h200", "query-gpu.csv"))
    assert g.name == "NVIDIA H200"


def test_architecture_mismatch_is_refused_with_pool():
    with pytest.raises(PreflightError, match="architecture does not match; run this unit on a worker of pool gpu-sm80"):
        match_target(target(name="a100", arch="sm80", sku=["A100"]), smi("h200", "query-gpu.csv"))


def test_sku_mismatch_is_refused():
    with pytest.raises(PreflightError, match=r"SKU is not one of \['H100'\]"):
        match_target(target(sku=["H100"]), smi("h200", "query-gpu.csv"))


def test_too_few_gpus_is_refused():
    with pytest.raises(PreflightError, match=r"needs 2× sm90 .* has 1 matching"):
        match_target(target(gpu_count=2), smi("h200", "query-gpu.csv"))
    with pytest.raises(PreflightError, match="no visible GPU"):
        match_target(target(), [])


def test_multi_gpu_selects_the_first_n_of_one_model():
    used = match_target(target(gpu_count=4), smi("h100x8"))
    assert [g.index for g in used] == [0, 1, 2, 3]


def test_mixed_host_needs_one_gpu_model():
    mixed = smi("mixed")
    with pytest.raises(PreflightError, match="mixes"):
        match_target(target(gpu_count=2), mixed)
    [g] = match_target(target(gpu_count=1, sku=["H200"]), mixed)
    assert g.index == 1
    [a] = match_target(target(name="a100", arch="sm80", sku=["A100"]), mixed)
    assert a.index == 2
    assert describe_gpus(mixed).count("1×") == 3


def test_cpu_target_needs_no_gpu():
    assert match_target(Target(name="cpu", arch=Arch.CPU, gpu_count=0), []) == []


def test_a_unit_needs_its_tp_x_pp_gpus_not_the_targets_count():
    """A tp=2 unit of an 8-GPU target runs in a 2-GPU job (its job variables ask for tp × pp): placement must
    accept a host that shows 2 GPUs, and take only 2 of an 8-GPU host."""
    two = smi("h100x8")[:2]
    assert [g.index for g in match_target(target(gpu_count=8), two, count=2)] == [0, 1]
    assert len(match_target(target(gpu_count=8), smi("h100x8"), count=2)) == 2
    with pytest.raises(PreflightError, match=r"needs 8× sm90"):
        match_target(target(gpu_count=8), two)
