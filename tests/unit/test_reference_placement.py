"""Where the smoke reference runs (host CPU, the unit's GPUs, a sibling unit) and preflight's arithmetic: a
reference that fits nowhere the spec allows is refused with every fix that would fit in that spec."""

from __future__ import annotations

import json
from typing import Any

import yaml

from enginefoundry.gpu.detect import GPUInfo
from enginefoundry.inputs.model_shape import ModelShape
from enginefoundry.inputs.units import Unit, expand_units
from enginefoundry.planning.preflight import GIB, preflight, reference_check, reference_fit
from enginefoundry.spec import ReferenceDevice, parse_spec
from tests.support.paths import CONFIGS

LLAMA_70B = json.loads((CONFIGS / "model-configs" / "llama-3-70b-instruct.json").read_text())
SHAPE = ModelShape.from_config(LLAMA_70B)  # ≈70.6e9 params: fp32 ≈315 GiB, bf16 ≈158 GiB with the 20% margin
H100 = {"name": "h100", "arch": "sm90", "sku": ["H100"], "gpu_count": 8, "memory_gib": 80}


def _spec(variants: list[dict[str, Any]], targets: list[dict[str, Any]] | None = None, **smoke: Any):
    data = yaml.safe_load((CONFIGS / "tiny-cpu.yaml").read_text())
    data["variants"] = variants
    data["targets"] = targets or [H100]
    data["smoke"].update(smoke)
    return parse_spec(data, source="test spec", base_dir=CONFIGS)


def _unit(spec, variant: str) -> Unit:
    return next(u for u in expand_units(spec) if u.variant.name == variant)


def _check(spec, variant: str, host: int | None = None, gpus=None, on_worker: bool = False):
    return reference_check(spec, _unit(spec, variant), SHAPE, host, on_worker=on_worker, gpus=gpus)


def test_a_gpu_reference_is_measured_against_the_units_gpus_not_host_ram():
    spec = _spec([{"precision": "bf16", "tp": 4}, {"precision": "bf16", "tp": 1}], reference_device="gpu",
                 reference_precision="bf16", reference_host_memory_gib=16)
    tp4 = _check(spec, "bf16-tp4")  # 4 × 80 GiB × 0.88 ≈ 281.6 GiB ≥ ≈158 GiB; host RAM is not asked
    assert tp4.ok and "4× 80.0 GiB GPUs of target h100 (target.memory_gib) leave 281.6 GiB" in tp4.message
    tp1 = _check(spec, "bf16-tp1")  # 1 × 80 × 0.88 = 70.4 GiB < 158 GiB
    assert not tp1.ok and tp1.message.startswith("the bf16 smoke reference needs ≈157.7 GiB on GPUs")
    fit = reference_fit(spec, _unit(spec, "bf16-tp1"), SHAPE, "bf16", ReferenceDevice.GPU, None, None)
    assert fit.need == int(SHAPE.param_count() * 2 * 1.2) and fit.limit == int(80 * GIB * 0.88)


def test_detected_gpus_count_instead_of_tp_times_pp():
    spec = _spec([{"precision": "bf16"}], [{**H100, "gpu_count": 4}], reference_device="gpu",
                 reference_precision="bf16")
    gpus = [GPUInfo(index=i, name="NVIDIA H100 80GB HBM3", memory_total_mib=81559, compute_capability="9.0")
            for i in range(4)]
    check = _check(spec, "bf16-tp1", gpus=gpus, on_worker=True)
    assert check.ok and "4× 79.6 GiB GPUs of target h100 (detected NVIDIA H100 80GB HBM3)" in check.message


def test_a_gpu_reference_on_a_cpu_target_is_refused_with_the_cpu_fix():
    spec = _spec([{"precision": "fp32"}], [{"name": "cpu", "arch": "cpu", "gpu_count": 0}],
                 reference_device="gpu", reference_host_memory_gib=400, reference_precision="fp32")
    check = _check(spec, "fp32-tp1")
    assert not check.ok and "target cpu has no GPU" in check.message
    assert "smoke.reference_device: cpu (≈315.4 GiB on the host CPU)" in check.fix


def test_the_fix_lists_bf16_a_gpu_reference_a_larger_host_and_published_answers():
    spec = _spec([{"precision": "fp32", "tp": 8}], reference_host_memory_gib=64, reference_precision="fp32")
    check = _check(spec, "fp32-tp8")
    assert not check.ok
    options = check.fix.split("; or ")
    # bf16 (≈158 GiB) does not fit the 64 GiB host, so it is not offered on cpu; 8 × 80 GiB GPUs hold fp32.
    assert options == [
        "smoke.reference_device: gpu (≈315.4 GiB on 8× 80.0 GiB GPUs of target h100 (target.memory_gib))",
        "a larger reference host (smoke.reference_host_memory_gib ≥ 316)",
        "reference answers already published for this source (computed once where they fit)",
    ]


def test_bf16_on_the_gpus_is_offered_when_only_bf16_fits_there():
    spec = _spec([{"precision": "fp32", "tp": 4}], reference_device="gpu", reference_precision="fp32")
    check = _check(spec, "fp32-tp4")  # fp32 315 GiB > 281.6 GiB; bf16 158 GiB fits
    assert not check.ok
    assert check.fix.split("; or ")[0] == "smoke.reference_precision: bf16 (≈157.7 GiB on gpu)"
    assert "GPUs with more memory for target h100 (≥ 315.4 GiB in all)" in check.fix


def test_the_fix_names_the_concrete_sibling_whose_own_reference_fits():
    spec = _spec([{"precision": "bf16", "tp": 4}, {"precision": "fp8", "tp": 1}], reference_device="gpu",
                 reference_precision="bf16")
    check = _check(spec, "fp8-tp1")
    assert not check.ok
    assert ("smoke.reference: sibling with smoke.reference_sibling: bf16-tp4 (unit bf16-tp4.chat.h100, whose own "
            "bf16 reference fits, judges this unit by its served answers)") in check.fix.split("; or ")
    # No sibling is offered where none exists, or where the sibling's own reference would not fit either.
    lone = _spec([{"precision": "fp8", "tp": 1}], reference_device="gpu", reference_precision="bf16")
    assert "sibling" not in _check(lone, "fp8-tp1").fix
    small = _spec([{"precision": "bf16", "tp": 1}, {"precision": "fp8", "tp": 1}], reference_device="gpu",
                  reference_precision="bf16")
    assert "sibling" not in _check(small, "fp8-tp1").fix


def test_a_unit_judged_against_its_sibling_loads_no_reference():
    spec = _spec([{"precision": "bf16", "tp": 4}, {"precision": "fp8", "tp": 1}], reference_device="gpu",
                 reference_precision="bf16", reference="sibling", reference_sibling="bf16")
    report = preflight(spec, _unit(spec, "fp8-tp1"), LLAMA_70B, None)
    check = next(c for c in report.checks if c.name == "reference_memory")
    assert check.ok and check.message == ("judged against sibling unit bf16-tp4.chat.h100's served answers: no "
                                          "reference model is loaded")
    assert _check(spec, "bf16-tp4").ok  # the sibling itself is judged against the source, on its 4 GPUs


def test_unknown_gpu_memory_only_informs():
    spec = _spec([{"precision": "bf16"}], [{"name": "h100", "arch": "sm90", "gpu_count": 1}],
                 reference_device="gpu")
    check = _check(spec, "bf16-tp1")
    assert check.ok and "GPU memory is unknown" in check.message
