"""Preflight: each rule refuses what it must and nothing else; the memory estimates are sane."""

from __future__ import annotations

import json

import pytest

from enginefoundry.errors import InputError, PreflightError
from enginefoundry.gpu.detect import parse_nvml_json, parse_smi_csv
from enginefoundry.inputs.units import Unit, expand_units
from enginefoundry.planning.preflight import (
    GIB,
    OVERSUBSCRIPTION_LIMIT,
    ModelShape,
    format_estimates,
    free_disk_bytes,
    host_memory_bytes,
    preflight,
)
from enginefoundry.spec import BuildSpec, Profile, Target, Variant, load_spec
from tests.support.paths import CONFIGS, FIXTURES, REPO

ROOT = REPO
FIX = FIXTURES
REPO_CONFIGS = CONFIGS / "model-configs"
LLAMA_70B = json.loads((REPO_CONFIGS / "llama-3-70b-instruct.json").read_text())
LLAMA_8B = json.loads((REPO_CONFIGS / "llama-3.1-8b-instruct.json").read_text())


def load(name: str) -> BuildSpec:
    return load_spec(ROOT / "configs" / name)


def make_unit(spec: BuildSpec, *, variant: dict | None = None, profile: dict | None = None,
              target: dict | None = None) -> Unit:
    base = expand_units(spec)[0]
    return Unit(
        variant=Variant(**{**base.variant.model_dump(exclude={"targets"}), **(variant or {})}),
        profile=Profile(**{**base.profile.model_dump(), **(profile or {})}),
        target=Target(**{**base.target.model_dump(), **(target or {})}),
    )


def failed(report) -> dict[str, str]:
    return {c.name: c.message + " | fix: " + (c.fix or "") for c in report.problems}


def check(report, name: str):
    return next(c for c in report.checks if c.name == name)


A100 = {"name": "a100", "arch": "sm80", "sku": ["A100"], "gpu_count": 1, "memory_gib": 80}
L40S = {"name": "l40s", "arch": "sm89", "sku": ["L40S"], "gpu_count": 1, "memory_gib": 48}
H100 = {"name": "h100", "arch": "sm90", "sku": ["H100", "H200"], "gpu_count": 1, "memory_gib": 80}
B200 = {"name": "b200", "arch": "sm100", "sku": ["B200"], "gpu_count": 1, "memory_gib": 180}
RTX = {"name": "rtx-pro", "arch": "sm120", "sku": [], "gpu_count": 1, "memory_gib": 96}


# --- model shapes --------------------------------------------------------------------------------------------

def test_param_counts_of_the_llama_configs():
    assert ModelShape.from_config(LLAMA_70B).param_count() == pytest.approx(70.55e9, rel=0.002)
    assert ModelShape.from_config(LLAMA_8B).param_count() == pytest.approx(8.03e9, rel=0.002)
    s = ModelShape.from_config(LLAMA_8B)
    assert (s.head_dim, s.num_key_value_heads, s.dtype, s.context_limit) == (128, 8, "bfloat16", 131072)
    assert ModelShape.from_config(LLAMA_70B).context_limit == 8192
    with pytest.raises(InputError, match="lacks hidden_size"):
        ModelShape.from_config({"num_attention_heads": 8})


# --- the shipped configs -------------------------------------------------------------------------------------

def test_every_unit_of_the_shipped_configs_passes():
    for name, cfg in (("llama-3-70b-tp2-a100.yaml", LLAMA_70B), ("llama-3.1-8b-multiarch.yaml", LLAMA_8B)):
        spec = load(name)
        for unit in expand_units(spec):
            report = preflight(spec, unit, cfg, None)
            assert report.ok, (unit.name, failed(report))


