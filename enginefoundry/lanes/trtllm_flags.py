"""Every TensorRT-LLM flag, option and key enginefoundry emits or refuses, with the releases it exists in.

The one place that knows TensorRT-LLM's command-line surface. Lanes build argv only through `arg()`, which
fails for a flag not listed here, so a flag cannot be emitted without its release range being written down.
Removed flags (old tutorials are full of them, #2119) are refused with the release that removed them and the
replacement. Source of every entry: facts/trtllm.md (section in brackets) unless a comment says otherwise.

`since` is the first release the facts establish; "1.0" means "present in every release this project supports"
(the lanes need TRT-LLM ≥ 1.0, so earlier history is not tracked). `until` is the last release series that has
it ("1.2": the engine path is removed in 1.3, #15763/#15907/#15918/#16369). `checked` is the newest release the
entry's evidence covers: on a later release an entry without `until` is neither present nor absent but *to be
probed* (`Flag.status`), and `plan` says so; only the worker's probe of the installed release decides it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypedDict, Unpack

from enginefoundry.inputs.toolchain import ToolUse, parse_version
from enginefoundry.schemas.loose import TrtllmConfig

FLOOR = "1.0"
# The evidence horizon of an entry that cites nothing newer: the 1.3 line as far as the sources read here reach
# (1.3.0rc24: spark-arena/sparkrun#256; the AIConfigurator templates reach 1.3.0rc23). Later 1.3 rcs (rc25 – rc29 on
# the package index, facts §1) and the 1.4 line (1.4.0rc0 – rc4) are releases this registry knows, whose items are
# to be probed unless an entry cites evidence for them (`checked`).
CHECKED = "1.3.0rc24"
LINE_14 = "1.4.0rc4"  # the newest 1.4 release whose docs were read (nvidia.github.io/TensorRT-LLM/1.4.0rc4/)
ENGINE_LAST = "1.2"  # last release series with trtllm-build / convert_checkpoint.py / inflight_batcher_llm

TRTLLM_BUILD = "trtllm-build"
CONVERT = "convert_checkpoint.py"  # examples/models/core/llama/convert_checkpoint.py
QUANTIZE = "quantize.py"  # examples/quantization/quantize.py (engine-lane PTQ through ModelOpt)
SERVE = "trtllm-serve"
LLM_API = "LLM API YAML (--extra_llm_api_options)"
HF_PTQ = "hf_ptq.py"  # Model-Optimizer examples/{llm_ptq,hf_ptq}/hf_ptq.py (versioned with nvidia-modelopt)
FILL = "fill_template.py"
LAUNCH_TRITON = "launch_triton_server.py"
LLMAPI_TRITON = "Triton LLM API model.yaml (all_models/llmapi/tensorrt_llm/1)"  # the PyTorch-backend Triton model
ENV = "environment"

TENSORRT_LLM = "tensorrt_llm"
MODELOPT = "modelopt"

# Upstream references (file@commit, PR, release note). facts = ../shared/facts/trtllm.md.
REF_BUILD = "tensorrt_llm/commands/build.py@008b2b8d23af95e4e19fa6f354f9c5f6349b2bfc (parse_arguments); facts §4"
# The plugin/feature flags are not in build.py's parse_arguments: it calls add_plugin_argument, which turns each
# PluginConfig field into a flag (tensorrt_llm/plugin/plugin.py).
REF_PLUGIN = ("tensorrt_llm/plugin/plugin.py@c20322ffd3dc0740ca530c9fad989b22e64f6e06 (PluginConfig fields, "
              "made flags by add_plugin_argument)")
REF_ENGINE_REMOVED = "PR #15918 (trtllm-build and the builder removed on main, 1.3 line)"
REF_CONVERT = "examples/models/core/llama/convert_checkpoint.py (release/1.2); facts §3"
REF_CONVERT_REMOVED = "PR #15763 (examples/models/core/* removed, 1.3 line)"
REF_QUANTIZE = "examples/quantization/quantize.py@059c97c10c12e948e91676c8db3c9f137b0a2389"
# serve.py@4c05a748 is a main commit between PR #7829 (2025-09-18: ChoiceWithAlias([pytorch, tensorrt, _autodeploy],
# {trt: tensorrt})) and PR #9104 (Nov 2025: the --config alias), so of the 1.1/1.2 line: it has --tokenizer, --host,
# --port, --backend, --max_batch_size, --max_num_tokens, --tp_size, --pp_size, --kv_cache_free_gpu_memory_fraction
# and --extra_llm_api_options. The 0.18.2 CLI had --backend pytorch only and no --extra_llm_api_options
# (https://nvidia.github.io/TensorRT-LLM/0.18.2/commands/trtllm-serve.html), so those rows start at 1.0 (FLOOR).
REF_SERVE = "tensorrt_llm/commands/serve.py@4c05a74891e4df8066f08ed4ce14b0972abe4e25 (between #7829 and #9104)"
REF_SERVE_0182 = "docs 0.18.2/commands/trtllm-serve.html (--backend: pytorch only; no --extra_llm_api_options)"
REF_SERVE_CONFIG = "PR #9104 (Nov 2025: --config, an alias of --extra_llm_api_options)"
REF_LAUNCH_KEPT = "PR #15907 (keeps all_models/llmapi and the shared launcher scripts/launch_triton_server.py)"
REF_BACKEND_RENAME = "PR #7829 (2025-09-18: --backend choices trt → tensorrt, after the 1.0 branch)"
REF_AUTOTUNER = "PR #7738 (TLLM_AUTOTUNER_CACHE_PATH; first form saves <stem>.rank{N}.json)"
REF_LLM_API = "tensorrt_llm/llmapi/llm_args.py (TorchLlmArgs, KvCacheConfig, CudaGraphConfig; extra=forbid)"
# NVIDIA's own LLM-API option templates, one per TensorRT-LLM release, shipped in the predictor's package (installed
# in .venv-predict): `kv_cache_config.tokens_per_block` is in every one of them, 0.20.0 … 1.3.0rc23.
AIC_TEMPLATES = "aiconfigurator 0.12.0 generator/config/backend_templates/trtllm/extra_engine_args.{}.yaml.j2"


def ref_aic(*releases: str) -> str:
    return "; ".join(AIC_TEMPLATES.format(r) for r in releases)


REF_TOKENS_PER_BLOCK = ref_aic("1.0.0", "1.1.0rc5", "1.2.0rc2", "1.3.0rc23") + " (kv_cache_config.tokens_per_block)"
# The 1.4 line, read from its docs (the registry's horizon for the entries that cite them).
REF_SERVE_14 = ("docs 1.4.0rc4/commands/trtllm-serve/trtllm-serve.html (syntax: trtllm-serve <model> --tp_size "
                "--pp_size --ep_size --host --port)")
REF_LLM_API_14 = ("docs 1.4.0rc4/llm-api/reference/TorchLlmArgs.html (tensor_parallel_size, dtype, "
                  "pipeline_parallel_size, moe_tensor_parallel_size, moe_expert_parallel_size, enable_attention_dp, "
                  "kv_cache_config, enable_chunked_prefill)")
# MoE parallelism (issue 37 item 1). The three options of BaseLlmArgs, inherited by TorchLlmArgs; the world-size rules
# are Mapping's (tensorrt_llm/mapping.py), which the LLM API builds from them (enginefoundry/lanes/moe_parallel.py).
REF_MOE_LLM_ARGS = ("tensorrt_llm/llmapi/llm_args.py@fcd3f31682808ae56118ae43c1d7864a3a945e6f (BaseLlmArgs: "
                    "moe_tensor_parallel_size, moe_expert_parallel_size: Optional[int] = None, enable_attention_dp: "
                    "bool = False)")
REF_MAPPING = ("tensorrt_llm/mapping.py@b35ac1b64368513d215c57d2ed01d62d910df8da (MappingBase: moe_tp × moe_ep × "
               "moe_cluster must equal tp; unset moe_tp = tp // moe_ep; dp_size = tp_size if enable_attention_dp; "
               "ep_experts: num_experts // moe_ep_size per rank)")
REF_ADP_ATTENTION = ("tensorrt_llm/_torch/modules/attention.py@c6d3bb2aae305e0b5ac1b97b7954dcf87d653322 (attention "
                     "with tp_size = 1 under enable_attention_dp: replicated weights)")
# Top-level LLM() options of the PyTorch backend at 1.0.0 (the 1.0 templates write them under build_config instead).
REF_LLM_RUNTIME_100 = ("docs 1.0.0/examples/llm_runtime.html (LLM(max_batch_size=, max_seq_len=, "
                       "cuda_graph_config=CudaGraphConfig(batch_sizes=, enable_padding=), kv_cache_config="
                       "KvCacheConfig(free_gpu_memory_fraction=)); docs 1.0.0rc4/examples/llm_runtime.html "
                       "(KvCacheConfig(enable_block_reuse=))")
REF_QUANTIZE_REMOVED = ("PR #16612 (merged 2026-07-20, 1.3 line: examples/quantization/quantize.py deleted with "
                        "tensorrt_llm/quantization/quantize_by_modelopt.py)")
REF_HF_PTQ = "NVIDIA/Model-Optimizer examples/llm_ptq/hf_ptq.py@0.37.0"
REF_HF_PTQ_039 = "NVIDIA/Model-Optimizer tag 0.39.0 (examples/llm_ptq/hf_ptq.py gains --calib_seq, qformat int8_wo)"
REF_HF_PTQ_046 = "NVIDIA/Model-Optimizer tag 0.46.0 (examples/llm_ptq → examples/hf_ptq)"
# --export_fmt: argparse choices [tensorrt_llm, hf], default hf, help "Deprecated", and `!= "hf"` only warns
# ("--export_fmt forced to hf"), from 0.37.0 (examples/llm_ptq/hf_ptq.py@df0882a63c39a001a1be384b680166a41259045c)
# through 0.46.0 (examples/hf_ptq/hf_ptq.py@43fd41a58d52c4e6e5dec1d1ff5989ecc737ae1a) and main
# (a2fbac7ba, 2026-08-21): deprecated, never removed.
EXPORT_FMT_DEPRECATED = "0.37"  # from here hf is the default and --export_fmt only warns: the lane drops it
REF_EXPORT_FMT = ("NVIDIA/Model-Optimizer examples/hf_ptq/hf_ptq.py@43fd41a58d52c4e6e5dec1d1ff5989ecc737ae1a (0.46.0: "
                  "still parsed, deprecated, forced to hf); examples/llm_ptq/hf_ptq.py@"
                  "df0882a63c39a001a1be384b680166a41259045c (0.37.0: the same)")
REF_FILL = "triton_backend/tools/fill_template.py (release/1.2); facts §10"
REF_LAUNCH = "triton_backend/scripts/launch_triton_server.py (release/1.2); facts §10"
REF_TEMPLATES = "triton_backend/all_models/inflight_batcher_llm/*/config.pbtxt (release/1.2); facts §10"
REF_TRITON_REMOVED = "PR #15907 (inflight_batcher_llm and its templates removed, 1.3 line)"
# The removal, in the order it landed on main (all in the 1.3 line): #15760 (the first, all-in-one PR, closed unmerged
# and split into the four "step 1.x" PRs), #15763 (step 1.1: examples/models/core/*), #15767 (step 1.2: docs and the
# migration guide), #15810 (step 1.3, TRTLLM-13783: the engine tests), #15907 (step 1.4: Triton C++ backend and the
# TRT-engine templates, "keeping only the PyTorch/LLM API Triton backend (all_models/llmapi) and the shared
# launcher"), #15918 (python modules: builder, commands/build.py, _tensorrt_engine), #16369 (C++, the tensorrt pip
# dependency).
REF_REMOVAL_PRS = "PRs #15760 (closed, split into) #15763, #15767, #15810, #15907, #15918, #16369"
REF_REMOVAL_GUIDE = ("docs/source/legacy/tensorrt-backend-removal.md (PR #15767; "
                     "https://nvidia.github.io/TensorRT-LLM/legacy/tensorrt-backend-removal.html)")
# The LLM API Triton model (PyTorch backend): `triton_backend/all_models/llmapi/tensorrt_llm/{config.pbtxt,1/model.py,
# 1/model.yaml}`. model.py passes every model.yaml key but `triton_config` to LLM() through
# update_llm_args_with_extra_dict, and reads triton_config["decoupled"], ["max_batch_size"] (required) and
# ["cancellation_check_period_ms"] (optional). Kept by #15907; tensorrtllm_backend #858 (f526fc5, 2026-07-07) makes it
# the only documented Triton path.
REF_LLMAPI_TRITON = ("NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/1/model.py@"
                     "044a90d209e380c95e23e8ae42f3583fa05ada78 (get_model_config, auto_complete_config, initialize)")
REF_LLMAPI_YAML = ("NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/1/model.yaml@"
                   "0ebb1536ac12bbe27201185de960df3ab00bcecc")
REF_LLMAPI_PBTXT = ("NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt@"
                    "0a71057313ec0626527e164a8fc0205c5822e2f5 (backend \"python\", no ${} keys)")
REF_LLMAPI_DOCS = "tensorrtllm_backend docs/llmapi.md@7777c28; README.md@f526fc5 (#858)"
# Speculative decoding on the PyTorch backend (`speculative_config`, a DecodingBaseConfig subclass picked by its
# `decoding_type`). The field names moved: the 1.0.0 example writes EagleDecodingConfig(max_draft_len=,
# speculative_model_dir=, eagle3_one_model=) for an EAGLE 3 draft, MTPDecodingConfig(num_nextn_predict_layers=) and
# imports NGramDecodingConfig; the 1.3 examples (1.3.0rc15, rc24, rc27) write Eagle3DecodingConfig(max_draft_len=,
# speculative_model=, eagle3_one_model=), and the 1.3.0rc17 / 1.4 feature pages DraftTargetDecodingConfig(
# max_draft_len=, speculative_model=). NVIDIA's templates write speculative_config.decoding_type with MTP's
# num_nextn_predict_layers from 1.0.0 to 1.3.0rc23, and `speculative_model_dir` under decoding_type Eagle in 1.0.0rc6,
# 1.0.0 and 1.1.0rc1 (the later ones drop that block).
REF_SPEC_EXAMPLE_100 = ("docs 1.0.0/examples/llm_speculative_decoding.html (EagleDecodingConfig(max_draft_len=, "
                        "speculative_model_dir=, eagle3_one_model=True) for an EAGLE 3 draft; "
                        "MTPDecodingConfig(num_nextn_predict_layers=); NGramDecodingConfig)")
REF_SPEC_EXAMPLE_13 = ("docs 1.3.0rc15 and 1.3.0rc24/examples/llm_speculative_decoding.html (Eagle3DecodingConfig("
                       "max_draft_len=, speculative_model=, eagle3_one_model=True); MTPDecodingConfig; "
                       "NGramDecodingConfig)")
REF_SPEC_FEATURE_13 = ("docs 1.3.0rc17/features/speculative-decoding.html (DraftTargetDecodingConfig(max_draft_len=, "
                       "speculative_model=); the draft and target must share the tokenizer)")
REF_SPEC_14 = ("docs 1.4.0rc1 and 1.4.0rc4/features/speculative-decoding.html (DraftTargetDecodingConfig("
               "max_draft_len=, speculative_model=)); docs 1.4.0rc4/llm-api/reference/"
               "{Eagle3,MTP,NGram}DecodingConfig.html "
               "(decoding_type Eagle3 / MTP / NGram; max_draft_len, speculative_model, num_nextn_predict_layers, "
               "max_matching_ngram_size; no eagle3_one_model in Eagle3DecodingConfig's signature)")
REF_SPEC_CLASSES = ("tensorrt_llm/llmapi/llm_args.py@fcd3f31682808ae56118ae43c1d7864a3a945e6f "
                    "(validate_speculative_config: EagleDecodingConfig.eagle3_one_model, NGramDecodingConfig."
                    "max_matching_ngram_size, DraftTargetDecodingConfig for the pytorch backend only, "
                    "MTPDecodingConfig.num_nextn_predict_layers)")
REF_SPEC_AIC = ref_aic("1.0.0", "1.3.0rc23") + " (speculative_config.decoding_type; MTP num_nextn_predict_layers)"
REF_SPEC_AIC_EAGLE = ref_aic("1.0.0rc6", "1.0.0", "1.1.0rc1") + " (decoding_type Eagle: speculative_model_dir)"
# One-model (the draft a submodule of the target) and two-model implementations per algorithm and model family.
# A pre-quantized source (ModelOpt's unified HF export) runs as it is on the PyTorch backend: nothing is emitted for
# it (no hf_ptq.py run, no YAML key), the checkpoint's own files carry its quantization (lanes/trtllm.py
# `prequantized_passthrough`, inputs/quantized_source.py).
REF_PREQUANTIZED = ("docs 1.0.0 features/quantization.html 'Running Pre-quantized Models' (\"TensorRT LLM can directly "
                    "run pre-quantized models generated with the NVIDIA TensorRT Model Optimizer\"); "
                    "tensorrt_llm/_torch/model_config.py@008e0af8980fc560003631ba4ac37828836a91c8 "
                    "(ModelConfig.from_pretrained: hf_quant_config.json, \"quantized ckpt in modelopt format\", "
                    "authoritative over an inline quantization_config; an inline ModelOpt quantization_config through "
                    "load_hf_quant_config → is_modelopt_quant_config); facts §1 (QuantConfig \"for pytorch backend is "
                    "ignored. You can load quantized model with hf_quant_config.json directly\")")
REF_SPEC_MODELS = ("docs features/speculative-decoding.html (one-model: EAGLE 3 on Llama 4 Maverick, MTP on "
                   "DeepSeek V3/R1; two-model: EAGLE 3 on Llama 4 Maverick, Llama 3.1 8B, Llama 3.3 70B, "
                   "draft/target and NGram on all models)")
# LoRA adapters (model.adapters, adapter_mode serve): lane trtllm writes `lora_config` (enginefoundry/lanes/lora.py).
# LoraConfig's fields (lora_dir, lora_ckpt_source hf|nemo, max_lora_rank = 64, lora_target_modules,
# trtllm_modules_to_hf_modules, max_loras, max_cpu_loras) and the default TensorRT-LLM → HF module map.
REF_LORA_CONFIG = "NVIDIA/TensorRT-LLM tensorrt_llm/lora_helper.py@037d4ba10931fbb9777d52fba06a9aef4b41acdd"
REF_LORA_DOCS = ("docs 1.3.0rc18 features/lora.html (also 1.3.0rc20, 1.3.0rc24: the sections \"TRTLLM serve with "
                 "LoRA\", \"TRTLLM bench with LoRA\")")
# The feature page's YAML: `lora_config` under --extra_llm_api_options for trtllm-serve (lora_target_modules,
# max_lora_rank) and trtllm-bench (lora_dir, max_lora_rank, max_loras, max_cpu_loras); the client picks the adapter
# per request with the body's `lora_request` {lora_name, lora_int_id, lora_path}, `model` the base's.
REF_LORA_SERVE_DOC = ("NVIDIA/TensorRT-LLM docs/source/features/lora.md@050db34bb1eee1013388d225b9898b39edea6870 "
                      "(\"TRTLLM serve with LoRA\": lora_config, extra_body lora_request {lora_name, lora_int_id, "
                      "lora_path}; \"TRTLLM bench with LoRA\": lora_dir, max_lora_rank, max_loras, max_cpu_loras)")
REF_LORA_REQUEST = ("NVIDIA/TensorRT-LLM tensorrt_llm/serve/openai_protocol.py@"
                    "0076e9390e1ed11515f149eec356f5a03f4a00d8 "
                    "(ChatCompletionRequest.lora_request: Optional[LoRARequest], from tensorrt_llm.executor.request)")
REF_LORA_14 = ("docs 1.4.0rc4 features/lora.html (the same sections); docs llm-api/reference/LoraConfig.html "
               "(tensorrt_llm.llmapi.LoraConfig: lora_dir, lora_ckpt_source Literal['hf', 'nemo'], max_lora_rank, "
               "max_loras, max_cpu_loras)")
LORA_SINCE = "1.3"  # the first release whose docs show the PyTorch backend's lora_config (1.3.0rc18)


PRESENT, ABSENT, TO_BE_PROBED = "present", "absent", "to be probed"


@dataclass(frozen=True)
class Flag:
    """One flag, YAML key, env var or choice value, with the releases that have it and the evidence.

    `since`/`until` are release series of the package named by `versioned_by` (TensorRT-LLM, or ModelOpt for
    hf_ptq.py). `value` set: the entry is one choice of flag `name` (e.g. trtllm-serve --backend trt)."""

    tool: str
    name: str
    since: str = FLOOR
    until: str | None = None
    refs: tuple[str, ...] = ()
    note: str = ""
    versioned_by: str = TENSORRT_LLM
    value: str | None = None
    checked: str = CHECKED

    @property
    def key(self) -> str:
        return f"{self.name}={self.value}" if self.value is not None else self.name

    def exists_in(self, version: str) -> bool:
        """Whether `version` may have it: present, or to be probed (`status`)."""
        return self.status(version) != ABSENT

    def status(self, version: str) -> str:
        """PRESENT, ABSENT, or TO_BE_PROBED: a release after the evidence (`checked`) of an entry that was never
        removed. A removal is evidence for every later release (the files are gone); presence is not."""
        parsed = parse_version(version)
        v = parsed.release
        if v < parse_version(self.since).release:
            return ABSENT
        if self.until is not None:
            until = parse_version(self.until).release
            depth = len(self.until.split("."))
            return PRESENT if v[:depth] <= until[:depth] else ABSENT
        if self.versioned_by == TENSORRT_LLM and parsed.sort_key > parse_version(self.checked).sort_key:
            return TO_BE_PROBED
        return PRESENT


class _FlagFields(TypedDict, total=False):
    """The fields of `Flag` one `_flags` call gives every name it lists."""

    since: str
    until: str | None
    refs: tuple[str, ...]
    note: str
    versioned_by: str
    value: str | None
    checked: str


def _flags(tool: str, names: str, **kw: Unpack[_FlagFields]) -> list[Flag]:
    return [Flag(tool, n, **kw) for n in names.split()]


class _Until(TypedDict):
    until: str | None


_ENGINE: _Until = {"until": ENGINE_LAST}

EMITTED: tuple[Flag, ...] = (
    # trtllm-build [§4]: the tool exists 1.0 – 1.2.x; removed on main by #15918.
    *_flags(TRTLLM_BUILD, "checkpoint_dir output_dir max_batch_size max_input_len max_seq_len max_num_tokens "
            "max_beam_width input_timing_cache", **_ENGINE, refs=(REF_BUILD, REF_ENGINE_REMOVED)),
    *_flags(TRTLLM_BUILD, "gemm_plugin gpt_attention_plugin remove_input_padding use_paged_context_fmha "
            "use_fused_mlp multiple_profiles tokens_per_block", **_ENGINE,
            refs=(REF_PLUGIN, REF_BUILD, REF_ENGINE_REMOVED)),
    # 0.13 deprecated --paged_kv_cache in favour of --kv_cache_type (#2201).
    Flag(TRTLLM_BUILD, "kv_cache_type", since="0.13", **_ENGINE, refs=("#2201", REF_BUILD, REF_ENGINE_REMOVED)),
    # Default `model.cache` is relative and written into the CWD by rank 0: always pass an explicit path.
    Flag(TRTLLM_BUILD, "output_timing_cache", **_ENGINE, refs=(REF_BUILD, "facts §12"),
         note="default model.cache in the CWD"),
    # Capped at run time: workers = min(torch.cuda.device_count(), --workers).
    Flag(TRTLLM_BUILD, "workers", **_ENGINE, refs=(REF_BUILD, "facts §12"), note="capped to the visible GPU count"),
    # convert_checkpoint.py (llama) [§3]: plain dtypes, weight-only and INT8 KV. Its --calib_* flags are read only
    # with --smoothquant/--int8_kv_cache, and AWQ/FP8/NVFP4 go through quantize.py (facts §0).
    *_flags(CONVERT, "model_dir output_dir dtype tp_size pp_size workers use_weight_only weight_only_precision "
            "int8_kv_cache calib_dataset calib_size calib_max_seq_length load_by_shard", **_ENGINE,
            refs=(REF_CONVERT, REF_CONVERT_REMOVED)),
    # examples/quantization/quantize.py: ModelOpt PTQ to a TensorRT-LLM checkpoint, then trtllm-build (facts §0).
    *_flags(QUANTIZE, "model_dir output_dir dtype qformat kv_cache_dtype calib_dataset calib_size "
            "calib_max_seq_length tp_size pp_size", **_ENGINE, refs=(REF_QUANTIZE, "facts §0", REF_QUANTIZE_REMOVED)),
    # trtllm-serve [§7]: the command is 0.15+, but 0.18.2 still lacked --extra_llm_api_options: every row starts at
    # the 1.0 floor, where the facts establish it (§7), and the probe of --help decides on the worker.
    *_flags(SERVE, "host port", refs=(REF_SERVE, REF_SERVE_0182, "facts §7", REF_SERVE_14), checked=LINE_14),
    Flag(SERVE, "extra_llm_api_options", refs=(REF_SERVE, REF_SERVE_0182, "facts §7")),
    # Used by the lane trtllm only when the probed --help lacks --extra_llm_api_options (a later rename).
    Flag(SERVE, "config", since="1.2", refs=(REF_SERVE_CONFIG, "facts §1 timeline"),
         note="emitted only when the installed --help has --config and not --extra_llm_api_options"),
    # Used by the engine lane.
    *_flags(SERVE, "backend tokenizer kv_cache_free_gpu_memory_fraction max_batch_size max_num_tokens tp_size "
            "pp_size", refs=(REF_SERVE, REF_SERVE_0182, "facts §7")),
    # --backend values: click.Choice(["pytorch", "trt", "_autodeploy"]) until PR #7829 renamed trt → tensorrt;
    # later serve.py accepts trt as an alias that --help does not list. The lane reads the choices from --help.
    # 0.18.2's only choice was pytorch (the default was the C++ engine path), so `trt` starts at 1.0 too.
    Flag(SERVE, "backend", value="trt", until="1.0", refs=(REF_BACKEND_RENAME, REF_SERVE_0182, "facts §0")),
    Flag(SERVE, "backend", value="tensorrt", since="1.1", **_ENGINE,
         refs=(REF_BACKEND_RENAME, REF_SERVE, "PR #15767 (choice removed with the engine path)")),
    # ModelOpt unified HF export (hf_quant_config.json), versioned with nvidia-modelopt, not TensorRT-LLM.
    *_flags(HF_PTQ, "pyt_ckpt_path qformat kv_cache_qformat calib_size dataset export_path", since="0.0",
            versioned_by=MODELOPT, refs=(REF_HF_PTQ,)),
    Flag(HF_PTQ, "calib_seq", since="0.39", versioned_by=MODELOPT, refs=(REF_HF_PTQ_039, "facts §0")),
    Flag(HF_PTQ, "qformat", value="int8_wo", since="0.39", versioned_by=MODELOPT, refs=(REF_HF_PTQ_039,),
         note="never emitted: the PyTorch backend has no W8A16 (lane trtllm refuses int8_wo)"),
    # Deprecated from 0.37 (hf is the default and forced), still parsed at 0.46.0 and on main: no `until`.
    Flag(HF_PTQ, "export_fmt", since="0.0", versioned_by=MODELOPT, refs=(REF_EXPORT_FMT,),
         note=f"deprecated from {EXPORT_FMT_DEPRECATED} (forced to hf): emitted only for an older or unknown ModelOpt"),
    # Triton fill_template.py takes `-i/--in_place <file> k:v,…` [§10].
    Flag(FILL, "in_place", **_ENGINE, refs=(REF_FILL, REF_TRITON_REMOVED)),
    # launch_triton_server.py: --world_size must equal the engine's tp × pp [§10]. The launcher itself stays in 1.3
    # (#15907) for the LLM API model, started with --model_repo alone (tensorrtllm_backend docs/llmapi.md).
    Flag(LAUNCH_TRITON, "world_size", **_ENGINE, refs=(REF_LAUNCH, REF_TRITON_REMOVED)),
    Flag(LAUNCH_TRITON, "model_repo", refs=(REF_LAUNCH, REF_LAUNCH_KEPT, REF_LLMAPI_DOCS)),
    # The LLM API Triton model's model.yaml: every key but triton_config goes to LLM() (checked as LLM API keys);
    # these are the ones model.py itself reads. The probe reads the installed template's keys.
    *_flags(LLMAPI_TRITON, "model backend triton_config triton_config.max_batch_size triton_config.decoupled",
            refs=(REF_LLMAPI_TRITON, REF_LLMAPI_YAML, "facts §1 (1.0: llmapi + TRT backend in Triton removed, "
                  "PR #5312)")),
    # Autotuner cache: added after the 1.0 branch (PR #7738).
    # Still read on the 1.3 line: seen saving and loading on tensorrt-llm/release:1.3.0rc24 (sparkrun#256, facts §1).
    Flag(ENV, "TLLM_AUTOTUNER_CACHE_PATH", since="1.1",
         refs=(REF_AUTOTUNER, "facts §0, §1", "spark-arena/sparkrun#256 (1.3.0rc24)")),
    # The LLM API YAML is validated upstream with pydantic extra="forbid" [§6]: every key must exist.
    # Every key is in NVIDIA's per-release LLM-API templates (ref_aic) or cites a release-named source besides:
    # test_trtllm_releases checks each key the lane emits against the template of each release they cover.
    *_flags(LLM_API, "tensor_parallel_size pipeline_parallel_size kv_cache_config enable_chunked_prefill",
            refs=(ref_aic("1.0.0", "1.3.0rc23"), REF_LLM_API_14, REF_LLM_API, "facts §6"), checked=LINE_14),
    Flag(LLM_API, "dtype", refs=("docs 0.21.0rc1, 1.1.0rc2.post1 and 1.3.0rc24 llm-api/reference.html, docs 1.4.0rc1 "
                                 "llm-api/reference/LLM.html (LLM(..., dtype: str = 'auto'))", REF_LLM_API_14,
                                 REF_LLM_API), checked=LINE_14),
    *_flags(LLM_API, "kv_cache_config.free_gpu_memory_fraction kv_cache_config.dtype "
            "kv_cache_config.enable_block_reuse cuda_graph_config cuda_graph_config.enable_padding",
            refs=(ref_aic("1.0.0", "1.3.0rc23"), REF_LLM_RUNTIME_100, REF_LLM_API, "facts §6")),
    # Top-level in TorchLlmArgs from 1.0 (docs 1.0.0 llm_runtime example); the 1.0 – 1.2 templates nest them under
    # build_config, the 1.3 templates write them at the top.
    *_flags(LLM_API, "max_batch_size max_num_tokens max_seq_len",
            refs=(REF_LLM_RUNTIME_100, ref_aic("1.3.0rc1", "1.3.0rc23"), REF_LLM_API, "facts §6")),
    Flag(LLM_API, "cuda_graph_config.max_batch_size",
         refs=("docs 1.3.0rc27/llm-api/reference/DecodeCudaGraphConfig.html (BaseCudaGraphConfig fields batch_sizes, "
               "max_batch_size, enable_padding; extra=forbid)", REF_LLM_API, "facts §6"),
         note="not in NVIDIA's templates (they write batch_sizes); no release-named source before 1.3.0rc27: "
              "the probe of CudaGraphConfig decides on the worker"),
    Flag(LLM_API, "kv_cache_config.tokens_per_block", refs=(REF_TOKENS_PER_BLOCK, REF_LLM_API),
         note="emitted only when lane option tokens_per_block is set"),
    # Speculative decoding (spec section `speculative`); emitted only when the spec has one.
    *_flags(LLM_API, "speculative_config speculative_config.decoding_type speculative_config.max_draft_len",
            refs=(REF_SPEC_AIC, REF_SPEC_EXAMPLE_100, REF_SPEC_EXAMPLE_13, REF_SPEC_14), checked=LINE_14),
    Flag(LLM_API, "speculative_config.num_nextn_predict_layers", refs=(REF_SPEC_AIC, REF_SPEC_EXAMPLE_100, REF_SPEC_14),
         checked=LINE_14, note="mtp"),
    Flag(LLM_API, "speculative_config.max_matching_ngram_size", refs=(REF_SPEC_CLASSES, REF_SPEC_14), checked=LINE_14,
         note="ngram, when speculative.max_matching_ngram_size is set"),
    # The draft's folder: speculative_model_dir below 1.3 (the 1.0.0 example, the templates to 1.1.0rc1; later 1.1
    # and 1.2 releases are to be probed), speculative_model from 1.3 (no release-named source writes it earlier).
    Flag(LLM_API, "speculative_config.speculative_model_dir", refs=(REF_SPEC_AIC_EAGLE, REF_SPEC_EXAMPLE_100),
         checked="1.1.0rc1", note="eagle3 below 1.3"),
    Flag(LLM_API, "speculative_config.speculative_model", since="1.3",
         refs=(REF_SPEC_EXAMPLE_13, REF_SPEC_FEATURE_13, REF_SPEC_14), checked=LINE_14,
         note="draft_target / eagle3 from 1.3"),
    Flag(LLM_API, "speculative_config.eagle3_one_model", refs=(REF_SPEC_EXAMPLE_100, REF_SPEC_EXAMPLE_13),
         checked="1.3.0rc15", note="eagle3, when speculative.one_model is set"),
    # decoding_type values, one entry each (the value picks the upstream class).
    Flag(LLM_API, "speculative_config.decoding_type", value="MTP", refs=(REF_SPEC_AIC, REF_SPEC_EXAMPLE_100,
                                                                          REF_SPEC_14), checked=LINE_14),
    Flag(LLM_API, "speculative_config.decoding_type", value="NGram",
         refs=(REF_SPEC_EXAMPLE_100, REF_SPEC_CLASSES, REF_SPEC_14), checked=LINE_14),
    Flag(LLM_API, "speculative_config.decoding_type", value="Eagle",
         refs=(REF_SPEC_AIC_EAGLE, REF_SPEC_EXAMPLE_100), checked="1.1.0rc1",
         note="eagle3 below 1.3 (EagleDecodingConfig with an EAGLE 3 draft, as the 1.0.0 example)"),
    Flag(LLM_API, "speculative_config.decoding_type", value="Eagle3", since="1.3",
         refs=(REF_SPEC_EXAMPLE_13, REF_SPEC_14), checked=LINE_14,
         note="eagle3 from 1.3 (the earliest release-named source read is 1.3.0rc15)"),
    Flag(LLM_API, "speculative_config.decoding_type", value="Draft_Target", since="1.3",
         refs=(REF_SPEC_FEATURE_13, REF_SPEC_14, REF_SPEC_CLASSES), checked=LINE_14,
         note="draft_target; no release-named source before 1.3.0rc17: refused below 1.3"),
    # LoRA adapters served per request (model.adapters, adapter_mode serve): from the first release whose docs show
    # the PyTorch backend's lora_config (1.3.0rc18) to the 1.4.0rc4 docs; earlier releases are refused at validate.
    *_flags(LLM_API, "lora_config lora_config.lora_dir lora_config.max_lora_rank lora_config.max_loras "
            "lora_config.max_cpu_loras lora_config.lora_ckpt_source", since=LORA_SINCE,
            refs=(REF_LORA_DOCS, REF_LORA_SERVE_DOC, REF_LORA_CONFIG, REF_LORA_14), checked=LINE_14,
            note="emitted only for model.adapters in adapter_mode serve; the worker's probe reads LoraConfig's fields"),
    # In every template from 0.20.0 to 1.3.0rc23 (keys.json) and in the 1.4.0rc4 TorchLlmArgs reference.
    *_flags(LLM_API, "moe_expert_parallel_size moe_tensor_parallel_size",
            refs=(ref_aic("1.0.0", "1.3.0rc23"), REF_LLM_API_14, REF_MOE_LLM_ARGS, REF_MAPPING), checked=LINE_14,
            note="emitted only for a variant with moe_ep > 1 or moe_tp (variants[].moe_ep, variants[].moe_tp)"),
    Flag(LLM_API, "enable_attention_dp",
         refs=(ref_aic("1.0.0", "1.3.0rc23"), REF_LLM_API_14, REF_MOE_LLM_ARGS, REF_MAPPING, REF_ADP_ATTENTION),
         checked=LINE_14,
         note="emitted only for a variant with attention_dp: true (needs tp ≥ 2)"),
)

_EMITTED_INDEX = {(f.tool, f.key): f for f in EMITTED}


def flag(tool: str, name: str) -> Flag:
    try:
        return _EMITTED_INDEX[(tool, name)]
    except KeyError:
        raise KeyError(f"{tool} flag '{name}' is not registered in trtllm_flags.EMITTED") from None


def arg(tool: str, name: str) -> str:
    """'--name' for a registered flag of `tool` (KeyError for an unregistered one: register it first)."""
    return "--" + flag(tool, name).name


def emitted_names(tool: str) -> frozenset[str]:
    return frozenset(f.name for f in EMITTED if f.tool == tool and f.value is None)


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


def _notes(release: str) -> str:
    return f"docs/source/release-notes.md {release} (facts §1 timeline)"


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
    Removed("builder_opt", TRTLLM_BUILD, "0.14", "no replacement", (_notes("0.14"),)),
    Removed("builder_force_num_profiles", TRTLLM_BUILD, "0.15",
            "it became the environment variable BUILDER_FORCE_NUM_PROFILES; or set lane option multiple_profiles",
            (_notes("0.15"),)),
    Removed("enable_xqa", TRTLLM_BUILD, "0.16", "no replacement: XQA kernels are picked automatically",
            (_notes("0.16"),)),
    Removed("strongly_typed", TRTLLM_BUILD, "0.11", "no replacement: build.py hard-codes strongly_typed=True",
            (_notes("0.11"),)),
    Removed("weight_only_precision", TRTLLM_BUILD, "0.11",
            "weight-only quantization happens at conversion: set variants[].precision to int8_wo or int4_wo "
            "(convert_checkpoint.py --use_weight_only --weight_only_precision) or int4_awq (quantize.py)",
            (_notes("0.11"),)),
    Removed("use_context_fmha_for_generation", TRTLLM_BUILD, "0.11", "no replacement", (_notes("0.11"),)),
    Removed("attention_qk_half_accumulation", TRTLLM_BUILD, "0.11", "no replacement", (_notes("0.11"),)),
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
    "moe_expert_parallel_size": "variants[].moe_ep",
    "moe_ep_size": "variants[].moe_ep",
    "ep_size": "variants[].moe_ep",
    "moe_tensor_parallel_size": "variants[].moe_tp",
    "moe_tp_size": "variants[].moe_tp",
    "enable_attention_dp": "variants[].attention_dp",
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

ENGINE_INSTALL_HINT = ("Pin tensorrt-llm>=1.0,<1.3 and never install with --pre (that gives a 1.3+ release "
                       "candidate), or use lane trtllm (PyTorch backend).")
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
                "TensorRT engine backend (\"PyTorch is now the sole execution backend\", " + REF_REMOVAL_GUIDE + "; "
                "convert_checkpoint.py #15763, Triton inflight_batcher_llm #15907, trtllm-build and the builder "
                "#15918, C++ engine runtime #16369, engine tests #15810; first proposed as #15760), and which 1.3 "
                "rc first dropped it is not pinned down. Use `lane: trtllm` (the PyTorch backend: a HF or "
                "ModelOpt-quantized checkpoint, the LLM API YAML and the autotuner cache; lane option triton: true "
                "for a Triton model repository), or keep this lane and pin toolchain.trtllm_version: 1.2.1. "
                + ENGINE_INSTALL_HINT)
    return None


# --- what a release implies ---------------------------------------------------------------------------------

# Images whose bundled TensorRT-LLM is known. The NGC TensorRT-LLM release image's tag is the release itself. The
# NGC Triton TRT-LLM images: NVIDIA's Triton release compatibility matrix, container trtllm-python-py3 (the
# "TensorRT-LLM version" column), the only source that says what an image ships. The backend's release branch
# Dockerfile (`ARG TENSORRTLLM_VER` in dockerfile/Dockerfile.triton.trt_llm_backend at r<yy.mm>) is not: at r25.11
# it names 1.2.0rc2 (@9f60afe80a27ea89d890e680faf942ac40a2f36e) where the matrix says the image ships 1.0.3. So the
# 26.01 – 26.07 images, which the matrix read here does not list (it ends at 25.12), are not in this table: their
# release is unknown until the worker's probe reads it (UNVERIFIED_IMAGES, for the docs).
TRITON_MATRIX = ("Triton release compatibility matrix, container trtllm-python-py3 (docs.nvidia.com/deeplearning/"
                 "triton-inference-server/user-guide/docs/introduction/compatibility.html)")
KNOWN_IMAGES: dict[str, tuple[str, str]] = {
    "nvcr.io/nvidia/tritonserver:25.09-trtllm-python-py3": ("1.0.0", f"{TRITON_MATRIX}: 25.09 → 1.0.0"),
    "nvcr.io/nvidia/tritonserver:25.10-trtllm-python-py3": ("1.0.0", f"{TRITON_MATRIX}: 25.10 → 1.0.0"),
    "nvcr.io/nvidia/tritonserver:25.11-trtllm-python-py3":
        ("1.0.3", f"{TRITON_MATRIX}: 25.11 → 1.0.3.2510 (not 1.2.0rc2, which the r25.11 backend Dockerfile names)"),
    "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3":
        ("1.1.0", f"{TRITON_MATRIX}: 25.12 → 1.1.0 (facts §0)"),
}
_BACKEND_DOCKERFILE = "tensorrtllm_backend dockerfile/Dockerfile.triton.trt_llm_backend"
UNVERIFIED_IMAGES: dict[str, str] = {
    f"nvcr.io/nvidia/tritonserver:{tag}-trtllm-python-py3": claim for tag, claim in (
        ("26.01", f"{_BACKEND_DOCKERFILE}@5b0830fc388c (r26.01) names 1.1.0"),
        ("26.02", f"{_BACKEND_DOCKERFILE}@47c80a359531 (r26.02) names 1.1.0"),
        ("26.03", f"{_BACKEND_DOCKERFILE}@9736c4df0f5b (r26.03) names 1.2.0rc8"),
        ("26.04", f"{_BACKEND_DOCKERFILE}@ce68ff5fd0a7 (r26.04) names 1.2.1 (tensorrtllm_backend #853)"),
        ("26.05", f"{_BACKEND_DOCKERFILE}@a4f2f549f22f (r26.05) names 1.2.1"),
        ("26.06", f"{_BACKEND_DOCKERFILE}@e1611ce8612a (r26.06) names 1.2.1"),
        ("26.07", f"{_BACKEND_DOCKERFILE}@3bc115373ce1 (r26.07) names 1.2.1"),
    )
}
_RELEASE_IMAGE = re.compile(r"^nvcr\.io/nvidia/tensorrt-llm/release:v?(\d+\.\d+\.\d+\S*)$")
# A build of TensorRT-LLM's `tritonrelease` docker stage: the release with tritonserver and the LLM API Triton
# backend. `make -C docker tritonrelease_build` (tensorrtllm_backend docs/build.md@dc3bfecb16a3; the stage's image
# fixed by TensorRT-LLM PRs #7003 and #7157) tags it $(IMAGE_NAME)/$(STAGE):$(IMAGE_TAG) (docker/Makefile@14e801da3632,
# IMAGE_NAME tensorrt_llm): `<registry>/tensorrt_llm/tritonrelease:<release>`, the release as the tag.
_TRITONRELEASE_IMAGE = re.compile(r"^(?:[^\s@:]+(?::\d+)?/)*tritonrelease:v?(\d+\.\d+\.\d+\S*)$")
REF_TRITONRELEASE = ("tensorrtllm_backend docs/build.md@dc3bfecb16a3 (make -C docker tritonrelease_build); "
                     "TensorRT-LLM PRs #7003, #7157 (the tritonbuild/tritonrelease images)")
TRITON_SINCE_REMOVAL = "1.3"  # from here no NGC Triton image is known to ship the release (KNOWN_IMAGES ≤ 1.1.0)


def tritonrelease_image(release: str, registry: str = "<registry>") -> str:
    return f"{registry}/tensorrt_llm/tritonrelease:{release}"


def image_release(image: str | None) -> tuple[str, str] | None:
    """(TensorRT-LLM release, source) an image is known to ship, or None when this table does not know it."""
    if not image:
        return None
    ref = image.split("@", 1)[0]
    if ref in KNOWN_IMAGES:
        return KNOWN_IMAGES[ref]
    m = _RELEASE_IMAGE.match(ref)
    if m:
        return m.group(1), "the NGC tensorrt-llm/release image tag names its release"
    m = _TRITONRELEASE_IMAGE.match(ref)
    if m:
        return m.group(1), "a tritonrelease build is tagged with its release (docker/Makefile IMAGE_TAG)"
    return None


def serves_triton(image: str | None) -> bool:
    """Whether the image is known to hold tritonserver with the TensorRT-LLM backend: an NGC Triton TRT-LLM image
    or a tritonrelease build. The NGC tensorrt-llm/release image is the docker `release` stage (docker/README.md:
    "the binaries installed and … examples"), without tritonserver."""
    if not image:
        return False
    ref = image.split("@", 1)[0]
    return ref in KNOWN_IMAGES or ref in UNVERIFIED_IMAGES or bool(_TRITONRELEASE_IMAGE.match(ref))


def same_release(pinned: str, installed: str) -> bool:
    """Whether the installed release satisfies the pin: the same numbers and the same pre-release tag (a pin of
    1.2.0 is not satisfied by 1.2.0rc8; a post or build suffix such as 1.0.3.2510 is the same release)."""
    return parse_version(pinned).same_release(parse_version(installed))


def image_release_problem(pinned: str | None, image: str | None, lane: str | None = None) -> str | None:
    """Why the image cannot run the pinned release. The fix offers only what the lane accepts: pinning the shipped
    release when `lane` runs it, and the release image of the pin."""
    known = image_release(image)
    if not known or not pinned:
        return None
    shipped, source = known
    if same_release(pinned, shipped):
        return None
    fixes = []
    if lane is None or lane_release_problem(lane, shipped) is None:
        fixes.append(f"pin trtllm_version: {shipped}")
    fixes.append(f"use an image that ships {pinned} (nvcr.io/nvidia/tensorrt-llm/release:{pinned})")
    return f"{image} ships TensorRT-LLM {shipped} ({source}), not the pinned {pinned}: " + ", or ".join(fixes)


def triton_image_problem(pinned: str | None, image: str | None) -> str | None:
    """lane trtllm with lane option triton on TensorRT-LLM ≥ 1.3: the spec's image must hold tritonserver and the
    pinned release. No NGC Triton image is known to ship a 1.3+ release (the trtllm-python-py3 images in the
    matrix ship ≤ 1.1.0) and the tensorrt-llm/release image has no tritonserver, so the image is a tritonrelease
    build of the pinned release."""
    if not pinned or parse_version(pinned).release[:2] < parse_version(TRITON_SINCE_REMOVAL).release[:2]:
        return None
    known = image_release(image)
    if serves_triton(image) and known is not None and same_release(pinned, known[0]):
        return None
    have = f"toolchain.image {image}" if image else "no toolchain.image"
    return (f"triton: true on TensorRT-LLM {pinned} needs an image with tritonserver and the release's LLM API "
            f"Triton backend, and the spec has {have}: no NGC tritonserver trtllm image is known to ship {pinned} "
            "(the compatibility matrix's trtllm-python-py3 images ship ≤ 1.1.0) and nvcr.io/nvidia/tensorrt-llm/"
            f"release has no tritonserver. Build the release's tritonrelease stage (at TensorRT-LLM v{pinned}: "
            f"make -C docker tritonrelease_build IMAGE_TAG={pinned}; {REF_TRITONRELEASE}) and set toolchain.image: "
            f"{tritonrelease_image(pinned)}, or set lane option triton: false")


# nvidia-modelopt that a TensorRT-LLM release's requirements.txt pins, by the releases that pinned it. Used only to
# render `plan` before the worker's probe reads the installed ModelOpt. A release outside every range renders with
# the ModelOpt version unknown: only the hf_ptq.py flags every ModelOpt has, and the worker's probe of the installed
# nvidia-modelopt decides (never "ModelOpt 0.0"). PR #16829 ("drop onnx/modelopt deps", merged 2026-07-24) removed
# nvidia-modelopt from requirements.txt; main was labelled 1.3.0rc23 from 2026-07-22 (PR #16758) and 1.3.0rc24 from
# 2026-07-30 (PR #17070), so rc22 is the last rc cut before it, rc23 may or may not have it, and rc24 on have no
# pin. The 1.3 pin was read from copies of the tree at 1.3.0rc11 (README badge release-1.3.0rc11) and in NeMo-RL's
# build notes for 1.3.0rc15, both nvidia-modelopt[torch]~=0.37.0, as release/1.2 pins it.
MODELOPT_PINS: dict[tuple[str, str], tuple[str, str]] = {
    ("1.2.0rc0", "1.2.99"): ("0.37.0", "TensorRT-LLM release/1.2 requirements.txt: nvidia-modelopt[torch]~=0.37.0 "
                                       "(facts §0)"),
    ("1.3.0rc0", "1.3.0rc22"): ("0.37.0", "TensorRT-LLM requirements.txt at 1.3.0rc11 (a copy of main, README badge "
                                          "release-1.3.0rc11) and NeMo-RL's notes on 1.3.0rc15: nvidia-modelopt[torch]"
                                          "~=0.37.0, until PR #16829 (2026-07-24) dropped the dependency after the "
                                          "1.3.0rc22 cut; 1.3.0rc23 on: no pin, the worker's probe decides"),
}


def assumed_modelopt(trtllm_version: str | None) -> str | None:
    """The ModelOpt a release pins, or None when no recorded pin covers it (the probe decides)."""
    if trtllm_version:
        key = parse_version(trtllm_version).sort_key
        for (low, high), (modelopt, _source) in MODELOPT_PINS.items():
            if parse_version(low).sort_key <= key <= parse_version(high).sort_key:
                return modelopt
    return None


def serve_backend_value(version: str | None = None, choices: list[str] | None = None) -> str:
    """trtllm-serve --backend value for a TensorRT engine: from the probed --help choices when known, else from
    the release (trt in 1.0.x, tensorrt after PR #7829). Unknown release: tensorrt (every 1.1+ accepts it)."""
    if choices:
        for value in ("tensorrt", "trt"):
            if value in choices:
                return value
    if version and flag(SERVE, "backend=trt").exists_in(version):
        return "trt"
    return "tensorrt"


def has(tool: str, key: str, version: str | None) -> bool:
    """Whether `version` may have a registered entry: an unknown version, or one after the entry's evidence, counts
    as having it (the probe decides)."""
    return version is None or flag(tool, key).exists_in(version)


class RegistryVerdict(NamedTuple):
    """What the registry says of a unit's commands for one release, before any probe."""

    absent: list[str]  # items the release lacks (evidence says so): refused at `plan`
    to_be_probed: list[str]  # items with no evidence for the release: the worker's probe decides


def _command_items(cmd: ToolUse) -> list[tuple[Flag, str]]:
    """(registry entry, how to name it) for every registered item a command uses."""
    out: list[tuple[Flag, str]] = []
    tool = cmd.tool
    argv = list(cmd.argv)
    if tool:
        for i, tok in enumerate(argv):
            if not tok.startswith("--"):
                continue
            name = tok[2:].split("=", 1)[0].replace("-", "_")
            value = argv[i + 1] if i + 1 < len(argv) else None
            entry = _EMITTED_INDEX.get((tool, name))
            choice = _EMITTED_INDEX.get((tool, f"{name}={value}"))
            if entry is not None:
                out.append((entry, f"{tool} --{name}"))
            if choice is not None:
                out.append((choice, f"{tool} --{name} {value}"))
    for key in cmd.llm_api_keys:
        entry = _EMITTED_INDEX.get((LLM_API, key))
        if entry is not None:
            out.append((entry, f"LLM API option {key}"))
    for key in cmd.env:
        entry = _EMITTED_INDEX.get((ENV, key))
        if entry is not None:
            out.append((entry, f"environment variable {key}"))
    for template, keys in cmd.template_keys.items():
        for key in keys:
            entry = _EMITTED_INDEX.get((LLMAPI_TRITON, key)) if template.startswith("llmapi/") else None
            if entry is not None:
                out.append((entry, f"Triton model.yaml key {key}"))
    return out


def registry_verdict(commands: Sequence[ToolUse], version: str) -> RegistryVerdict:
    """The registry's word on every item of `commands` for TensorRT-LLM `version` (ModelOpt-versioned items are
    judged against ModelOpt, by the lane)."""
    absent: list[str] = []
    unprobed: list[str] = []
    for cmd in commands:
        for entry, label in _command_items(cmd):
            if entry.versioned_by != TENSORRT_LLM:
                continue
            status = entry.status(version)
            bucket = absent if status == ABSENT else unprobed if status == TO_BE_PROBED else None
            if bucket is not None and label not in bucket:
                bucket.append(label)
    return RegistryVerdict(absent, unprobed)


def unsupported_env(commands: Sequence[ToolUse], version: str | None) -> list[str]:
    """Registered environment variables the commands set that `version` does not read (env vars have no --help
    to probe: the registry's release range decides)."""
    out = []
    for cmd in commands:
        for key in cmd.env:
            entry = _EMITTED_INDEX.get((ENV, key))
            if entry is not None and version and not entry.exists_in(version):
                out.append(key)
    return sorted(set(out))


# --- LLM API YAML keys (pydantic extra="forbid" upstream) -------------------------------------------------------

# the nested configs written
NESTED_LLM_API = ("kv_cache_config", "cuda_graph_config", "speculative_config", "lora_config")
CHOICE_KEYS = ("speculative_config.decoding_type",)  # keys whose value picks an upstream class: registered per value


def llm_api_key_paths(data: Mapping[str, object], prefix: str = "") -> list[str]:
    """Dotted key paths of a runtime YAML, descending into the nested configs enginefoundry writes; a key whose
    value is registered per value (decoding_type) also gives `key=value`."""
    paths = []
    for k, v in data.items():
        path = f"{prefix}{k}"
        paths.append(path)
        if path in CHOICE_KEYS:
            paths.append(f"{path}={v}")
        if isinstance(v, Mapping) and path in NESTED_LLM_API:
            paths.extend(llm_api_key_paths(v, prefix=path + "."))
    return paths


def unknown_llm_api_keys(data: TrtllmConfig) -> list[str]:
    """Keys TensorRT-LLM would reject (or that are not registered here)."""
    known = {f.key for f in EMITTED if f.tool == LLM_API}
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
        "xgrammar_tokenizer_info_path", "enable_trt_overlap",
    )),
    "preprocessing": frozenset((
        "triton_max_batch_size", "tokenizer_dir", "preprocessing_instance_count",
        "max_queue_delay_microseconds", "max_queue_size", "add_special_tokens", "multimodal_model_path",
        "engine_dir", "max_num_images", "hf_model_path",
    )),
    "postprocessing": frozenset((
        "triton_max_batch_size", "tokenizer_dir", "postprocessing_instance_count", "skip_special_tokens",
    )),
    "ensemble": frozenset((
        "triton_max_batch_size", "logits_datatype",
    )),
    "tensorrt_llm_bls": frozenset((
        "triton_max_batch_size", "decoupled_mode", "bls_instance_count", "logits_datatype",
        "prompt_embedding_table_data_type", "accumulate_tokens", "tensorrt_llm_model_name",
        "tensorrt_llm_draft_model_name", "multimodal_encoders_name",
    )),
}
# `${prompt_embedding_table_data_type}` (tensorrt_llm and tensorrt_llm_bls) is a data_type: unfilled, Triton rejects
# the config. The backend's docs/llama.md fills it for both from its 1.1 branches on (tensorrtllm_backend
# docs/llama.md@5419275f0e98, r25.12, templates of TensorRT-LLM release/1.1; @9736c4df0f5b, r26.03, release/1.2), not
# on its 1.0 branch (@2ee1ae5e7b54, r25.09); fill_template.py asserts every given key exists, so it is filled only
# where the template has it.
PROMPT_TABLE_KEY = "prompt_embedding_table_data_type"
PROMPT_TABLE_SINCE = "1.1"
