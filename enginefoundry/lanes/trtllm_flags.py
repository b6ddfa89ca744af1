"""Every TensorRT-LLM flag, option and key enginefoundry emits or refuses, with the releases it exists in.

The one place that knows TensorRT-LLM's command-line surface. Lanes build argv only through `arg()`, which
fails for a flag not listed here, so a flag cannot be emitted without its release range being written down.
Removed flags (old tutorials are full of them, #2119) are refused with the release that removed them and the
replacement. Source of every entry: facts/trtllm.md (section in brackets) unless a comment says otherwise.

`since` is the first release the facts establish; "1.0" means "present in every release this project supports"
(the lanes need TRT-LLM ≥ 1.0, so earlier history is not tracked). `until` is the last release series that has
it ("1.2": the engine path is removed in 1.3, #15763/#15907/#15918/#16369).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from enginefoundry.toolchain import parse_version

FLOOR = "1.0"
ENGINE_LAST = "1.2"  # last release series with trtllm-build / convert_checkpoint.py / inflight_batcher_llm

TRTLLM_BUILD = "trtllm-build"
CONVERT = "convert_checkpoint.py"  # examples/models/core/llama/convert_checkpoint.py
SERVE = "trtllm-serve"
LLM_API = "LLM API YAML (--extra_llm_api_options)"
HF_PTQ = "hf_ptq.py"  # Model-Optimizer examples/llm_ptq/hf_ptq.py (versioned with nvidia-modelopt, not TRT-LLM)
FILL = "fill_template.py"
LAUNCH_TRITON = "launch_triton_server.py"
ENV = "environment"


@dataclass(frozen=True)
class Flag:
    tool: str
    name: str  # without leading dashes; for YAML, a dotted key path
    since: str = FLOOR
    until: str | None = None
    refs: tuple[str, ...] = ()
    note: str = ""

    def exists_in(self, version: str) -> bool:
        v = parse_version(version).release
        if v < parse_version(self.since).release:
            return False
        return self.until is None or v[:2] <= parse_version(self.until).release[:2]


def _flags(tool: str, names: str, **kw: Any) -> list[Flag]:
    return [Flag(tool, n, **kw) for n in names.split()]


EMITTED: tuple[Flag, ...] = (
    # trtllm-build [§4]: the tool exists 1.0 – 1.2.x; removed on main by #15918.
    *_flags(TRTLLM_BUILD, "checkpoint_dir output_dir max_batch_size max_input_len max_seq_len max_num_tokens "
            "max_beam_width gemm_plugin gpt_attention_plugin remove_input_padding use_paged_context_fmha "
            "use_fused_mlp multiple_profiles tokens_per_block input_timing_cache", until=ENGINE_LAST),
    # 0.13 deprecated --paged_kv_cache in favour of --kv_cache_type (#2201).
    Flag(TRTLLM_BUILD, "kv_cache_type", since="0.13", until=ENGINE_LAST, refs=("#2201",)),
    # Default `model.cache` is relative and written into the CWD by rank 0: always pass an explicit path.
    Flag(TRTLLM_BUILD, "output_timing_cache", until=ENGINE_LAST, note="default model.cache in the CWD"),
    # Capped at run time: workers = min(torch.cuda.device_count(), --workers).
    Flag(TRTLLM_BUILD, "workers", until=ENGINE_LAST, note="capped to the visible GPU count"),
    # convert_checkpoint.py (llama) [§3]; deleted on main by #15763.
    *_flags(CONVERT, "model_dir output_dir dtype tp_size pp_size workers use_weight_only weight_only_precision "
            "use_fp8 use_nvfp4 fp8_kv_cache int8_kv_cache calib_dataset calib_size calib_max_seq_length "
            "load_by_shard", until=ENGINE_LAST, refs=("#15763",)),
    # trtllm-serve [§7]: 0.15+. --backend tensorrt and --tokenizer (engine only) go with the engine path.
    *_flags(SERVE, "host port extra_llm_api_options", since="0.15"),
    # Used by the engine lane; `--backend tensorrt` is accepted only up to 1.2.x (the value, not the flag, goes).
    *_flags(SERVE, "backend tokenizer kv_cache_free_gpu_memory_fraction max_batch_size max_num_tokens tp_size "
            "pp_size", since="0.15"),
    # ModelOpt unified HF export (hf_quant_config.json). Flags from Model-Optimizer examples/llm_ptq/hf_ptq.py
    # (not in the facts; checked against the Model-Optimizer source). --export_fmt hf is what facts §3 names;
    # newer hf_ptq.py defaults to hf and keeps the flag as deprecated.
    # since="0.0": versioned with nvidia-modelopt, so no TensorRT-LLM release bounds it.
    *_flags(HF_PTQ, "pyt_ckpt_path qformat kv_cache_qformat calib_size calib_seq dataset export_path export_fmt",
            since="0.0"),
    # Triton fill_template.py takes `-i/--in_place <file> k:v,…` [§10].
    Flag(FILL, "in_place", until=ENGINE_LAST),
    # launch_triton_server.py: --world_size must equal the engine's tp × pp [§10].
    *_flags(LAUNCH_TRITON, "world_size model_repo", until=ENGINE_LAST),
    # Autotuner cache (PR #7738). The facts do not name the first release carrying it: a missing cache file
    # after warm-up is recorded, not fatal.
    Flag(ENV, "TLLM_AUTOTUNER_CACHE_PATH", refs=("PR #7738",)),
    # The LLM API YAML is validated upstream with pydantic extra="forbid" [§6]: every key must exist. `dtype` and
    # the cuda_graph_config fields are not in the facts; they are BaseLlmArgs / CudaGraphConfig fields of
    # tensorrt_llm/llmapi/llm_args.py (cuda_graph_config: null turns CUDA graphs off).
    *_flags(LLM_API, "tensor_parallel_size pipeline_parallel_size max_batch_size max_num_tokens max_seq_len "
            "kv_cache_config kv_cache_config.free_gpu_memory_fraction kv_cache_config.dtype "
            "kv_cache_config.enable_block_reuse kv_cache_config.tokens_per_block cuda_graph_config "
            "cuda_graph_config.enable_padding cuda_graph_config.max_batch_size enable_chunked_prefill dtype"),
)

_EMITTED_INDEX = {(f.tool, f.name): f for f in EMITTED}


def flag(tool: str, name: str) -> Flag:
    try:
        return _EMITTED_INDEX[(tool, name)]
    except KeyError:
        raise KeyError(f"{tool} flag '{name}' is not registered in trtllm_flags.EMITTED") from None


def arg(tool: str, name: str) -> str:
    """'--name' for a registered flag of `tool` (KeyError for an unregistered one: register it first)."""
    return "--" + flag(tool, name).name


def emitted_names(tool: str) -> frozenset[str]:
    return frozenset(f.name for f in EMITTED if f.tool == tool)


# --- removed and renamed flags -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Removed:
    """A flag that old tutorials still use. `change` is what happened in `release`."""

    name: str
    tool: str
    release: str
    replacement: str
    refs: tuple[str, ...] = ()
    change: str = "removed"  # "removed", "deprecated", "moved to runtime"
    deprecated_in: str | None = None

    @property
    def removed_in(self) -> str | None:
        return self.release if self.change != "deprecated" else None

    def message(self, pinned: str | None = None) -> str:
        refs = f" ({', '.join(self.refs)})" if self.refs else ""
        dep = f"deprecated in {self.deprecated_in}, " if self.deprecated_in else ""
        text = f"{self.tool} --{self.name} was {dep}{self.change} in TensorRT-LLM {self.release}{refs}"
        if self.change == "deprecated":
            text += " (still accepted with a warning)"
        elif pinned and _release_lt(pinned, self.release):
            text += f"; the pinned {pinned} still has it, but enginefoundry does not emit it"
        return f"{text}: {self.replacement}"


def _release_lt(a: str, b: str) -> bool:
    return parse_version(a).release < parse_version(b).release


_PARALLEL = "parallelism is fixed at conversion time (checkpoint `mapping`): set variants[].tp / variants[].pp"

REMOVED: dict[str, Removed] = {r.name: r for r in (
    Removed("max_output_len", TRTLLM_BUILD, "0.12", "use profiles[].max_seq_len (input + output tokens)",
            ("#2119",), deprecated_in="0.11"),
    Removed("use_custom_all_reduce", TRTLLM_BUILD, "0.12",
            "no replacement flag: the all-reduce strategy is chosen by the runtime", ("#2119",)),
    Removed("tp_size", TRTLLM_BUILD, "0.12", _PARALLEL, ("#2119",)),
    Removed("pp_size", TRTLLM_BUILD, "0.12", _PARALLEL, ("#2119",)),
    Removed("cp_size", TRTLLM_BUILD, "0.12", _PARALLEL, ("#2119",)),
    Removed("multi_block_mode", TRTLLM_BUILD, "0.12",
            "a runtime setting now (Triton parameter multi_block_mode)", ("#2119",), change="moved to runtime"),
    Removed("context_fmha_fp32_acc", TRTLLM_BUILD, "0.12",
            "a runtime setting now (Triton parameter enable_context_fmha_fp32_acc)", ("#2119",),
            change="moved to runtime"),
    Removed("paged_kv_cache", TRTLLM_BUILD, "0.13",
            "use --kv_cache_type paged, which enginefoundry emits from profiles[].paged_kv_cache",
            ("#2201",), change="deprecated"),
    Removed("builder_opt", TRTLLM_BUILD, "0.14", "no replacement"),
    Removed("builder_force_num_profiles", TRTLLM_BUILD, "0.15",
            "it became the environment variable BUILDER_FORCE_NUM_PROFILES; or set lane option multiple_profiles"),
    Removed("enable_xqa", TRTLLM_BUILD, "0.16", "no replacement: XQA kernels are picked automatically"),
    Removed("strongly_typed", TRTLLM_BUILD, "0.11", "no replacement: build.py hard-codes strongly_typed=True"),
    Removed("weight_only_precision", TRTLLM_BUILD, "0.11",
            "weight-only quantization happens at conversion: set variants[].precision to int8_wo, int4_wo or "
            "int4_awq (convert_checkpoint.py --use_weight_only --weight_only_precision)"),
    Removed("use_context_fmha_for_generation", TRTLLM_BUILD, "0.11", "no replacement"),
    Removed("attention_qk_half_accumulation", TRTLLM_BUILD, "0.11", "no replacement"),
    Removed("auto_parallel", TRTLLM_BUILD, "1.2.0", _PARALLEL, ("PR #8329",)),
    Removed("gpus_per_node", TRTLLM_BUILD, "1.2.0", _PARALLEL, ("PR #8329",)),
    Removed("cluster_key", TRTLLM_BUILD, "1.2.0",
            "no cross-GPU build exists (#222, #1807): build on a GPU of the target", ("PR #8329",)),
)}

# Names that belong to the spec, not to lane_options.
SPEC_FIELDS: dict[str, str] = {
    "max_batch_size": "profiles[].max_batch_size",
    "max_input_len": "profiles[].max_input_len",
    "max_seq_len": "profiles[].max_seq_len",
    "max_num_tokens": "profiles[].max_num_tokens",
    "kv_cache_free_gpu_memory_fraction": "profiles[].kv_cache_free_gpu_memory_fraction",
    "kv_cache_free_gpu_mem_fraction": "profiles[].kv_cache_free_gpu_memory_fraction",
    "free_gpu_memory_fraction": "profiles[].kv_cache_free_gpu_memory_fraction",
    "remove_input_padding": "profiles[].remove_input_padding",
    "kv_cache_type": "profiles[].paged_kv_cache",
    "tensor_parallel_size": "variants[].tp",
    "pipeline_parallel_size": "variants[].pp",
    "kv_cache_dtype": "variants[].kv_cache_dtype",
    "use_fp8": "variants[].precision: fp8",
    "use_nvfp4": "variants[].precision: nvfp4",
    "use_weight_only": "variants[].precision: int8_wo / int4_wo / int4_awq",
    "qformat": "variants[].precision",
    "calib_dataset": "variants[].calibration.dataset",
    "calib_size": "variants[].calibration.samples",
}


def explain_unknown_key(name: str) -> str | None:
    """Why a TensorRT-LLM-looking key is not accepted where it was written, or None if it is not one we know.

    For spec-level messages (e.g. `max_output_len` in a profile): the lead's parse_spec can append this.
    """
    key = name.lstrip("-").replace("-", "_")
    if key in REMOVED:
        return REMOVED[key].message()
    if key in SPEC_FIELDS:
        return f"set it as {SPEC_FIELDS[key]}"
    return None


# --- lane releases -------------------------------------------------------------------------------------------

ENGINE_INSTALL_HINT = ("Pin tensorrt-llm>=1.0,<1.3 and never install with --pre (that gives 1.4.0rc1), "
                       "or use lane trtllm (PyTorch backend).")
TRTLLM_INSTALL_HINT = ("Run the lane in nvcr.io/nvidia/tensorrt-llm/release:<version> (the spec's toolchain.image) "
                       "or pip install 'tensorrt-llm>=1.0' on a host with an NVIDIA driver.")


def lane_release_problem(lane: str, version: str) -> str | None:
    """Why TensorRT-LLM `version` cannot run `lane`, or None when it can."""
    try:
        v = parse_version(version)
    except ValueError as err:
        return str(err)
    if v.release < (1, 0, 0):
        return (f"TensorRT-LLM {version} is older than 1.0, the first release with the PyTorch backend as the "
                f"default (PR #5312) and the oldest this project supports; use 1.0 or newer")
    if lane == "trtllm-engine" and v.release[:2] >= (1, 3):
        pre = " (a release candidate of 1.3+ counts as 1.3)" if v.is_prerelease else ""
        return (f"lane trtllm-engine needs TensorRT-LLM 1.0 – 1.2.x, not {version}{pre}: the 1.3 line removes the "
                "TensorRT engine path (convert_checkpoint.py #15763, Triton inflight_batcher_llm #15907, trtllm-build "
                "and the builder #15918, C++ engine runtime #16369; migration guide #15767), and which 1.3 rc first "
                "dropped it is not pinned down. " + ENGINE_INSTALL_HINT)
    return None


# --- lane options --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LaneOption:
    name: str
    kind: type
    default: Any
    help: str
    emits: str = ""
    choices: tuple[Any, ...] | None = None
    minimum: int | None = None
    refused_values: Mapping[Any, str] = field(default_factory=dict)

    def check(self, value: Any) -> str | None:
        if self.kind is bool and not isinstance(value, bool):
            return f"must be true or false, got {value!r}"
        if self.kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            return f"must be an integer, got {value!r}"
        if self.kind is str and not isinstance(value, str):
            return f"must be a string, got {value!r}"
        if value in self.refused_values:
            return self.refused_values[value]
        if self.choices is not None and value not in self.choices:
            return f"must be one of {', '.join(map(str, self.choices))}; got {value!r}"
        if self.minimum is not None and value < self.minimum:
            return f"must be ≥ {self.minimum}, got {value}"
        return None


# trtllm-build dtype plugins [§4 plugin flags]. `disable` for the attention plugin is refused: in-flight
# batching with a paged KV cache and packed input needs it, and builds without it leak host memory (#2690).
GEMM_PLUGIN_VALUES = ("auto", "float16", "float32", "bfloat16", "int32", "fp8", "nvfp4", "disable")
ATTENTION_PLUGIN_VALUES = ("auto", "float16", "float32", "bfloat16")

ENGINE_OPTIONS: dict[str, LaneOption] = {o.name: o for o in (
    LaneOption("gemm_plugin", str, "auto", "GEMM plugin dtype; auto follows the checkpoint dtype",
               "trtllm-build --gemm_plugin", choices=GEMM_PLUGIN_VALUES),
    LaneOption("gpt_attention_plugin", str, "auto", "attention plugin dtype", "trtllm-build --gpt_attention_plugin",
               choices=ATTENTION_PLUGIN_VALUES,
               refused_values={"disable": "cannot be disable: in-flight batching, the paged KV cache and packed "
                                          "input need the GPT attention plugin (and #2690: host OOM without it)"}),
    LaneOption("use_paged_context_fmha", bool, True, "needed for chunked context and KV-cache reuse",
               "trtllm-build --use_paged_context_fmha"),
    LaneOption("use_fused_mlp", bool, None, "fused gated MLP (the 1.x default is enable)",
               "trtllm-build --use_fused_mlp"),
    LaneOption("multiple_profiles", bool, None, "several TensorRT optimisation profiles (longer build)",
               "trtllm-build --multiple_profiles"),
    LaneOption("tokens_per_block", int, None, "KV-cache block size (1.x default 32)", "trtllm-build --tokens_per_block",
               choices=(8, 16, 32, 64, 128)),
    LaneOption("max_beam_width", int, 1, "beam width the engine allows", "trtllm-build --max_beam_width", minimum=1),
    LaneOption("build_workers", int, None, "cap on parallel rank builds; each holds one rank's weights in host "
               "RAM (facts §12: start with 1 on small hosts)", "trtllm-build --workers", minimum=1),
    LaneOption("convert_workers", int, 1, "threads over ranks in convert_checkpoint.py",
               "convert_checkpoint.py --workers", minimum=1),
    LaneOption("load_by_shard", bool, False, "load the HF checkpoint shard by shard (less host memory)",
               "convert_checkpoint.py --load_by_shard"),
    LaneOption("dtype", str, None, "activation dtype of quantized variants (default: the checkpoint's)",
               "convert_checkpoint.py --dtype", choices=("float16", "bfloat16")),
    LaneOption("examples_dir", str, None, "TensorRT-LLM examples/ of the installed release "
               "(default $EF_TRTLLM_EXAMPLES_DIR)", "python <examples_dir>/models/core/llama/convert_checkpoint.py"),
    LaneOption("triton_dir", str, "/app", "Triton backend tree with all_models/ and tools/ (the NGC container's "
               "/app, or a TensorRT-LLM checkout's triton_backend/)", "fill_template.py, templates"),
    LaneOption("triton_bundle_mount", str, None, "where the serving container mounts the bundle (engine_dir and "
               "tokenizer_dir are written relative to it); default: the bundle's build-time path", "engine_dir"),
    LaneOption("triton_decoupled_mode", bool, False, "streaming (decoupled) Triton models", "decoupled_mode"),
    LaneOption("triton_max_queue_delay_microseconds", int, 0, "Triton dynamic batching delay",
               "max_queue_delay_microseconds", minimum=0),
    LaneOption("triton_batch_scheduler_policy", str, None, "Triton batch scheduler policy",
               "batch_scheduler_policy", choices=("max_utilization", "guaranteed_no_evict")),
    LaneOption("triton_enable_kv_cache_reuse", bool, None, "KV-cache block reuse in Triton", "enable_kv_cache_reuse"),
    LaneOption("triton_instance_count", int, 1, "instances of preprocessing, postprocessing and BLS",
               "*_instance_count", minimum=1),
)}

TRTLLM_OPTIONS: dict[str, LaneOption] = {o.name: o for o in (
    LaneOption("cuda_graphs", bool, True, "capture CUDA graphs for decode batches", "cuda_graph_config (null: off)"),
    LaneOption("cuda_graph_padding", bool, True, "pad batches up to the nearest captured size",
               "cuda_graph_config.enable_padding"),
    LaneOption("cuda_graph_max_batch_size", int, None, "largest captured batch (default: the profile's "
               "max_batch_size)", "cuda_graph_config.max_batch_size", minimum=1),
    LaneOption("enable_block_reuse", bool, None, "KV-cache block reuse (upstream default true)",
               "kv_cache_config.enable_block_reuse"),
    LaneOption("tokens_per_block", int, None, "KV-cache block size (upstream default 32)",
               "kv_cache_config.tokens_per_block", choices=(8, 16, 32, 64, 128)),
    LaneOption("enable_chunked_prefill", bool, None, "chunked prefill; default: on when max_input_len > "
               "max_num_tokens, else off", "enable_chunked_prefill"),
    LaneOption("modelopt_dir", str, None, "Model-Optimizer examples/llm_ptq folder (default "
               "$EF_MODELOPT_LLM_PTQ_DIR)", "python <modelopt_dir>/hf_ptq.py"),
    LaneOption("warmup_requests", int, 8, "requests sent during warm-up (fills the autotuner cache)", "warm-up",
               minimum=1),
    LaneOption("autotuner_cache", bool, True, "save the autotuner profiling cache into the bundle",
               "TLLM_AUTOTUNER_CACHE_PATH"),
)}

LANE_OPTIONS: dict[str, dict[str, LaneOption]] = {"trtllm": TRTLLM_OPTIONS, "trtllm-engine": ENGINE_OPTIONS}


def _engine_path_flag(name: str) -> bool:
    return (name in ENGINE_OPTIONS and name not in TRTLLM_OPTIONS) or name in emitted_names(TRTLLM_BUILD) \
        or name in emitted_names(CONVERT)


def validate_lane_options(lane: str, options: Mapping[str, Any], pinned: str | None = None) -> list[tuple[str, str]]:
    """Every problem with `lane_options` for `lane`, as (field path, message)."""
    valid = LANE_OPTIONS[lane]
    problems: list[tuple[str, str]] = []
    for raw_key, value in options.items():
        key = str(raw_key).lstrip("-").replace("-", "_")
        path = f"lane_options.{raw_key}"
        if key in REMOVED:
            problems.append((path, REMOVED[key].message(pinned)))
        elif key in valid:
            why = valid[key].check(value)
            if why:
                problems.append((path, why))
        elif key in SPEC_FIELDS:
            problems.append((path, f"not a lane option: set it as {SPEC_FIELDS[key]}"))
        elif lane == "trtllm" and _engine_path_flag(key):
            problems.append((path, f"{key} belongs to the TensorRT engine path (trtllm-build / convert_checkpoint.py); "
                                   "lane trtllm runs the PyTorch backend (default since 1.0, PR #5312) and has no "
                                   "engine build: remove it, or use lane trtllm-engine"))
        else:
            close = difflib.get_close_matches(key, list(valid), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            problems.append((path, f"unknown option for lane {lane}{hint}; valid options: {', '.join(sorted(valid))}"))
    return problems


def resolve_options(lane: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """Lane options with defaults filled in (call after validate_lane_options found nothing)."""
    valid = LANE_OPTIONS[lane]
    out = {name: opt.default for name, opt in valid.items()}
    for k, v in options.items():
        key = str(k).lstrip("-").replace("-", "_")
        if key in valid:
            out[key] = v
    return out


# --- LLM API YAML keys (pydantic extra="forbid" upstream) -------------------------------------------------------

def llm_api_key_paths(data: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted key paths of a runtime YAML, descending into the two nested configs enginefoundry writes."""
    paths = []
    for k, v in data.items():
        path = f"{prefix}{k}"
        paths.append(path)
        if isinstance(v, Mapping) and path in ("kv_cache_config", "cuda_graph_config"):
            paths.extend(llm_api_key_paths(v, prefix=path + "."))
    return paths