def test_70b_fp16_tp2_on_two_a100_80gb_has_a_sane_kv_pool():
    spec = load("llama-3-70b-tp2-a100.yaml")
    [unit] = expand_units(spec)
    report = preflight(spec, unit, LLAMA_70B, None)
    e = report.estimates
    assert report.ok
    assert 62 * GIB < e.weights_bytes_per_gpu < 70 * GIB  # 141 GB of fp16 weights over 2 GPUs (+ embedding)
    assert e.kv_bytes_per_token_per_gpu == 80 * 2 * 4 * 128 * 2  # layers × K,V × kv heads/tp × head_dim × fp16
    assert 40_000 < e.kv_tokens_fit < 90_000
    assert e.full_sequences_fit >= 6  # fewer than max_batch_size 128 at full length: fine with paged KV
    assert 1 < e.oversubscription < OVERSUBSCRIPTION_LIMIT
    assert "paged KV admits fewer" in check(report, "kv_budget").message


def test_70b_fp16_on_one_a100_is_refused_with_the_fix():
    spec = load("llama-3-70b-tp2-a100.yaml")
    unit = make_unit(spec, variant={"tp": 1}, target={**A100, "memory_gib": 80})
    problems = failed(preflight(spec, unit, LLAMA_70B, None))
    assert "weights need 131" in problems["weights_fit"]
    assert "tp 2 on 2+ GPUs" in problems["weights_fit"] and "int4_awq" in problems["weights_fit"]
    assert "fp8" not in problems["weights_fit"]  # not an option on sm80


# --- precision × architecture --------------------------------------------------------------------------------

@pytest.mark.parametrize(("precision", "target", "ok"), [
    ("fp8", A100, False), ("fp8", L40S, True), ("fp8", H100, True), ("fp8", B200, True),
    ("nvfp4", H100, False), ("nvfp4", A100, False), ("nvfp4", B200, True), ("nvfp4", RTX, True),
    ("int8_wo", A100, True), ("int8_wo", H100, True), ("int8_wo", B200, False),
    # the trtllm lane: W4A16 AWQ is "." on sm120 in the PyTorch backend's hardware matrix (quantization.md)
    ("int4_awq", L40S, True), ("int4_awq", RTX, False), ("int4_wo", B200, False),
    ("bf16", A100, True), ("fp16", B200, True),
])
def test_precision_vs_architecture(precision, target, ok):
    spec = load("llama-3.1-8b-multiarch.yaml")
    report = preflight(spec, make_unit(spec, variant={"precision": precision, "kv_cache_dtype": "auto"},
                                       target=target), LLAMA_8B, None)
    assert check(report, "precision_arch").ok is ok
    assert report.ok is ok, failed(report)


def test_fp8_on_sm80_names_the_fix():
    spec = load("llama-3.1-8b-multiarch.yaml")
    problems = failed(preflight(spec, make_unit(spec, variant={"precision": "fp8"}, target=A100), LLAMA_8B, None))
    assert "fp8 needs sm89+ and target a100 is sm80" in problems["precision_arch"]
    assert "variants[].targets" in problems["precision_arch"]


def test_kv_cache_dtype_vs_architecture():
    spec = load("llama-3.1-8b-multiarch.yaml")
    # The PyTorch backend has an FP8 KV cache on Ampere; the engine path does not (facts §0).
    assert preflight(spec, make_unit(spec, variant={"kv_cache_dtype": "fp8"}, target=A100), LLAMA_8B, None).ok
    assert preflight(spec, make_unit(spec, variant={"kv_cache_dtype": "fp8"}, target=L40S), LLAMA_8B, None).ok
    engine = load("llama-3-70b-tp2-a100.yaml")
    fp8_kv_a100 = preflight(engine, make_unit(engine, variant={"kv_cache_dtype": "fp8"},
                                              target={**A100, "gpu_count": 2}), LLAMA_70B, None)
    assert "FP8 KV cache needs sm89+" in failed(fp8_kv_a100)["kv_dtype_arch"]
    int8_kv_b200 = preflight(engine, make_unit(engine, variant={"kv_cache_dtype": "int8"},
                                               target={**B200, "gpu_count": 2}), LLAMA_70B, None)
    assert "SM>=100" in failed(int8_kv_b200)["kv_dtype_arch"]


