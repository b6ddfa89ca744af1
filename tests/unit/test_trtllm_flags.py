"""The flag registry: removed flags refused with their release, unknown options listed, release gates."""

from __future__ import annotations

import copy

import pytest

from enginefoundry.errors import SpecError, ToolError
from enginefoundry.inputs.toolchain import (
    PROBE_MARKER,
    parse_probe_output,
    parse_version,
    toolchain_from_probe,
)
from enginefoundry.lanes import get_lane
from enginefoundry.lanes.trtllm_flags import (
    CONVERT,
    EMITTED,
    ENV,
    LLM_API,
    REMOVED,
    SERVE,
    TRTLLM_BUILD,
    arg,
    emitted_names,
    explain_unknown_key,
    flag,
    lane_release_problem,
)
from enginefoundry.lanes.trtllm_options import EngineOptions, TrtllmOptions, resolve_options, validate_lane_options
from enginefoundry.spec import load_spec, parse_spec
from tests.support.paths import REPO
from tests.support.trtllm_facts import FACTS_BUILD_FLAGS, FACTS_CONVERT_FLAGS, FACTS_REMOVED, FACTS_SERVE_FLAGS

CONFIGS = REPO / "configs"


@pytest.mark.parametrize("name", sorted(FACTS_REMOVED))
@pytest.mark.parametrize("lane", ["trtllm-engine", "trtllm"])
def test_every_removed_flag_is_refused_with_release_and_replacement(lane, name):
    release, replacement = FACTS_REMOVED[name]
    [(path, msg)] = validate_lane_options(lane, {name: "enable"}, "1.2.1")
    assert path == f"lane_options.{name}"
    assert f"TensorRT-LLM {release}" in msg and replacement in msg, msg


def test_registry_covers_the_facts_list_exactly():
    assert set(REMOVED) == set(FACTS_REMOVED)
    assert REMOVED["paged_kv_cache"].change == "deprecated" and REMOVED["paged_kv_cache"].removed_in is None
    assert REMOVED["max_output_len"].deprecated_in == "0.11" and REMOVED["max_output_len"].removed_in == "0.12"


def test_dashed_spelling_and_old_pins():
    [(_, msg)] = validate_lane_options("trtllm-engine", {"--max-output-len": 512}, None)
    assert "removed in TensorRT-LLM 0.12" in msg and "deprecated in 0.11" in msg
    [(_, msg)] = validate_lane_options("trtllm-engine", {"auto_parallel": 2}, "1.1.0")
    assert "the pinned 1.1.0 still has it, but enginefoundry does not emit it" in msg
    [(_, msg)] = validate_lane_options("trtllm-engine", {"auto_parallel": 2}, "1.2.1")
    assert "still has it" not in msg


def test_unknown_option_lists_the_valid_ones_and_a_close_match():
    [(path, msg)] = validate_lane_options("trtllm-engine", {"gemm_plugn": "float16"})
    assert path == "lane_options.gemm_plugn" and "did you mean gemm_plugin?" in msg
    assert "valid options: " + ", ".join(sorted(EngineOptions.model_fields)) in msg
    [(_, msg)] = validate_lane_options("trtllm", {"bogus": 1})
    assert "valid options: " + ", ".join(sorted(TrtllmOptions.model_fields)) in msg and "did you mean" not in msg


def test_engine_flags_on_the_pytorch_lane_point_to_the_engine_lane():
    for key in ("gemm_plugin", "gpt_attention_plugin", "use_paged_context_fmha", "multiple_profiles",
                "load_by_shard", "max_beam_width"):  # triton_dir: a trtllm option too (the LLM API Triton model)
        [(_, msg)] = validate_lane_options("trtllm", {key: "float16"})
        assert "lane trtllm-engine" in msg and "PR #5312" in msg, key


def test_spec_fields_are_pointed_at():
    problems = dict(validate_lane_options("trtllm-engine", {"max_batch_size": 8, "kv_cache_free_gpu_mem_fraction": 0.9,
                                                           "tensor_parallel_size": 2}))
    assert problems["lane_options.max_batch_size"].endswith("profiles[].max_batch_size")
    assert problems["lane_options.kv_cache_free_gpu_mem_fraction"].endswith(
        "profiles[].kv_cache_free_gpu_memory_fraction")
    assert problems["lane_options.tensor_parallel_size"].endswith("variants[].tp")


