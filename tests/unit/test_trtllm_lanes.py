"""The TensorRT-LLM lanes: generated commands, runtime YAML and Triton templates, field by field against
facts/trtllm.md, for the specs in configs/. TensorRT-LLM is not installable here, so the lanes are checked by
construction; the `gpu` tests run them for real where TensorRT-LLM and a GPU exist."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml

from enginefoundry.errors import InputError, ToolError
from enginefoundry.gpu.detect import GPUInfo
from enginefoundry.inputs.units import Unit, expand_units
from enginefoundry.lanes import get_lane, triton
from enginefoundry.lanes.trtllm import (
    AUTOTUNER_CACHE,
    BUNDLE_INFO,
    RUNTIME_CONFIG,
    WARMUP_MARKER,
    WARMUP_SCRIPT,
    TrtllmLane,
    parse_marker_json,
    quantize_command,
    runtime_config,
    serve_argv,
    usable_autotuner_cache,
)
from enginefoundry.lanes.trtllm_engine import (
    TrtllmEngineLane,
    build_argv,
    build_workers,
    check_checkpoint_dir,
    check_engine_dir,
    convert_argv,
    convert_script,
    engine_serve_argv,
    model_family,
)
from enginefoundry.lanes.trtllm_flags import (
    CONVERT,
    HF_PTQ,
    REMOVED,
    TRITON_TEMPLATE_KEYS,
    TRTLLM_BUILD,
    emitted_names,
    flag,
)
from enginefoundry.lanes.trtllm_options import resolve_options
from enginefoundry.spec import BuildSpec, Variant, load_spec
from tests.support.paths import CONFIGS, REPO, TINY_MODEL
from tests.support.trtllm_facts import FACTS_BUILD_FLAGS, FACTS_CONVERT_FLAGS, FACTS_SERVE_FLAGS

ROOT = REPO
MODEL_CONFIGS = CONFIGS / "model-configs"
TINY = TINY_MODEL

# facts §1 ("runtime config YAML … max_batch_size, max_num_tokens, kv_cache_config, cuda_graph_config"), §6
# (LLM(model=, tensor_parallel_size=, pipeline_parallel_size=, max_batch_size=, max_num_tokens=, max_seq_len=,
# kv_cache_config=)), §7 (--enable_chunked_prefill), KvCacheConfig fields (§6). `dtype` and the CudaGraphConfig
# fields are not in the facts; they are checked against tensorrt_llm/llmapi/llm_args.py.
DOCUMENTED_LLM_API = {
    "tensor_parallel_size", "pipeline_parallel_size", "max_batch_size", "max_num_tokens", "max_seq_len",
    "kv_cache_config", "cuda_graph_config", "enable_chunked_prefill", "dtype",
    "kv_cache_config.free_gpu_memory_fraction", "kv_cache_config.enable_block_reuse",
    "kv_cache_config.tokens_per_block", "kv_cache_config.dtype", "kv_cache_config.max_tokens",
    "cuda_graph_config.batch_sizes", "cuda_graph_config.max_batch_size", "cuda_graph_config.enable_padding",
}


def spec_and_units(name: str) -> tuple[BuildSpec, list[Unit]]:
    spec = load_spec(CONFIGS / name)
    return spec, expand_units(spec)


def with_options(spec: BuildSpec, **options) -> BuildSpec:
    return spec.model_copy(update={"lane_options": {**spec.lane_options, **options}})


def unit_with(unit: Unit, **variant) -> Unit:
    return Unit(variant=Variant(**{**unit.variant.model_dump(), **variant}), profile=unit.profile,
                target=unit.target)


def flags_of(argv: list[str]) -> dict[str, str | None]:
    """--flag value pairs (a flag followed by another flag has value None)."""
    out: dict[str, str | None] = {}
    for i, tok in enumerate(argv):
        if tok.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            out[tok[2:]] = None if nxt is None or nxt.startswith("--") else nxt
    return out


# --- trtllm-engine: convert -----------------------------------------------------------------------------------

def test_convert_for_the_70b_tp2_config(tmp_path):
    spec, [unit] = spec_and_units("llama-3-70b-tp2-a100.yaml")
    script = convert_script("/opt/trtllm/examples", "llama")
    assert script.as_posix().endswith("examples/models/core/llama/convert_checkpoint.py")
    argv = convert_argv(spec, unit.variant, "python3", script, tmp_path / "hf", tmp_path / "ckpt", "float16")
    f = flags_of(argv)
    assert argv[:2] == ["python3", str(script)]
    assert set(f) <= FACTS_CONVERT_FLAGS
    assert f == {"model_dir": str(tmp_path / "hf"), "output_dir": str(tmp_path / "ckpt"), "dtype": "float16",
                 "tp_size": "2", "pp_size": "1", "workers": "1"}


@pytest.mark.parametrize(("precision", "kv", "expected"), [
    ("int8_wo", "auto", {"use_weight_only": None, "weight_only_precision": "int8"}),
    ("int4_wo", "auto", {"use_weight_only": None, "weight_only_precision": "int4"}),
    # fp8 / nvfp4 / int4_awq / fp8 KV go through quantize.py (tests/unit/test_lane_findings.py).
    ("fp16", "int8", {"int8_kv_cache": None}),
])
def test_convert_quantization_flags(precision, kv, expected):
    spec, _ = spec_and_units("llama-3-70b-tp2-a100.yaml")
    v = Variant(precision=precision, tp=2, kv_cache_dtype=kv)
    f = flags_of(convert_argv(spec, v, "python3", "convert_checkpoint.py", "/hf", "/ckpt", "bfloat16"))
    assert set(f) <= FACTS_CONVERT_FLAGS
    base = {"model_dir", "output_dir", "dtype", "tp_size", "pp_size", "workers"}
    assert {k: v for k, v in f.items() if k not in base} == expected


def test_convert_options_and_custom_calibration():
    spec, _ = spec_and_units("llama-3-70b-tp2-a100.yaml")
    spec = with_options(spec, convert_workers=4, load_by_shard=True)
    v = Variant(precision="fp16", tp=2, kv_cache_dtype="int8",
                calibration={"dataset": "/data/calib.jsonl", "samples": 1024, "max_seq_length": 2048})
    f = flags_of(convert_argv(spec, v, "python3", "c.py", "/hf", "/ckpt", "bfloat16"))
    assert f["workers"] == "2"  # threads over ranks: never more than tp × pp
    assert "load_by_shard" in f
    assert (f["calib_dataset"], f["calib_size"], f["calib_max_seq_length"]) == ("/data/calib.jsonl", "1024", "2048")


def test_model_family_from_config_json():
    cfg = json.loads((MODEL_CONFIGS / "llama-3-70b-instruct.json").read_text())
    assert model_family(cfg) == "llama"
    assert model_family({"model_type": "llama"}) == "llama"
    with pytest.raises(InputError, match=r"Qwen2ForCausalLM.*use lane trtllm"):
        model_family({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"})


def test_converted_checkpoint_layout_is_checked(tmp_path):
    v = Variant(precision="fp16", tp=2)
    with pytest.raises(ToolError, match=r"no config\.json"):
        check_checkpoint_dir(tmp_path, v)
    (tmp_path / "config.json").write_text(json.dumps({"mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1}}))
    with pytest.raises(ToolError, match="converted for tp 1 × pp 1"):
        check_checkpoint_dir(tmp_path, v)
    (tmp_path / "config.json").write_text(json.dumps({"mapping": {"world_size": 2, "tp_size": 2, "pp_size": 1}}))
    (tmp_path / "rank0.safetensors").write_bytes(b"x")
    with pytest.raises(ToolError, match=r"rank1\.safetensors"):
        check_checkpoint_dir(tmp_path, v)
    (tmp_path / "rank1.safetensors").write_bytes(b"x")
    assert check_checkpoint_dir(tmp_path, v)["mapping"]["tp_size"] == 2


# --- trtllm-engine: build ------------------------------------------------------------------------------------

def test_build_for_the_70b_tp2_config(tmp_path):
    spec, [unit] = spec_and_units("llama-3-70b-tp2-a100.yaml")
    cache = tmp_path / "work" / "timing.cache"
    argv = build_argv(spec, unit, tmp_path / "ckpt", tmp_path / "bundle" / "engine", cache)
    f = flags_of(argv)
    assert argv[0] == "trtllm-build"
    assert set(f) <= FACTS_BUILD_FLAGS
    assert not set(f) & set(REMOVED)  # never --tp_size, --max_output_len, --paged_kv_cache, …
    assert all(flag(TRTLLM_BUILD, k).exists_in("1.2.1") for k in f)
    assert f == {
        "checkpoint_dir": str(tmp_path / "ckpt"), "output_dir": str(tmp_path / "bundle" / "engine"),
        "gemm_plugin": "float16", "gpt_attention_plugin": "float16", "kv_cache_type": "paged",
        "remove_input_padding": "enable", "use_paged_context_fmha": "enable", "max_batch_size": "128",
        "max_input_len": "4096", "max_seq_len": "6144", "max_num_tokens": "8192", "max_beam_width": "1",
        "workers": "2", "output_timing_cache": str(cache),
    }
    assert Path(f["output_timing_cache"]).is_absolute()


def test_build_workers_are_capped():
    spec, [unit] = spec_and_units("llama-3-70b-tp2-a100.yaml")
    assert build_workers(unit, None) == 2
    assert build_workers(unit, 1) == 1
    four = unit_with(unit, tp=4)
    assert build_workers(four, None) == 2  # target gpu_count 2
    big = Unit(variant=four.variant, profile=unit.profile,
               target=unit.target.model_copy(update={"gpu_count": 8}))
    assert build_workers(big, None) == 4  # one per rank
    assert flags_of(build_argv(with_options(spec, build_workers=1), unit, "/c", "/e", "/t"))["workers"] == "1"


def test_build_optional_flags_and_timing_cache_reuse():
    spec, [unit] = spec_and_units("llama-3-70b-tp2-a100.yaml")
    spec = with_options(spec, use_fused_mlp=False, multiple_profiles=True, tokens_per_block=64,
                        gemm_plugin="auto", gpt_attention_plugin="auto")
    f = flags_of(build_argv(spec, unit, "/c", "/e", "/w/timing.cache", "/w/timing.cache"))
    assert (f["use_fused_mlp"], f["multiple_profiles"], f["tokens_per_block"]) == ("disable", "enable", "64")
    assert f["input_timing_cache"] == "/w/timing.cache"
    assert (f["gemm_plugin"], f["gpt_attention_plugin"]) == ("auto", "auto")


def test_engine_dir_layout_is_checked(tmp_path):
    with pytest.raises(ToolError, match=r"\['config.json', 'rank0.engine', 'rank1.engine'\]"):
        check_engine_dir(tmp_path, 2)
    (tmp_path / "config.json").write_text(json.dumps({"version": "1.2.1", "pretrained_config": {},
                                                      "build_config": {}}))
    for r in (0, 1):
        (tmp_path / f"rank{r}.engine").write_bytes(b"plan")
    assert check_engine_dir(tmp_path, 2)["version"] == "1.2.1"


def test_engine_serve_command(tmp_path):
    params = {"tp": 2, "pp": 1, "max_batch_size": 128, "max_num_tokens": 8192,
              "kv_cache_free_gpu_memory_fraction": 0.8}
    argv = engine_serve_argv(tmp_path / "engine", tmp_path / "tokenizer", params, "0.0.0.0", 8123)
    f = flags_of(argv)
    assert argv[:2] == ["trtllm-serve", str(tmp_path / "engine")]
    assert set(f) <= FACTS_SERVE_FLAGS
    assert f["backend"] == "tensorrt" and f["tokenizer"] == str(tmp_path / "tokenizer")
    assert (f["tp_size"], f["pp_size"], f["host"], f["port"]) == ("2", "1", "0.0.0.0", "8123")
    assert f["kv_cache_free_gpu_memory_fraction"] == "0.8"


def test_engine_lane_serve_command_from_a_bundle(tmp_path):
    bundle = tmp_path / "bundle"
    (bundle / "engine").mkdir(parents=True)
    (bundle / "tokenizer").mkdir()
    params = {"tp": 2, "pp": 1, "max_batch_size": 128, "max_num_tokens": 8192,
              "kv_cache_free_gpu_memory_fraction": 0.8}
    (bundle / BUNDLE_INFO).write_text(json.dumps({"engine_dir": "engine", "tokenizer_dir": "tokenizer",
                                                  "params": params}))
    serve = TrtllmEngineLane().serve_command(bundle, "127.0.0.1", 9000)
    assert serve.command.argv[1] == str((bundle / "engine").resolve())
    assert serve.tokenizer_dir == str((bundle / "tokenizer").resolve()) and serve.health_path == "/health"
    with pytest.raises(InputError, match="not a bundle"):
        TrtllmEngineLane().serve_command(tmp_path, "127.0.0.1", 9000)


# --- Triton --------------------------------------------------------------------------------------------------

def triton_params(**kw) -> triton.TritonParams:
    spec, [unit] = spec_and_units("llama-3-70b-tp2-a100.yaml")
    opts = resolve_options("trtllm-engine", {**spec.lane_options, **kw})
    return triton.TritonParams.for_unit(unit, opts, engine_dir="/models/u1/engine",
                                        tokenizer_dir="/models/u1/tokenizer", model_dtype="float16")


def test_template_keys_are_the_documented_ones():
    subs = triton.substitutions(triton_params())
    assert list(subs) == list(triton.MODELS)
    for model, keys in subs.items():
        assert set(keys) <= TRITON_TEMPLATE_KEYS[model], model
    trt = subs["tensorrt_llm"]
    assert trt["triton_backend"] == "tensorrtllm"
    assert trt["batching_strategy"] == "inflight_fused_batching"
    assert trt["engine_dir"] == "/models/u1/engine"
    assert (trt["triton_max_batch_size"], trt["decoupled_mode"], trt["max_queue_delay_microseconds"]) == (
        "128", "false", "0")
    assert trt["kv_cache_free_gpu_mem_fraction"] == "0.8"
    assert (trt["encoder_input_features_data_type"], trt["logits_datatype"]) == ("TYPE_FP16", "TYPE_FP32")
    assert trt["enable_chunked_context"] == "true"
    assert subs["preprocessing"] == {"tokenizer_dir": "/models/u1/tokenizer", "triton_max_batch_size": "128",
                                     "preprocessing_instance_count": "1", "max_queue_delay_microseconds": "0"}
    assert subs["postprocessing"] == {"tokenizer_dir": "/models/u1/tokenizer", "triton_max_batch_size": "128",
                                      "postprocessing_instance_count": "1"}
    assert subs["ensemble"] == {"triton_max_batch_size": "128", "logits_datatype": "TYPE_FP32"}
    assert subs["tensorrt_llm_bls"] == {"triton_max_batch_size": "128", "decoupled_mode": "false",
                                        "bls_instance_count": "1", "logits_datatype": "TYPE_FP32",
                                        "prompt_embedding_table_data_type": "TYPE_FP16"}


def test_template_options():
    subs = triton.substitutions(triton_params(
        triton_decoupled_mode=True, triton_batch_scheduler_policy="max_utilization",
        triton_enable_kv_cache_reuse=True, triton_instance_count=4, triton_max_queue_delay_microseconds=100))
    trt = subs["tensorrt_llm"]
    assert (trt["decoupled_mode"], trt["batch_scheduler_policy"], trt["enable_kv_cache_reuse"]) == (
        "true", "max_utilization", "true")
    bls = subs["tensorrt_llm_bls"]
    assert (bls["decoupled_mode"], bls["bls_instance_count"]) == ("true", "4")
    assert trt["max_queue_delay_microseconds"] == "100"


def test_fill_commands_shape():
    cmds = triton.fill_commands(Path("/app"), Path("/b/triton_model_repo"), triton_params(), python="python3")
    assert [c.argv[3] for c in cmds] == [f"/b/triton_model_repo/{m}/config.pbtxt" for m in triton.MODELS]
    for c in cmds:
        assert c.argv[:3] == ["python3", "/app/tools/fill_template.py", "--in_place"]
        assert len(c.argv) == 5


def test_unfilled_structural_placeholders_are_caught(tmp_path):
    repo = tmp_path / "repo"
    for model in triton.MODELS:
        (repo / model).mkdir(parents=True)
        (repo / model / "config.pbtxt").write_text('backend: "python"\n')
    (repo / "tensorrt_llm" / "config.pbtxt").write_text('backend: "${triton_backend}"\n'
                                                        'parameters: { key: "x" value: { string_value: "${x}" } }\n')
    problems = triton.check_repository(repo)
    assert problems == ["tensorrt_llm/config.pbtxt: ${triton_backend} is unfilled (Triton rejects it, #1803)"]
    shutil.rmtree(repo / "ensemble")
    assert "ensemble/config.pbtxt is missing" in triton.check_repository(repo)


def test_missing_triton_tree_says_where_to_look(tmp_path):
    with pytest.raises(ToolError, match="triton_dir"):
        triton.build_repository(tmp_path, tmp_path / "repo", triton_params(), log_dir=tmp_path)


def test_launch_command():
    cmd = triton.launch_command(Path("/app"), "/models/u1/triton_model_repo", 2)
    assert cmd.argv == ["python3", "/app/scripts/launch_triton_server.py", "--world_size", "2", "--model_repo",
                        "/models/u1/triton_model_repo"]


# --- trtllm (PyTorch backend) --------------------------------------------------------------------------------

def test_runtime_yaml_for_every_unit_of_the_multiarch_config():
    spec, units = spec_and_units("llama-3.1-8b-multiarch.yaml")
    assert len(units) == 10
    for unit in units:
        cfg = runtime_config(spec, unit)
        paths = {k for k in cfg} | {f"{k}.{s}" for k, v in cfg.items() if isinstance(v, dict) for s in v}
        assert paths <= DOCUMENTED_LLM_API, unit.name
        assert yaml.safe_load(yaml.safe_dump(cfg)) == cfg
        p = unit.profile
        assert (cfg["tensor_parallel_size"], cfg["pipeline_parallel_size"]) == (1, 1)
        assert (cfg["max_batch_size"], cfg["max_num_tokens"], cfg["max_seq_len"]) == (
            p.max_batch_size, p.max_num_tokens, p.max_seq_len)
        assert cfg["kv_cache_config"]["free_gpu_memory_fraction"] == 0.8
        assert cfg["cuda_graph_config"] == {"enable_padding": True, "max_batch_size": p.max_batch_size}
        if unit.variant.precision.value == "fp8":
            assert cfg["kv_cache_config"]["dtype"] == "fp8" and "dtype" not in cfg
        else:
            assert cfg["dtype"] == "bfloat16" and "dtype" not in cfg["kv_cache_config"]
        # long: max_input_len 30720 > max_num_tokens 16384 needs chunked prefill
        assert cfg.get("enable_chunked_prefill") is (True if p.name == "long" else None)


def test_runtime_yaml_options():
    spec, units = spec_and_units("llama-3.1-8b-multiarch.yaml")
    unit = units[0]
    cfg = runtime_config(with_options(spec, cuda_graphs=False, enable_block_reuse=False, tokens_per_block=64,
                                      enable_chunked_prefill=True), unit)
    assert cfg["cuda_graph_config"] is None and cfg["enable_chunked_prefill"] is True
    assert cfg["kv_cache_config"] == {"free_gpu_memory_fraction": 0.8, "enable_block_reuse": False,
                                      "tokens_per_block": 64}
    capped = runtime_config(with_options(spec, cuda_graph_max_batch_size=64, cuda_graph_padding=False), unit)
    assert capped["cuda_graph_config"] == {"enable_padding": False, "max_batch_size": 64}
    tp2 = runtime_config(spec, unit_with(unit, tp=2, pp=2))
    assert (tp2["tensor_parallel_size"], tp2["pipeline_parallel_size"]) == (2, 2)


def test_quantize_command_for_the_fp8_variant(monkeypatch):
    monkeypatch.delenv("EF_MODELOPT_DIR", raising=False)
    spec, units = spec_and_units("llama-3.1-8b-multiarch.yaml")
    fp8 = next(u for u in units if u.variant.precision.value == "fp8")
    cmd = quantize_command(with_options(spec, modelopt_dir="/opt/Model-Optimizer"), fp8.variant,
                           "/ckpt/hf", "/scratch/checkpoint", python="python3", modelopt="0.39.0")
    f = flags_of(cmd.argv)
    assert cmd.argv[:2] == ["python3", "/opt/Model-Optimizer/examples/llm_ptq/hf_ptq.py"]
    assert set(f) <= emitted_names(HF_PTQ)
    assert f == {"pyt_ckpt_path": "/ckpt/hf", "qformat": "fp8", "kv_cache_qformat": "fp8",
                 "dataset": "cnn_dailymail", "calib_size": "1024", "calib_seq": "2048",
                 "export_path": "/scratch/checkpoint"}  # no --export_fmt from ModelOpt 0.37 (deprecated, forced to hf)
    nvfp4 = quantize_command(spec, Variant(precision="nvfp4"), "/hf", "/out", python="python3")
    assert flags_of(nvfp4.argv)["kv_cache_qformat"] == "none" and "$EF_MODELOPT_DIR" in nvfp4.argv[1]


def test_plain_precisions_pass_the_checkpoint_through(tmp_path):
    spec, units = spec_and_units("llama-3.1-8b-multiarch.yaml")
    res = TrtllmLane().convert(spec, units[0].variant, tmp_path / "hf", tmp_path / "work")
    assert res.checkpoint_dir == str(tmp_path / "hf") and res.params["passthrough"] is True
    assert not (tmp_path / "work").exists()


def test_serve_command_for_the_pytorch_lane(tmp_path):
    ckpt = tmp_path / "hf"
    ckpt.mkdir()
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / RUNTIME_CONFIG).write_text("max_batch_size: 8\n")
    (bundle / BUNDLE_INFO).write_text(json.dumps({"checkpoint": {"path": str(ckpt)}, "runtime_config": RUNTIME_CONFIG,
                                                  "autotuner_cache": None}))
    serve = TrtllmLane().serve_command(bundle, "127.0.0.1", 8001)
    assert serve.command.argv == serve_argv(ckpt, bundle.resolve() / RUNTIME_CONFIG, "127.0.0.1", 8001)
    assert serve.command.argv == ["trtllm-serve", str(ckpt), "--extra_llm_api_options",
                                  str(bundle.resolve() / RUNTIME_CONFIG), "--host", "127.0.0.1", "--port", "8001"]
    assert set(flags_of(serve.command.argv)) <= FACTS_SERVE_FLAGS
    assert (serve.health_path, serve.model_name, serve.tokenizer_dir) == ("/health", str(ckpt), str(ckpt))
    assert serve.command.env == {}
    # A checkpoint placed next to the bundle (by the fetch step) wins over the recorded path.
    (bundle / "checkpoint").mkdir()
    assert TrtllmLane().serve_command(bundle, "h", 1).model_name == str((bundle / "checkpoint").resolve())
    shutil.rmtree(ckpt)
    shutil.rmtree(bundle / "checkpoint")
    with pytest.raises(ToolError, match="not on this host"):
        TrtllmLane().serve_command(bundle, "h", 1)


def test_autotuner_cache_only_for_the_same_version_and_gpu_model(tmp_path):
    (tmp_path / AUTOTUNER_CACHE).write_bytes(b"tactics")
    info = {"autotuner_cache": {"file": AUTOTUNER_CACHE, "tensorrt_llm": "1.2.1", "gpu_name": "NVIDIA H200",
                                "compute_capability": "9.0"}}
    h200 = [GPUInfo(index=0, name="NVIDIA H200", compute_capability="9.0", memory_total_mib=143771)]
    h100 = [GPUInfo(index=0, name="NVIDIA H100 80GB HBM3", compute_capability="9.0", memory_total_mib=81559)]
    assert usable_autotuner_cache(tmp_path, info, h200, "1.2.1") == (AUTOTUNER_CACHE, [tmp_path / AUTOTUNER_CACHE])
    assert not [p for p in tmp_path.iterdir() if p.name != AUTOTUNER_CACHE]  # nothing copied by the check
    assert usable_autotuner_cache(tmp_path, info, h100, "1.2.1") is None  # same SM, other model
    assert usable_autotuner_cache(tmp_path, info, h200, "1.3.0rc24") is None  # image bump (sparkrun#256)
    assert usable_autotuner_cache(tmp_path, {"autotuner_cache": None}, h200, "1.2.1") is None


def test_the_served_cache_is_a_copy_in_the_servers_folder_never_the_bundles_file(tmp_path, monkeypatch):
    """TensorRT-LLM saves back into the cache it loads: the serve command names a copy in the server's working
    folder (made by whoever starts it), not the published file, and no longer leaves a scratch folder behind
    in $TMPDIR per call (it made one with mkdtemp, never removed)."""
    from enginefoundry.lanes import trtllm
    from enginefoundry.lanes.base import SERVE_CWD_VAR

    ckpt = tmp_path / "hf"
    ckpt.mkdir()
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / RUNTIME_CONFIG).write_text("max_batch_size: 8\n")
    (bundle / AUTOTUNER_CACHE).write_bytes(b"tactics")
    cache = {"file": AUTOTUNER_CACHE, "tensorrt_llm": "1.2.1", "gpu_name": "NVIDIA H200", "compute_capability": "9.0"}
    (bundle / BUNDLE_INFO).write_text(json.dumps({"checkpoint": {"path": str(ckpt)}, "runtime_config": RUNTIME_CONFIG,
                                                  "autotuner_cache": cache}))
    monkeypatch.setattr(trtllm, "installed_version", lambda name: "1.2.1")
    monkeypatch.setattr(trtllm, "detect_gpus", lambda: [GPUInfo(index=0, name="NVIDIA H200", compute_capability="9.0",
                                                                memory_total_mib=143771)])
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    serve = TrtllmLane().serve_command(bundle, "127.0.0.1", 8001)
    assert serve.command.env == {"TLLM_AUTOTUNER_CACHE_PATH": f"${{{SERVE_CWD_VAR}}}/{AUTOTUNER_CACHE}"}
    assert serve.copies == {AUTOTUNER_CACHE: str(bundle / AUTOTUNER_CACHE)}
    assert not list(tmp.iterdir())

    # A bundle.json naming a file outside the bundle is refused, not copied.
    for hostile in ("../../etc/passwd", "/etc/passwd", "..", "a/b"):
        (bundle / BUNDLE_INFO).write_text(json.dumps({"checkpoint": {"path": str(ckpt)},
                                                      "runtime_config": RUNTIME_CONFIG,
                                                      "autotuner_cache": {**cache, "files": [hostile]}}))
        with pytest.raises(ToolError, match=r"autotuner_cache\.files .* is not a safe name"):
            TrtllmLane().serve_command(bundle, "127.0.0.1", 8001)


def test_warmup_script_and_marker():
    compile(WARMUP_SCRIPT, "warmup.py", "exec")
    assert "update_llm_args_with_extra_dict" in WARMUP_SCRIPT and "llm.shutdown()" in WARMUP_SCRIPT
    text = "[TensorRT-LLM] TensorRT LLM version: 1.2.1\n" + WARMUP_MARKER + '{"load_s": 3.5}\n'
    assert parse_marker_json(text, WARMUP_MARKER, "warm-up") == {"load_s": 3.5}
    with pytest.raises(ToolError, match="no result line"):
        parse_marker_json("banner only", WARMUP_MARKER, "warm-up")


# --- both lanes: what `plan` shows ---------------------------------------------------------------------------

@pytest.mark.parametrize("config", ["llama-3-70b-tp2-a100.yaml", "llama-3.1-8b-multiarch.yaml"])
def test_describe_emits_only_documented_flags(config):
    spec, units = spec_and_units(config)
    lane = get_lane(spec.lane)
    for unit in units:
        cmds = lane.describe(spec, unit)
        assert cmds, unit.name
        for cmd in cmds:
            argv = cmd.argv
            f = set(flags_of(argv))
            if argv[0] == "trtllm-build":
                assert f <= FACTS_BUILD_FLAGS and not f & set(REMOVED)
            elif argv[0] == "trtllm-serve":
                assert f <= FACTS_SERVE_FLAGS
            elif argv[1].endswith("convert_checkpoint.py"):
                assert f <= emitted_names(CONVERT)
            elif argv[1].endswith("hf_ptq.py"):
                assert f <= emitted_names(HF_PTQ)
            elif argv[1].endswith("fill_template.py"):
                assert f == {"in_place"}
            else:
                assert argv[1].endswith("warmup.py") and f == set(), argv
    if spec.lane == "trtllm-engine":
        kinds = [c.description for c in lane.describe(spec, units[0])]
        assert kinds[0].startswith("convert") and kinds[1] == "build" and kinds[-1] == "serve"
        assert sum(k.startswith("fill Triton template") for k in kinds) == 5


def test_lanes_are_registered():
    assert isinstance(get_lane("trtllm"), TrtllmLane)
    assert isinstance(get_lane("trtllm-engine"), TrtllmEngineLane)