# --- plugins, lengths, parallelism ---------------------------------------------------------------------------

def test_plugin_dtype_must_match_the_model_dtype():
    spec = load("llama-3-70b-tp2-a100.yaml")
    unit = expand_units(spec)[0]
    assert [c.ok for c in preflight(spec, unit, LLAMA_70B, None).checks if c.name == "plugin_dtype"] == [True, True]
    bf16 = spec.model_copy(update={"lane_options": {"gemm_plugin": "bfloat16", "gpt_attention_plugin": "float16"}})
    problems = [c for c in preflight(bf16, unit, LLAMA_70B, None).problems if c.name == "plugin_dtype"]
    assert len(problems) == 1 and "gemm_plugin=bfloat16 differs from the model dtype float16" in problems[0].message
    fp8_plugin = spec.model_copy(update={"lane_options": {"gemm_plugin": "fp8"}})
    assert "needs a variant of precision fp8" in failed(preflight(fp8_plugin, unit, LLAMA_70B, None))["plugin_dtype"]
    auto = spec.model_copy(update={"lane_options": {}})
    assert not [c for c in preflight(auto, unit, LLAMA_70B, None).checks if c.name == "plugin_dtype"]
    # A quantized variant computes in the checkpoint's dtype (bfloat16 for Llama 3).
    fp8_unit = make_unit(spec, variant={"precision": "fp8"}, target={**H100, "gpu_count": 2})
    bf = spec.model_copy(update={"lane_options": {"gemm_plugin": "bfloat16"}})
    assert check(preflight(bf, fp8_unit, LLAMA_70B, None), "plugin_dtype").ok


def test_lengths_and_context_window():
    spec = load("llama-3-70b-tp2-a100.yaml")
    unit = expand_units(spec)[0]
    bad = Unit.model_construct(variant=unit.variant, target=unit.target,
                               profile=Profile.model_construct(**{**unit.profile.model_dump(), "max_input_len": 8192,
                                                                  "max_seq_len": 6144}))
    assert "must be < max_seq_len" in failed(preflight(spec, bad, LLAMA_70B, None))["lengths"]
    long = make_unit(spec, profile={"max_input_len": 8192, "max_seq_len": 16384})
    assert "exceeds the model's context of 8192" in failed(preflight(spec, long, LLAMA_70B, None))["context_window"]
    eight = load("llama-3.1-8b-multiarch.yaml")
    ok_long = make_unit(eight, profile={"max_input_len": 65536, "max_seq_len": 131072, "max_batch_size": 1})
    assert check(preflight(eight, ok_long, LLAMA_8B, None), "lengths").ok


def test_chunked_prefill_needs_paged_context_fmha_on_the_engine_lane():
    spec = load("llama-3-70b-tp2-a100.yaml")
    unit = make_unit(spec, profile={"max_num_tokens": 2048})
    assert check(preflight(spec, unit, LLAMA_70B, None), "chunked_prefill").ok
    off = spec.model_copy(update={"lane_options": {**spec.lane_options, "use_paged_context_fmha": False}})
    assert "paged context FMHA" in failed(preflight(off, unit, LLAMA_70B, None))["chunked_prefill"]


def test_parallelism_and_head_divisibility():
    spec = load("llama-3-70b-tp2-a100.yaml")
    too_many = make_unit(spec, variant={"tp": 4})
    assert "tp × pp = 4 GPUs, target a100-80g has gpu_count 2" in failed(
        preflight(spec, too_many, LLAMA_70B, None))["parallelism"]
    three = make_unit(spec, variant={"tp": 3}, target={"gpu_count": 4})
    problems = failed(preflight(spec, three, LLAMA_70B, None))
    assert "64 attention heads are not divisible by tp 3" in problems["heads_divisible"]
    assert "tp in [1, 2, 4, 8, 16]" in problems["heads_divisible"]
    sixteen = make_unit(spec, variant={"tp": 16}, target={"gpu_count": 16})
    heads = check(preflight(spec, sixteen, LLAMA_70B, None), "heads_divisible")
    assert heads.ok and "replicated" in heads.message  # 8 KV heads over tp 16
    spare = make_unit(spec, target={"gpu_count": 4})
    assert "uses 2 of 4" in check(preflight(spec, spare, LLAMA_70B, None), "parallelism").message