def test_option_values_are_checked():
    problems = dict(validate_lane_options("trtllm-engine", {
        "gemm_plugin": "fp16", "gpt_attention_plugin": "disable", "use_fused_mlp": "yes", "build_workers": 0,
        "tokens_per_block": 48, "triton_batch_scheduler_policy": "fifo",
    }))
    assert "must be one of auto, float16" in problems["lane_options.gemm_plugin"]
    assert "#2690" in problems["lane_options.gpt_attention_plugin"]
    assert "true or false" in problems["lane_options.use_fused_mlp"]
    assert "≥ 1" in problems["lane_options.build_workers"]
    assert "must be one of 8, 16, 32, 64, 128" in problems["lane_options.tokens_per_block"]
    assert "max_utilization" in problems["lane_options.triton_batch_scheduler_policy"]
    assert validate_lane_options("trtllm", {"cuda_graphs": True, "warmup_requests": 4}) == []


def test_resolve_fills_defaults():
    opts = resolve_options("trtllm-engine", {"gemm_plugin": "float16"})
    assert opts["gemm_plugin"] == "float16" and opts["gpt_attention_plugin"] == "auto"
    assert opts["use_paged_context_fmha"] is True and opts["triton_dir"] == "/app"
    assert resolve_options("trtllm", {})["cuda_graphs"] is True


def test_explain_unknown_key_for_spec_messages():
    assert "0.12" in explain_unknown_key("max_output_len")
    assert explain_unknown_key("--max_seq_len") == "set it as profiles[].max_seq_len"
    assert explain_unknown_key("temperature") is None


@pytest.mark.parametrize(("version", "engine_ok", "trtllm_ok"), [
    ("1.0.0", True, True), ("1.1.0", True, True), ("1.2.0rc2", True, True), ("1.2.1", True, True),
    ("1.3.0", False, True), ("1.3.0rc0", False, True), ("1.3.0rc29", False, True), ("1.4.0rc1", False, True),
    ("0.21.0", False, False),
])
def test_release_gates(version, engine_ok, trtllm_ok):
    assert (lane_release_problem("trtllm-engine", version) is None) is engine_ok
    assert (lane_release_problem("trtllm", version) is None) is trtllm_ok


def test_engine_refusal_says_why_and_what_to_use():
    msg = lane_release_problem("trtllm-engine", "1.3.0rc5")
    for needle in ("release candidate", "#15763", "#15907", "#15918", "#16369", "#15767",
                   "tensorrt-llm>=1.0,<1.3", "--pre", "lane trtllm"):
        assert needle in msg, needle
    assert "PR #5312" in lane_release_problem("trtllm", "0.21.0")


def test_version_parsing_compares_releases_not_pep440():
    v = parse_version("1.3.0rc29")
    assert v.release == (1, 3, 0) and v.is_prerelease and str(v) == "1.3.0rc29"
    assert not parse_version("1.2.0.post1").is_prerelease
    assert parse_version("1.2").release == (1, 2, 0)
    with pytest.raises(ValueError):
        parse_version("latest")


def test_emitted_flags_are_registered_and_not_removed():
    assert arg(TRTLLM_BUILD, "kv_cache_type") == "--kv_cache_type"
    with pytest.raises(KeyError, match="not registered"):
        arg(TRTLLM_BUILD, "tp_size")
    assert emitted_names(TRTLLM_BUILD) <= FACTS_BUILD_FLAGS
    assert emitted_names(CONVERT) <= FACTS_CONVERT_FLAGS
    assert emitted_names(SERVE) <= FACTS_SERVE_FLAGS
    assert not (emitted_names(TRTLLM_BUILD) & set(REMOVED))
    assert len({(f.tool, f.key) for f in EMITTED}) == len(EMITTED)