def unknown_llm_api_keys(data: Mapping[str, Any]) -> list[str]:
    """Keys TensorRT-LLM would reject (or that are not registered here)."""
    known = emitted_names(LLM_API)
    return [p for p in llm_api_key_paths(data) if p not in known]


# --- Triton templates [§10] ----------------------------------------------------------------------------------

# Every key the facts document per template; fill_template.py asserts that each key it is given exists.
TRITON_TEMPLATE_KEYS: dict[str, frozenset[str]] = {
    "tensorrt_llm": frozenset((
        "triton_backend", "triton_max_batch_size", "decoupled_mode", "max_queue_delay_microseconds",
        "max_queue_size", "max_beam_width", "batching_strategy", "engine_dir", "encoder_engine_dir",
        "encoder_input_features_data_type", "logits_datatype", "prompt_embedding_table_data_type",
        "max_tokens_in_paged_kv_cache", "max_attention_window_size", "sink_token_length",
        "batch_scheduler_policy", "kv_cache_free_gpu_mem_fraction", "cross_kv_cache_fraction",
        "kv_cache_host_memory_bytes", "kv_cache_onboard_blocks", "enable_kv_cache_reuse",
        "enable_chunked_context", "exclude_input_in_output", "cancellation_check_period_ms",
        "stats_check_period_ms", "iter_stats_max_iterations", "request_stats_max_iterations",
        "normalize_log_probs", "gpu_device_ids", "participant_ids", "num_nodes",
        "lora_cache_optimal_adapter_size", "lora_cache_max_adapter_size", "lora_cache_gpu_memory_fraction",
        "lora_cache_host_memory_bytes", "lora_prefetch_dir", "decoding_mode", "lookahead_window_size",
        "lookahead_ngram_size", "lookahead_verification_set_size", "medusa_choices", "eagle_choices",
        "gpu_weights_percent", "enable_context_fmha_fp32_acc", "multi_block_mode", "cuda_graph_mode",
        "cuda_graph_cache_size", "speculative_decoding_fast_logits", "tokenizer_dir", "guided_decoding_backend",
        "xgrammar_tokenizer_info_path",
    )),
    "preprocessing": frozenset((
        "triton_max_batch_size", "tokenizer_dir", "preprocessing_instance_count",
        "max_queue_delay_microseconds", "max_queue_size", "add_special_tokens", "multimodal_model_path",
        "engine_dir", "max_num_images",
    )),
    "postprocessing": frozenset((
        "triton_max_batch_size", "tokenizer_dir", "postprocessing_instance_count", "skip_special_tokens",
    )),
    "ensemble": frozenset((
        "triton_max_batch_size", "logits_datatype",
    )),
    "tensorrt_llm_bls": frozenset((
        "triton_max_batch_size", "decoupled_mode", "bls_instance_count", "logits_datatype",
    )),
}