# --- the KV budget -------------------------------------------------------------------------------------------

def test_far_beyond_the_kv_pool_is_refused_but_not_the_normal_case():
    spec = load("llama-3.1-8b-multiarch.yaml")
    normal = make_unit(spec, profile={"max_batch_size": 256, "max_input_len": 2048, "max_seq_len": 4096},
                       target=L40S)
    assert preflight(spec, normal, LLAMA_8B, None).ok
    absurd = make_unit(spec, profile={"max_batch_size": 4096, "max_input_len": 30720, "max_seq_len": 32768},
                       target=L40S)
    problems = failed(preflight(spec, absurd, LLAMA_8B, None))
    assert f"(limit {OVERSUBSCRIPTION_LIMIT:.0f}×)" in problems["kv_budget"]
    assert "max_batch_size ≤" in problems["kv_budget"]


def test_not_even_one_sequence_is_refused():
    spec = load("llama-3-70b-tp2-a100.yaml")
    unit = make_unit(spec, profile={"kv_cache_free_gpu_memory_fraction": 0.05})
    assert "less than one sequence of max_seq_len 6144" in failed(preflight(spec, unit, LLAMA_70B, None))["kv_budget"]


def test_fp8_kv_halves_the_bytes_per_token():
    spec = load("llama-3.1-8b-multiarch.yaml")
    auto = preflight(spec, make_unit(spec, target=H100), LLAMA_8B, None).estimates
    fp8 = preflight(spec, make_unit(spec, variant={"precision": "fp8", "kv_cache_dtype": "fp8"}, target=H100),
                    LLAMA_8B, None).estimates
    assert fp8.kv_bytes_per_token_per_gpu * 2 == auto.kv_bytes_per_token_per_gpu == 32 * 2 * 8 * 128 * 2
    assert fp8.weights_bytes_per_gpu < 0.6 * auto.weights_bytes_per_gpu


# --- GPUs, host, disk ----------------------------------------------------------------------------------------

def h200_gpus():
    return parse_nvml_json(json.loads((FIX / "gpu" / "h200" / "nvml.json").read_text()))


def test_detected_gpu_memory_wins_over_target_memory():
    spec = load("llama-3.1-8b-multiarch.yaml")
    unit = make_unit(spec, target=H100)
    report = preflight(spec, unit, LLAMA_8B, h200_gpus(), host_memory=512 * GIB)
    assert check(report, "gpu_match").ok
    assert report.estimates.gpu_memory_source == "detected NVIDIA H200"
    assert report.estimates.gpu_memory_bytes == 143771 * 1024 * 1024


def test_wrong_gpu_is_refused_on_a_worker():
    spec = load("llama-3.1-8b-multiarch.yaml")
    a100s = parse_smi_csv((FIX / "gpu" / "a100" / "query-gpu.csv").read_text())
    report = preflight(spec, make_unit(spec, target=H100), LLAMA_8B, a100s, host_memory=512 * GIB)
    assert "architecture does not match" in failed(report)["gpu_match"]
    assert report.estimates.gpu_memory_source == "target.memory_gib"


