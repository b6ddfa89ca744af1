"""Issue 10's audit findings, one test each (written before the fix; each failed on the code it fixes).

Evidence for every expectation: ../shared/facts/trtllm.md §0, and the registry entries' refs."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from enginefoundry.inputs.units import Unit, expand_units
from enginefoundry.lanes import get_lane
from enginefoundry.planning.preflight import preflight
from enginefoundry.spec import BuildSpec, parse_spec

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"


def spec_from(config: str, **changes) -> BuildSpec:
    data = yaml.safe_load((CONFIGS / config).read_text())
    for key, value in changes.items():
        data[key] = value
    return parse_spec(data, base_dir=CONFIGS)


def engine_spec(version: str = "1.2.1", variants=None, lane_options=None, image=None,
                targets=None, profiles=None) -> BuildSpec:
    changes = {"toolchain": {"trtllm_version": version, **({"image": image} if image else {})},
               "variants": variants or [{"precision": "fp16", "tp": 2}],
               "lane_options": lane_options or {"gemm_plugin": "float16", "gpt_attention_plugin": "float16"}}
    if targets:
        changes["targets"] = targets
    if profiles:
        changes["profiles"] = profiles
    return spec_from("llama-3-70b-tp2-a100.yaml", **changes)


def trtllm_spec(version: str = "1.2.1", variants=None, targets=None) -> BuildSpec:
    changes = {"toolchain": {"trtllm_version": version, "image": f"nvcr.io/nvidia/tensorrt-llm/release:{version}"}}
    if variants:
        changes["variants"] = variants
    if targets:
        changes["targets"] = targets
    return spec_from("llama-3.1-8b-multiarch.yaml", **changes)


def argvs(spec: BuildSpec, unit: Unit) -> list[list[str]]:
    return [c.argv for c in get_lane(spec.lane).describe(spec, unit)]


def flags(argv: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for i, tok in enumerate(argv):
        if tok.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            out[tok[2:]] = None if nxt is None or nxt.startswith("--") else nxt
    return out


H100 = {"name": "h100", "arch": "sm90", "sku": ["H100"], "gpu_count": 8, "memory_gib": 80}
B200 = {"name": "b200", "arch": "sm100", "sku": ["B200"], "gpu_count": 8, "memory_gib": 180}
RTX = {"name": "rtx", "arch": "sm120", "sku": [], "gpu_count": 8, "memory_gib": 96}
A100 = {"name": "a100", "arch": "sm80", "sku": ["A100"], "gpu_count": 8, "memory_gib": 80}


# --- engine lane: quantization goes through examples/quantization/quantize.py ----------------------------------

@pytest.mark.parametrize(("precision", "kv", "qformat"), [
    ("fp8", "fp8", "fp8"), ("nvfp4", "auto", "nvfp4"), ("int4_awq", "auto", "int4_awq"),
    ("bf16", "fp8", "full_prec"),
])
def test_engine_quantization_runs_quantize_py_then_trtllm_build(precision, kv, qformat):
    target = B200 if precision == "nvfp4" else H100
    spec = engine_spec(variants=[{"precision": precision, "tp": 2, "pp": 2, "kv_cache_dtype": kv,
                                  "calibration": {"samples": 256}}], targets=[target],
                       lane_options={"gemm_plugin": "auto"})
    [unit] = expand_units(spec)
    first, second = argvs(spec, unit)[:2]
    assert first[1].endswith("quantization/quantize.py")
    f = flags(first)
    assert f["qformat"] == qformat and f["calib_size"] == "256"
    assert f["tp_size"] == "2" and f["pp_size"] == "2"
    assert f.get("kv_cache_dtype") == ("fp8" if kv == "fp8" else None)
    assert "use_fp8" not in f and "use_nvfp4" not in f and "weight_only_precision" not in f
    assert second[0] == "trtllm-build"


def test_engine_weight_only_and_plain_stay_on_convert_checkpoint():
    spec = engine_spec(variants=[{"precision": "int8_wo", "tp": 2}], lane_options={"gemm_plugin": "auto"})
    [unit] = expand_units(spec)
    first = argvs(spec, unit)[0]
    assert first[1].endswith("convert_checkpoint.py")
    f = flags(first)
    assert f["weight_only_precision"] == "int8" and "calib_size" not in f


# --- trtllm-serve --backend: trt in 1.0.x, tensorrt after PR #7829 ---------------------------------------------

@pytest.mark.parametrize(("version", "value"), [("1.0.0", "trt"), ("1.1.0", "tensorrt"), ("1.2.1", "tensorrt")])
def test_engine_serve_backend_value_follows_the_release(version, value):
    spec = engine_spec(version)
    [unit] = expand_units(spec)
    serve = argvs(spec, unit)[-1]
    assert serve[0] == "trtllm-serve" and flags(serve)["backend"] == value


# --- TLLM_AUTOTUNER_CACHE_PATH: not in 1.0.x; both file names are looked for ------------------------------------

def test_autotuner_env_only_from_the_release_that_has_it():
    for version, expected in (("1.0.0", False), ("1.1.0", True), ("1.2.1", True)):
        spec = trtllm_spec(version)
        unit = expand_units(spec)[0]
        envs = [c.env for c in get_lane("trtllm").describe(spec, unit)]
        assert any("TLLM_AUTOTUNER_CACHE_PATH" in e for e in envs) is expected, version


def test_autotuner_cache_is_found_under_both_names(tmp_path):
    from enginefoundry.lanes.trtllm import AUTOTUNER_CACHE, autotuner_cache_files

    assert autotuner_cache_files(tmp_path) == []
    (tmp_path / "autotuner.rank0.json").write_text("{}")
    (tmp_path / "autotuner.rank1.json").write_text("{}")
    assert [p.name for p in autotuner_cache_files(tmp_path)] == ["autotuner.rank0.json", "autotuner.rank1.json"]
    (tmp_path / AUTOTUNER_CACHE).write_text("{}")
    assert AUTOTUNER_CACHE in [p.name for p in autotuner_cache_files(tmp_path)]


# --- ModelOpt flags gated on the ModelOpt version -----------------------------------------------------------------

def test_hf_ptq_flags_follow_the_modelopt_version():
    from enginefoundry.lanes.trtllm import hf_ptq_script, quantize_command

    spec = trtllm_spec()
    variant = next(v for v in spec.variants if v.precision.value == "fp8")
    old = flags(quantize_command(spec, variant, "/hf", "/out", "python3", modelopt="0.37.0").argv)
    new = flags(quantize_command(spec, variant, "/hf", "/out", "python3", modelopt="0.39.0").argv)
    assert "calib_seq" not in old and new["calib_seq"] == "2048"
    assert hf_ptq_script("/mo", "0.45.0").as_posix() == "/mo/examples/llm_ptq/hf_ptq.py"
    assert hf_ptq_script("/mo", "0.46.0").as_posix() == "/mo/examples/hf_ptq/hf_ptq.py"
    newest = flags(quantize_command(spec, variant, "/hf", "/out", "python3", modelopt="0.47.0").argv)
    assert "export_fmt" not in newest


def test_int8_wo_is_refused_on_the_pytorch_lane():
    spec = trtllm_spec(variants=[{"precision": "int8_wo"}])
    problems = dict(get_lane("trtllm").validate_options(spec))
    assert "W8A16" in problems["variants.0.precision"]


# --- refusals that were wrong ----------------------------------------------------------------------------------

def _refused(spec: BuildSpec, name: str) -> bool:
    return any(not c.ok and c.name == name for u in expand_units(spec) for c in preflight(spec, u, None, None).checks)


def test_weight_only_is_refused_only_for_sm100_to_sm119():
    for target, refused in ((B200, True), (RTX, False), (H100, False)):
        spec = engine_spec(variants=[{"precision": "int4_wo", "tp": 2}], targets=[target],
                           lane_options={"gemm_plugin": "auto"})
        assert _refused(spec, "precision_arch") is refused, target["arch"]


def test_fp8_kv_on_sm80_is_allowed_on_the_pytorch_lane_only():
    trt = trtllm_spec(variants=[{"precision": "bf16", "kv_cache_dtype": "fp8"}], targets=[A100])
    assert not _refused(trt, "kv_dtype_arch")
    eng = engine_spec(variants=[{"precision": "fp16", "tp": 2, "kv_cache_dtype": "fp8"}], targets=[A100])
    assert _refused(eng, "kv_dtype_arch")


def test_load_by_shard_with_int8_kv_is_refused():
    spec = engine_spec(variants=[{"precision": "fp16", "tp": 2, "kv_cache_dtype": "int8"}],
                       lane_options={"gemm_plugin": "float16", "load_by_shard": True})
    problems = dict(get_lane("trtllm-engine").validate_options(spec))
    assert "load by shard" in problems["variants.0.kv_cache_dtype"]  # the variant's units only (issue 37)
    assert "lane_options.load_by_shard" in problems["variants.0.kv_cache_dtype"]


def test_int8_kv_in_the_engine_lane_claims_no_chunked_context():
    long = {"name": "long", "max_batch_size": 8, "max_input_len": 16384, "max_seq_len": 17000,
            "max_num_tokens": 8192}
    spec = engine_spec(variants=[{"precision": "fp16", "tp": 2, "kv_cache_dtype": "int8"}], profiles=[long])
    assert _refused(spec, "chunked_prefill")
    [unit] = expand_units(spec)
    fills = [c for c in get_lane("trtllm-engine").describe(spec, unit) if c.description ==
             "fill Triton template tensorrt_llm"]
    assert "enable_chunked_context:false" in fills[0].argv[-1]


# --- the toolchain pin is enforced -----------------------------------------------------------------------------

def test_a_known_image_with_another_release_is_refused_at_plan_time():
    spec = engine_spec("1.2.1", image="nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3")
    problems = dict(get_lane("trtllm-engine").validate_options(spec))
    assert "1.1.0" in problems["toolchain.image"] and "compatibility matrix" in problems["toolchain.image"]
    shipped = spec_from("llama-3-70b-tp2-a100.yaml")
    assert "toolchain.image" not in dict(get_lane("trtllm-engine").validate_options(shipped))


def test_the_pinned_release_must_be_the_installed_one():
    from enginefoundry.errors import ToolError
    from enginefoundry.lanes.trtllm_base import require_pinned_release

    require_pinned_release("1.2.1", "1.2.1")
    require_pinned_release(None, "1.2.1")
    with pytest.raises(ToolError, match=r"pins TensorRT-LLM 1\.2\.1 .* has 1\.1\.0"):
        require_pinned_release("1.2.1", "1.1.0")


# --- warm-up script under a main guard (MPI workers re-import it) -------------------------------------------------

def test_warmup_builds_the_llm_under_a_main_guard():
    from enginefoundry.lanes.trtllm import WARMUP_SCRIPT

    tree = ast.parse(WARMUP_SCRIPT)
    guard = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
    assert guard, "no if __name__ == '__main__' guard"
    top_calls = [ast.unparse(n) for n in tree.body if not isinstance(n, (ast.If, ast.FunctionDef))]
    assert not any("LLM(" in c for c in top_calls)
    assert "LLM(" in ast.unparse(guard[0]) or any("LLM(" in ast.unparse(f) for f in tree.body
                                                  if isinstance(f, ast.FunctionDef))


# --- plan renders commands for the worker's interpreter, not this machine's ------------------------------------

def test_plan_commands_use_the_worker_interpreter_name():
    import sys

    for spec in (engine_spec(), trtllm_spec()):
        for unit in expand_units(spec):
            for cmd in get_lane(spec.lane).describe(spec, unit):
                assert sys.executable not in cmd.argv, cmd.argv
                if cmd.argv[0].endswith("python") or cmd.argv[0].startswith("python"):
                    assert cmd.argv[0] == "python3"


def test_a_rank_file_cache_is_served_under_the_names_it_was_saved_with(tmp_path):
    from enginefoundry.gpu.detect import GPUInfo
    from enginefoundry.lanes.trtllm import AUTOTUNER_CACHE, usable_autotuner_cache

    for rank in (0, 1):
        (tmp_path / f"autotuner.rank{rank}.json").write_text(f'{{"rank": {rank}}}')
    info = {"autotuner_cache": {"file": AUTOTUNER_CACHE, "files": ["autotuner.rank0.json", "autotuner.rank1.json"],
                                "tensorrt_llm": "1.1.0", "gpu_name": "NVIDIA H200", "compute_capability": "9.0"}}
    h200 = [GPUInfo(index=0, name="NVIDIA H200", compute_capability="9.0", memory_total_mib=143771)]
    found = usable_autotuner_cache(tmp_path, info, h200, "1.1.0")
    assert found is not None
    name, files = found
    assert name == AUTOTUNER_CACHE  # TLLM_AUTOTUNER_CACHE_PATH, as at warm-up; the rank files copied beside it
    assert [f.name for f in files] == ["autotuner.rank0.json", "autotuner.rank1.json"]
