"""`smoke.reference_precision: unit` (the default, issue 24): each unit judged against a source reference of its own
precision where transformers computes one, fp32 otherwise; preflight budgets that reference and the log-prob
spread's wider-arithmetic pass, and refuses with the field and the fix before any download."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import yaml

from enginefoundry.errors import SpecError
from enginefoundry.inputs.model_shape import ModelShape
from enginefoundry.inputs.units import Unit, expand_units
from enginefoundry.planning.plan_report import plan_report
from enginefoundry.planning.preflight import GIB, preflight, reference_check, unit_reference
from enginefoundry.spec import parse_spec
from tests.support.paths import CONFIGS

LLAMA_70B = json.loads((CONFIGS / "model-configs" / "llama-3-70b-instruct.json").read_text())
SHAPE = ModelShape.from_config(LLAMA_70B)
PARAMS = SHAPE.param_count()
VARIANTS = [{"precision": p} for p in ("fp32", "bf16", "fp16", "int8_wo", "fp8")]


H100 = {"name": "h100", "arch": "sm90", "sku": ["H100"], "gpu_count": 8, "memory_gib": 80}


def _spec(variants: list[dict[str, Any]] | None = None, targets: list[dict[str, Any]] | None = None, **smoke: Any):
    data = yaml.safe_load((CONFIGS / "tiny-cpu.yaml").read_text())
    data["variants"] = variants or VARIANTS
    data["targets"] = targets or data["targets"]
    data["smoke"].update(smoke)
    return parse_spec(data, source="test spec", base_dir=CONFIGS)


def _unit(spec, precision: str) -> Unit:
    return next(u for u in expand_units(spec) if u.variant.precision.value == precision)


def test_unit_is_the_default_and_anything_but_unit_or_a_computable_dtype_is_refused_with_the_field_and_fix():
    assert _spec().smoke.reference_precision == "unit"
    assert _spec(reference_precision="bf16").smoke.reference_precision == "bf16"
    with pytest.raises(SpecError) as err:
        _spec(reference_precision="fp8")
    ((field, message),) = err.value.problems
    assert field == "smoke.reference_precision"
    assert message.startswith("'fp8' is not a reference precision: use unit (each unit judged against a reference "
                              "of its own precision")
    assert "fp32, bf16, fp16" in message and "smoke.reference: sibling" in message


def test_each_unit_gets_the_reference_of_its_own_precision_where_transformers_computes_one():
    spec = _spec()
    got = {p["precision"]: unit_reference(spec, _unit(spec, p["precision"])) for p in VARIANTS}
    # (reference dtype, whether the spread is measured: like with like)
    # int8_wo: like with like by default, against its quantizer's simulation in the build's dtype (issue 39).
    assert got == {"fp32": ("fp32", True), "bf16": ("bf16", True), "fp16": ("fp16", True),
                   "int8_wo": ("bf16", True), "fp8": ("fp32", False)}
    assert spec.smoke.reference_for("bf16") == ("bf16", "the unit's own precision bf16 (like with like)")
    assert spec.smoke.reference_for("fp8")[1].startswith(
        "no fp8 reference of this lane's build: fp8 quantizes activations, which only a lane that exports its "
        "quantized checkpoint gives the gate")
    assert "bounds derived from the spread measured on the source's weights rounded to fp8" in \
        spec.smoke.reference_for("fp8")[1]
    fixed = _spec(reference_precision="bf16")
    assert {unit_reference(fixed, u) for u in expand_units(fixed)} == {("bf16", False)}  # one dtype, no spread


def test_preflight_budgets_the_spread_pass_in_wider_arithmetic():
    spec = _spec(reference_host_memory_gib=2000)
    checks = {p: reference_check(spec, _unit(spec, p), SHAPE, None, on_worker=False) for p in ("fp32", "bf16", "fp8")}
    # bf16: the float32 pass (4 bytes a parameter) outweighs the bf16 reference (2); fp32: float64 (8); fp8: the
    # fp32 reference alone (no spread).
    assert checks["bf16"].message.startswith(
        f"the bf16 smoke reference and its log-prob spread (float32 pass, like with like) needs "
        f"≈{PARAMS * 4 * 1.2 / GIB:.1f} GiB host memory")
    assert f"needs ≈{PARAMS * 8 * 1.2 / GIB:.1f} GiB" in checks["fp32"].message
    assert checks["fp8"].message.startswith(f"the fp32 smoke reference needs ≈{PARAMS * 4 * 1.2 / GIB:.1f} GiB")
    assert all(c.ok for c in checks.values())


def test_a_spread_that_does_not_fit_is_refused_with_the_field_and_the_fixed_dtype_fix():
    spec = _spec([{"precision": "bf16", "tp": 4}], [H100], reference_host_memory_gib=200)  # bf16 158, float32 315
    check = reference_check(spec, _unit(spec, "bf16"), SHAPE, None, on_worker=False)
    assert not check.ok and "log-prob spread (float32 pass" in check.message
    assert "smoke.reference_host_memory_gib allows 200.0 GiB" in check.message
    options = check.fix.split("; or ")
    assert options[0] == ("smoke.reference_precision: bf16 (≈157.7 GiB on cpu; one dtype for every unit: no "
                          "log-prob spread is measured, the family's table bounds)")
    # The unit's 4 × 80 GiB GPUs leave 281.6 GiB: too little for the float32 pass (≈315 GiB), enough for bf16 alone.
    assert options[1] == ("smoke.reference_device: gpu with smoke.reference_precision: bf16 (≈157.7 GiB on 4× 80.0 "
                          "GiB GPUs of target h100 (target.memory_gib))")
    assert "a larger reference host (smoke.reference_host_memory_gib ≥ 316)" in options


def test_plan_shows_the_reference_each_unit_is_judged_against():
    rows = {r["precision"]: r["reference"] for r in plan_report(_spec()).rows}
    assert rows == {"fp32": "fp32 (like with like)", "bf16": "bf16 (like with like)",
                    "fp16": "fp16 (like with like)",
                    "int8_wo": "simulated int8_wo (TensorRT-LLM's quantizer, the build's dtype; like with like)",
                    "fp8": "fp32 (no fp8 reference; bounds from the quantization spread)"}
    sib = _spec([{"precision": "bf16"}, {"precision": "fp8"}], reference="sibling", reference_sibling="bf16")
    assert {r["precision"]: r["reference"] for r in plan_report(sib).rows}["fp8"] == "sibling bf16-tp1"


def test_validate_names_the_reference_of_each_unit(tmp_path, capsys):
    from enginefoundry.cli import main
    from tests.support.paths import TINY_MODEL, TINY_PROMPTS

    data = yaml.safe_load((CONFIGS / "tiny-cpu.yaml").read_text())
    data["variants"] = [{"precision": "fp32"}, {"precision": "bf16"}]
    data["smoke"]["prompts"], data["model"]["source"] = str(TINY_PROMPTS), str(TINY_MODEL)
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(data))
    assert main(["validate", str(tmp_path / "spec.yaml"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["references"] == {
        "fp32-tp1.chat.cpu": "fp32 (like with like)", "bf16-tp1.chat.cpu": "bf16 (like with like)"}
    assert main(["validate", str(tmp_path / "spec.yaml")]) == 0
    assert "judged against bf16 (like with like): bf16-tp1.chat.cpu" in capsys.readouterr().out


QUANTIZED = [{"precision": p} for p in ("bf16", "int8_wo", "int4_wo", "int4_awq", "fp8")]


@pytest.mark.parametrize("setting", ["unit", "simulated"])
def test_unit_and_simulated_judge_each_weight_only_unit_against_its_simulation(setting):
    spec = _spec(QUANTIZED, reference_precision=setting)
    got = {p["precision"]: unit_reference(spec, _unit(spec, p["precision"])) for p in QUANTIZED}
    # fp8 quantizes activations: not simulated; int4_awq's scales depend on the lane's calibration data.
    assert got == {"bf16": ("bf16", True), "int8_wo": ("bf16", True), "int4_wo": ("bf16", True),
                   "int4_awq": ("fp32", False), "fp8": ("fp32", False)}
    assert spec.smoke.reference_for("int4_wo")[1].startswith(
        "the quantization tool's simulated int4_wo model of the source, computed in the build's compute dtype (the "
        "source's 16-bit dtype; fp16 for an fp32 source) (like with like")
    assert spec.smoke.reference_for("int4_awq")[1].startswith(
        "no int4_awq reference of this lane's build: its scales are searched on the lane's own calibration data")
    assert spec.smoke.reference_for("bf16") == ("bf16", "the unit's own precision bf16 (like with like)")
    rows = {r["precision"]: r["reference"] for r in plan_report(spec).rows}
    assert rows == {"bf16": "bf16 (like with like)",
                    "int8_wo": "simulated int8_wo (TensorRT-LLM's quantizer, the build's dtype; like with like)",
                    "int4_wo": "simulated int4_wo (TensorRT-LLM's quantizer, the build's dtype; like with like)",
                    "int4_awq": "fp32 (no int4_awq reference on lane reference: calibrated on its data; bounds "
                                "from the quantization spread)",
                    "fp8": "fp32 (no fp8 reference; bounds from the quantization spread)"}
    with pytest.raises(SpecError) as err:  # two answers to one question: refused when the spec is read
        _spec(QUANTIZED, reference_precision="simulated", reference="sibling", reference_sibling="bf16")
    ((field, message),) = err.value.problems
    assert field == "smoke" and "keep one" in message


def _checks(spec, precision: str, **kw) -> dict[str, Any]:
    report = preflight(spec, _unit(spec, precision), LLAMA_70B, None, **kw)
    return {c.name: c for c in report.checks}


def test_preflight_budgets_the_simulation_on_the_host_and_refuses_what_does_not_fit():
    fits = _checks(_spec(QUANTIZED, reference_precision="simulated", reference_host_memory_gib=2000), "int4_wo",
                   host_memory=1)
    assert fits["simulation"].ok and fits["simulation"].message.startswith(
        f"the int4_wo simulation (host CPU) needs ≈{PARAMS * 4 * 1.2 / GIB:.1f} GiB host memory "
        f"and ≈{PARAMS * 4 / GIB:.1f} GiB under the cache root")
    assert "simulation" in _checks(_spec(QUANTIZED, reference_host_memory_gib=2000), "int4_wo")  # unit simulates
    assert "simulation" not in _checks(_spec(QUANTIZED, reference_precision="fp32"), "int4_wo")  # one dtype
    for other in ("fp8", "int4_awq"):  # judged against fp32: the source's weights rounded, their proxy (issue 39)
        proxy = _checks(_spec(QUANTIZED, reference_host_memory_gib=2000), other)["simulation"]
        assert proxy.ok and proxy.message.startswith(f"rounding the source's weights to {other} (the proxy its task "
                                                     f"accuracy is judged against) (host CPU) needs ≈")
        assert "simulation" not in _checks(_spec(QUANTIZED, reference_precision="fp32"), other)
    small = _checks(_spec(QUANTIZED, reference_precision="simulated", reference_host_memory_gib=200), "int8_wo")
    assert not small["simulation"].ok and "smoke.reference_host_memory_gib allows 200.0 GiB" in \
        small["simulation"].message
    assert small["simulation"].fix.startswith(
        f"a reference host with ≥ {math.ceil(PARAMS * 4 * 1.2 / GIB)} GiB (smoke.reference_host_memory_gib)")


def test_the_pipelines_simulation_needs_no_modelopt(monkeypatch):
    """int8_wo and int4_wo are TensorRT-LLM's own quantizer, written out in smoke/simulated.py: a worker without the
    simulate extra simulates them."""
    import enginefoundry.smoke.simulated as simulated
    from enginefoundry.planning.preflight import simulation_check
    from tests.support.paths import TINY_MODEL

    monkeypatch.setattr(simulated, "modelopt_version", lambda: None)  # an environment without the extra
    spec = _spec(QUANTIZED, reference_precision="simulated", reference_host_memory_gib=1)
    tiny = ModelShape.from_config(json.loads((TINY_MODEL / "config.json").read_text()))
    check = simulation_check(spec, _unit(spec, "int4_wo"), tiny, None, on_worker=True)
    assert check.ok, check.message
    assert "nvidia-modelopt is not installed" in (simulated.can_simulate("int4_awq") or "")


def test_on_lane_trtllm_an_int4_awq_unit_is_judged_against_its_own_checkpoint_dequantized():
    """hf_ptq.py exports ModelOpt's unified checkpoint: `simulated` reads the unit's own quantization back."""
    data = yaml.safe_load((CONFIGS / "llama-3.1-8b-multiarch.yaml").read_text())
    data["variants"] = [{"precision": "bf16"}, {"precision": "int4_awq"}]
    data["smoke"]["reference_precision"] = "simulated"
    spec = parse_spec(data, source="test spec", base_dir=CONFIGS)
    unit = _unit(spec, "int4_awq")
    assert unit_reference(spec, unit) == ("bf16", True)
    rows = {r["unit"]: r["reference"] for r in plan_report(spec).rows}
    assert rows[unit.name] == "the lane's int4_awq checkpoint, dequantized (the build's dtype; like with like)"
    checks = _checks(spec, "int4_awq")  # the 70B shape
    assert checks["simulation"].message.startswith(
        f"dequantizing the lane's int4_awq checkpoint (host CPU) needs ≈{PARAMS * 4 * 2 * 1.2 / GIB:.1f} GiB")
    data["smoke"]["reference_precision"] = "unit"  # the default: like with like there too (issue 39)
    plain = parse_spec(data, source="test spec", base_dir=CONFIGS)
    assert unit_reference(plain, _unit(plain, "int4_awq")) == ("bf16", True)
    data["smoke"]["reference_precision"] = "fp32"  # one dtype: the fp32 source, no dequantization
    fixed = parse_spec(data, source="test spec", base_dir=CONFIGS)
    assert unit_reference(fixed, _unit(fixed, "int4_awq")) == ("fp32", False)


@pytest.mark.parametrize(("config_dtype", "override", "expected"), [
    ("bfloat16", None, "bf16"),
    ("float16", None, "fp16"),
    ("float32", None, "fp16"),  # convert_checkpoint.py turns an fp32 source into fp16 (gpu.precisions)
    ("float32", "bfloat16", "bf16"),  # the engine lane's dtype option wins
    (None, None, "bf16"),  # a config that names no dtype: SIMULATED_DTYPE
])
def test_a_simulation_computes_in_the_dtype_its_build_computes_in(tmp_path, config_dtype, override, expected):
    from enginefoundry.smoke.simulated import config_for, simulated_dtype

    config = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "intermediate_size": 128, "vocab_size": 256}
    if config_dtype:
        config["torch_dtype"] = config_dtype
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert simulated_dtype(tmp_path, override) == expected
    assert config_for("int8_wo", expected)["scale_dtype"] == expected  # its scales are stored in that dtype


def test_the_engine_lanes_dtype_option_is_the_dtype_its_simulation_computes_in():
    from enginefoundry.lanes.registry import get_lane

    data = yaml.safe_load((CONFIGS / "llama-3-70b-tp2-a100.yaml").read_text())
    spec = parse_spec(data, source="test spec", base_dir=CONFIGS)
    assert spec.lane == "trtllm-engine" and get_lane(spec.lane).dtype_option(spec) is None  # follows the source
    data.setdefault("lane_options", {})["dtype"] = "bfloat16"
    assert get_lane("trtllm-engine").dtype_option(parse_spec(data, source="test spec", base_dir=CONFIGS)) == "bfloat16"
    assert get_lane("reference").dtype_option(_spec()) is None  # no quantized builds of its own dtype