def test_host_memory_refuses_only_on_the_build_worker(tmp_path):
    spec = load("llama-3-70b-tp2-a100.yaml")
    [unit] = expand_units(spec)
    a100s = parse_smi_csv((FIX / "gpu" / "a100" / "query-gpu.csv").read_text())
    on_worker = preflight(spec, unit, LLAMA_70B, a100s, host_memory=64 * GIB, workdir=tmp_path)
    assert "load_by_shard" in failed(on_worker)["host_memory"]
    planning = preflight(spec, unit, LLAMA_70B, None, host_memory=64 * GIB, workdir=tmp_path)
    assert check(planning, "host_memory").ok and "informational" in check(planning, "host_memory").message
    roomy = preflight(spec, unit, LLAMA_70B, a100s, host_memory=2048 * GIB, workdir=tmp_path)
    assert check(roomy, "host_memory").ok
    assert roomy.estimates.disk_needed_bytes > roomy.estimates.weights_bytes_total


def test_host_memory_is_cgroup_aware(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       32768000 kB\nMemFree:         1000 kB\n")
    cg = tmp_path / "cg"
    cg.mkdir()
    assert host_memory_bytes(cg, meminfo) == 32768000 * 1024
    (cg / "memory.max").write_text("max\n")
    assert host_memory_bytes(cg, meminfo) == 32768000 * 1024
    (cg / "memory.max").write_text(f"{8 * GIB}\n")
    assert host_memory_bytes(cg, meminfo) == 8 * GIB
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text(f"{4 * GIB}\n")
    assert host_memory_bytes(v1, meminfo) == 4 * GIB
    assert host_memory_bytes(tmp_path / "none", tmp_path / "none") is None
    assert free_disk_bytes(tmp_path / "not" / "yet") > 0


# --- cpu, unknown model, reporting ---------------------------------------------------------------------------

def test_cpu_reference_unit_passes_trivially_with_a_note():
    spec = load_spec(ROOT / "configs" / "tiny-cpu.yaml")
    [unit] = expand_units(spec)
    report = preflight(spec, unit, None, None)
    assert report.ok and report.estimates is None and "cpu target" in report.notes[0]
    assert format_estimates(report).startswith("cpu target")


def test_trtllm_lane_refuses_a_cpu_target():
    spec = load("llama-3.1-8b-multiarch.yaml")
    unit = make_unit(spec, target={"name": "cpu", "arch": "cpu", "sku": [], "gpu_count": 0, "memory_gib": None})
    assert "needs an NVIDIA GPU" in failed(preflight(spec, unit, LLAMA_8B, None))["device"]


def test_unknown_model_config_skips_shape_checks_without_false_refusals():
    spec = load("llama-3-70b-tp2-a100.yaml")
    report = preflight(spec, expand_units(spec)[0], None, None)
    assert report.ok and report.estimates is None
    assert any("model config unknown" in n for n in report.notes)
    no_memory = make_unit(spec, target={"memory_gib": None})
    report = preflight(spec, no_memory, LLAMA_70B, None)
    assert report.ok and any("GPU memory unknown" in n for n in report.notes)
    assert "GPU memory unknown" in format_estimates(report)


def test_all_problems_are_reported_at_once():
    spec = load("llama-3.1-8b-multiarch.yaml")
    unit = make_unit(spec, variant={"precision": "nvfp4", "kv_cache_dtype": "fp8", "tp": 3},
                     target=A100)
    report = preflight(spec, unit, LLAMA_8B, None)
    assert {"precision_arch", "parallelism", "heads_divisible"} <= set(failed(report))
    with pytest.raises(PreflightError, match=r"\(3 problem\(s\)\)") as err:
        report.raise_for_problems()
    assert "precision_arch: nvfp4 needs sm100+" in str(err.value)


def test_format_estimates_for_the_plan_table():
    spec = load("llama-3-70b-tp2-a100.yaml")
    line = format_estimates(preflight(spec, expand_units(spec)[0], LLAMA_70B, None))
    assert line.startswith("70.6B params · weights ") and "GiB/GPU" in line and "KV 160 KiB/token/GPU" in line
    assert "full sequences" in line and line.endswith("· ok")
    bad = make_unit(spec, variant={"tp": 1}, target={"gpu_count": 1})
    assert "REFUSED: weights_fit" in format_estimates(preflight(spec, bad, LLAMA_70B, None))
