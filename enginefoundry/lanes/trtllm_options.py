"""`lane_options` of the two TensorRT-LLM lanes, as pydantic models (strict types, choices as Literals, bounds in
Field, unknown keys refused), plus the hints that turn "unknown key" into what to do instead."""

from __future__ import annotations

import difflib
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from pydantic import Field, ValidationError, field_validator

from enginefoundry.lanes.trtllm_flags import CONVERT, REMOVED, SPEC_FIELDS, TRTLLM_BUILD, emitted_names
from enginefoundry.spec.lane_options import LaneOptions, option_message

TokensPerBlock = Literal[8, 16, 32, 64, 128]
# trtllm-build dtype plugins (facts §4). `disable` for the attention plugin is refused: in-flight batching with a
# paged KV cache and packed input needs it, and builds without it leak host memory (#2690).
GemmPlugin = Literal["auto", "float16", "float32", "bfloat16", "int32", "fp8", "nvfp4", "disable"]
AttentionPlugin = Literal["auto", "float16", "float32", "bfloat16"]


class TrtllmOptionsBase(LaneOptions):
    lane_name: typing.ClassVar[str] = ""

    @classmethod
    def explain_unknown(cls, key: str, pinned: str | None) -> str | None:
        key = key.lstrip("-").replace("-", "_")
        if key in REMOVED:
            return REMOVED[key].message(pinned)
        if key in SPEC_FIELDS:
            return f"not a lane option: set it as {SPEC_FIELDS[key]}"
        if key in cls.model_fields:
            return None
        close = difflib.get_close_matches(key, list(cls.model_fields), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        return f"unknown option for lane {cls.lane_name}{hint}; valid options: {', '.join(sorted(cls.model_fields))}"


class EngineOptions(TrtllmOptionsBase):
    """Lane trtllm-engine: trtllm-build, convert_checkpoint.py / quantize.py and the Triton repository."""

    lane_name: typing.ClassVar[str] = "trtllm-engine"

    gemm_plugin: GemmPlugin = Field("auto", description="trtllm-build --gemm_plugin; auto follows the checkpoint")
    gpt_attention_plugin: AttentionPlugin = Field("auto", description="trtllm-build --gpt_attention_plugin")
    use_paged_context_fmha: bool = Field(True, description="needed for chunked context and KV-cache reuse")
    use_fused_mlp: bool | None = Field(None, description="fused gated MLP (the 1.x default is enable)")
    multiple_profiles: bool | None = Field(None, description="several TensorRT optimisation profiles")
    tokens_per_block: TokensPerBlock | None = Field(None, description="KV-cache block size (1.x default 32)")
    max_beam_width: int = Field(1, ge=1, description="beam width the engine allows")
    build_workers: int | None = Field(None, ge=1, description="cap on parallel rank builds (facts §12)")
    convert_workers: int = Field(1, ge=1, description="threads over ranks in convert_checkpoint.py")
    load_by_shard: bool = Field(False, description="convert_checkpoint.py --load_by_shard (less host memory)")
    dtype: Literal["float16", "bfloat16"] | None = Field(None, description="activation dtype of quantized variants")
    examples_dir: str | None = Field(None, description="examples/ of the installed release ($EF_TRTLLM_EXAMPLES_DIR)")
    triton_dir: str = Field("/app", description="Triton backend tree with all_models/ and tools/")
    triton_bundle_mount: str | None = Field(None, description="where the serving container mounts the bundle")
    triton_decoupled_mode: bool = Field(False, description="streaming (decoupled) Triton models")
    triton_max_queue_delay_microseconds: int = Field(0, ge=0, description="Triton dynamic batching delay")
    triton_batch_scheduler_policy: Literal["max_utilization", "guaranteed_no_evict"] | None = None
    triton_enable_kv_cache_reuse: bool | None = Field(None, description="KV-cache block reuse in Triton")
    triton_instance_count: int = Field(1, ge=1, description="instances of pre/postprocessing and BLS")

    @field_validator("gpt_attention_plugin", mode="before")
    @classmethod
    def _attention_plugin_needed(cls, value: Any) -> Any:
        if value == "disable":
            raise ValueError("cannot be disable: in-flight batching, the paged KV cache and packed input need the "
                             "GPT attention plugin (and #2690: host OOM without it)")
        return value


class TrtllmOptions(TrtllmOptionsBase):
    """Lane trtllm: the LLM API YAML, the warm-up and ModelOpt PTQ."""

    lane_name: typing.ClassVar[str] = "trtllm"

    cuda_graphs: bool = Field(True, description="capture CUDA graphs for decode batches")
    cuda_graph_padding: bool = Field(True, description="pad batches up to the nearest captured size")
    cuda_graph_max_batch_size: int | None = Field(None, ge=1, description="largest captured batch")
    enable_block_reuse: bool | None = Field(None, description="KV-cache block reuse (upstream default true)")
    tokens_per_block: TokensPerBlock | None = Field(None, description="kv_cache_config.tokens_per_block")
    enable_chunked_prefill: bool | None = Field(None, description="default: on when max_input_len > max_num_tokens")
    modelopt_dir: str | None = Field(None, description="Model-Optimizer checkout ($EF_MODELOPT_DIR)")
    warmup_requests: int = Field(8, ge=1, description="requests sent during warm-up (fills the autotuner cache)")
    autotuner_cache: bool = Field(True, description="save the autotuner profiling cache (TensorRT-LLM 1.1+)")
    triton: bool = Field(False, description="also write a Triton model repository (the LLM API model, model.yaml)")
    triton_dir: str = Field("/app", description="Triton backend tree with all_models/llmapi and scripts/")
    triton_bundle_mount: str | None = Field(None, description="where the serving container mounts the bundle")
    triton_decoupled_mode: bool = Field(False, description="streaming (decoupled) Triton model")

    @classmethod
    def explain_unknown(cls, key: str, pinned: str | None) -> str | None:
        name = key.lstrip("-").replace("-", "_")
        engine_only = (name in EngineOptions.model_fields and name not in cls.model_fields) \
            or name in emitted_names(TRTLLM_BUILD) or name in emitted_names(CONVERT)
        if engine_only and name not in REMOVED and name not in SPEC_FIELDS:
            return (f"{name} belongs to the TensorRT engine path (trtllm-build / convert_checkpoint.py); lane trtllm "
                    "runs the PyTorch backend (default since 1.0, PR #5312) and has no engine build: remove it, or "
                    "use lane trtllm-engine")
        return super().explain_unknown(key, pinned)


OPTIONS: dict[str, type[TrtllmOptionsBase]] = {"trtllm": TrtllmOptions, "trtllm-engine": EngineOptions}


def option_problems(model: type[LaneOptions], error: ValidationError, pinned: str | None,
                    prefix: str = "lane_options") -> list[tuple[str, str]]:
    """(field path, message) for every problem pydantic found in a lane's options."""
    out = []
    for err in error.errors():
        path = ".".join([prefix, *(str(p) for p in err["loc"][:1])])
        out.append((path, option_message(model, err, pinned)))
    return out


def validate_lane_options(lane: str, options: Mapping[str, object],
                         pinned: str | None = None) -> list[tuple[str, str]]:
    """Every problem with raw `lane_options` for a TensorRT-LLM lane, as (field path, message)."""
    model = OPTIONS[lane]
    try:
        model.model_validate({str(k).lstrip("-").replace("-", "_"): v for k, v in options.items()})
    except ValidationError as err:
        problems = option_problems(model, err, pinned)
        raw = {str(k).lstrip("-").replace("-", "_"): str(k) for k in options}
        return [(f"lane_options.{raw.get(p.split('.', 1)[1], p.split('.', 1)[1])}", m) for p, m in problems]
    return []


OptionsT = TypeVar("OptionsT", bound=TrtllmOptionsBase)


def typed_options(model: type[OptionsT], options: LaneOptions | Mapping[str, object] | None) -> OptionsT:
    """The lane's options model: the spec's own (typed when the spec was parsed) or one validated from a raw mapping
    (`None`: every default). Lanes read options as its attributes, defaults filled in."""
    if isinstance(options, model):
        return options
    raw = options.given() if isinstance(options, LaneOptions) else dict(options or {})
    return model.model_validate(raw)


def trtllm_options(options: LaneOptions | Mapping[str, object] | None) -> TrtllmOptions:
    return typed_options(TrtllmOptions, options)


def engine_options(options: LaneOptions | Mapping[str, object] | None) -> EngineOptions:
    return typed_options(EngineOptions, options)


def resolve_options(lane: str, options: LaneOptions | Mapping[str, object] | None) -> dict[str, Any]:
    """Every option of the lane, defaults filled in (from a validated model, or a raw mapping)."""
    if isinstance(options, LaneOptions):
        return options.resolved()
    return OPTIONS[lane].model_validate(dict(options or {})).resolved()