def test_release_ranges():
    assert flag(TRTLLM_BUILD, "kv_cache_type").exists_in("1.2.1")
    assert not flag(TRTLLM_BUILD, "kv_cache_type").exists_in("1.3.0rc1")
    assert not any(f.exists_in("1.3.0") for f in EMITTED if f.tool in (TRTLLM_BUILD, CONVERT))
    assert all(f.exists_in("1.0.0") for f in EMITTED
               if f.versioned_by == "tensorrt_llm" and parse_version(f.since).release <= (1, 0, 0))
    assert not flag(ENV, "TLLM_AUTOTUNER_CACHE_PATH").exists_in("1.0.0")
    assert flag(LLM_API, "kv_cache_config.free_gpu_memory_fraction").exists_in("1.4.0rc1")


def test_shipped_configs_pass_lane_validation():
    for name in ("llama-3-70b-tp2-a100.yaml", "llama-3.1-8b-multiarch.yaml"):
        spec = load_spec(CONFIGS / name)
        assert get_lane(spec.lane).validate_options(spec) == [], name


def _spec(name: str, **changes) -> dict:
    import yaml

    data = yaml.safe_load((CONFIGS / name).read_text())
    data = copy.deepcopy(data)
    data.update(changes)
    return data


def test_engine_lane_validation_of_the_spec():
    data = _spec("llama-3-70b-tp2-a100.yaml", toolchain={"trtllm_version": "1.3.0rc2"},
                 lane_options={"gemm_plugin": "float16", "use_custom_all_reduce": "disable", "max_output_len": 1024})
    data["profiles"][0]["paged_kv_cache"] = False
    with pytest.raises(SpecError) as err:  # lane_options is the lane's typed model: refused when parsed
        parse_spec(data)
    problems = dict(err.value.problems)
    assert "0.12" in problems["lane_options.use_custom_all_reduce"]
    assert "max_seq_len" in problems["lane_options.max_output_len"]
    data["lane_options"] = {"gemm_plugin": "float16"}
    problems = dict(get_lane("trtllm-engine").validate_options(parse_spec(data)))
    assert "#15918" in problems["toolchain.trtllm_version"]
    assert "paged KV cache" in problems["profiles.0.paged_kv_cache"]
    unpinned = parse_spec(_spec("llama-3-70b-tp2-a100.yaml", toolchain={}))
    assert "pinned" in dict(get_lane("trtllm-engine").validate_options(unpinned))["toolchain.trtllm_version"]


def test_pytorch_lane_validation_of_variants():
    data = _spec("llama-3.1-8b-multiarch.yaml")
    data["variants"] += [{"precision": "int4_wo"}, {"precision": "bf16", "kv_cache_dtype": "int8"},
                         {"precision": "bf16", "tp": 2, "kv_cache_dtype": "fp16"}]
    problems = dict(get_lane("trtllm").validate_options(parse_spec(data)))
    assert "int4_awq" in problems["variants.2.precision"]
    assert "auto or fp8" in problems["variants.3.kv_cache_dtype"]
    assert "model's own dtype" in problems["variants.4.kv_cache_dtype"]


# --- toolchain detection -------------------------------------------------------------------------------------

def test_probe_output_is_read_from_the_marker_line_only():
    text = ("[TensorRT-LLM] TensorRT LLM version: 1.2.1\n"
            + PROBE_MARKER + '{"python": "3.12.3", "tensorrt_llm": "1.2.1", "tensorrt": "10.14.1.48", '
            '"torch": "2.9.1", "cuda": "13.0", "errors": {}}\n'
            "[TensorRT-LLM][INFO] shutting down\n")
    info = toolchain_from_probe(parse_probe_output(text), driver="580.159.04", cuda_driver="13.0")
    assert info.versions() == {"tensorrt_llm": "1.2.1", "tensorrt": "10.14.1.48", "torch": "2.9.1",
                               "cuda": "13.0", "driver": "580.159.04", "cuda_driver": "13.0"}
    with pytest.raises(ToolError, match="no result line"):
        parse_probe_output("[TensorRT-LLM] TensorRT LLM version: 1.2.1\nSegmentation fault\n")
    with pytest.raises(ToolError, match="malformed"):
        parse_probe_output(PROBE_MARKER + "{oops\n")
    with pytest.raises(ToolError, match=r"malformed result line \(not an object\)"):
        parse_probe_output(PROBE_MARKER + '["3.12.3"]\n')
