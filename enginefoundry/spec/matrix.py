"""What gets built: variants (precision, parallelism) × profiles (shapes) × targets (GPU architectures)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from enginefoundry.catalog import Arch as Arch  # re-exported: the catalog is its home
from enginefoundry.catalog import Precision as Precision
from enginefoundry.catalog import gpu_target


class KVCacheDtype(StrEnum):
    AUTO = "auto"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"
    INT8 = "int8"


class CalibrationSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dataset: str = Field(default="cnn_dailymail", description="Calibration dataset name or local path")
    samples: Annotated[int, Field(ge=16, le=100_000, description="calibration samples")] = 512
    max_seq_length: Annotated[int, Field(ge=64, description="tokens per calibration sample")] = 512


_Count = Annotated[int, Field(ge=1, le=64)]


class Worker(BaseModel):
    """One role of a disaggregated configuration: its worker count, each worker's parallelism and batch size
    (AIConfigurator's ColumnsDisagg (p)… / (d)… columns). dp: attention data parallelism; moe_tp × moe_ep: the MoE
    layers' ranks, which must be the worker's tp × dp (lane trtllm's rule, enginefoundry.lanes.trtllm_disagg)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workers: _Count = Field(description="servers of this role in one replica")
    tp: _Count = Field(description="tensor parallelism of each server (attention tp under attention DP)")
    pp: _Count = 1
    dp: _Count = Field(default=1, description="attention data parallelism of each server")
    moe_tp: _Count = 1
    moe_ep: _Count = 1
    batch_size: Annotated[int, Field(ge=1, le=4096, description="max_batch_size of each server")]

    @property
    def gpus(self) -> int:
        return self.workers * self.tp * self.pp * self.dp

    def label(self) -> str:
        moe = f" etp{self.moe_tp}ep{self.moe_ep}" if self.moe_tp * self.moe_ep > 1 else ""
        dp = f"dp{self.dp}" if self.dp > 1 else ""
        return f"{self.workers}×tp{self.tp}pp{self.pp}{dp}{moe} bs{self.batch_size}"

    def tag(self) -> str:
        """The role in a unit name: `1xtp2b64`, `2xtp1dp4ep4b128`."""
        parts = [f"{self.workers}xtp{self.tp}"]
        parts += [f"{k}{v}" for k, v in (("pp", self.pp), ("dp", self.dp), ("moetp", self.moe_tp),
                                         ("ep", self.moe_ep)) if v > 1]
        return "".join(parts) + f"b{self.batch_size}"


class Disagg(BaseModel):
    """A disaggregated configuration: context (prefill) workers and generation (decode) workers of one replica,
    served by `trtllm-serve disaggregated` (lane trtllm; docs/trtllm-compat.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prefill: Worker = Field(description="the context (prefill) servers")
    decode: Worker = Field(description="the generation (decode) servers")
    # num_total_gpus of a predicted row; unset in a spec: the roles' GPUs (prefill.gpus + decode.gpus)
    total_gpus: Annotated[int, Field(ge=2, le=4096)] | None = Field(
        default=None, description="GPUs of one replica; default the sum over both roles")

    @model_validator(mode="after")
    def _count(self) -> Disagg:
        if self.total_gpus is None:
            object.__setattr__(self, "total_gpus", self.prefill.gpus + self.decode.gpus)
        return self

    @property
    def gpus(self) -> int:
        return self.total_gpus or self.prefill.gpus + self.decode.gpus

    def tag(self) -> str:
        return f"disagg-p{self.prefill.tag()}-d{self.decode.tag()}"


class Variant(BaseModel):
    """One way to convert the checkpoint. Shared by every target that builds it."""

    model_config = ConfigDict(extra="forbid")

    precision: Precision = Field(default=Precision.BF16, description="weights precision; quantized ones "
                                 "(fp8, nvfp4, int4_awq, int8_wo, int4_wo) get a default calibration")
    tp: Annotated[int, Field(ge=1, le=64, description='tensor parallelism: GPUs a layer is split over')] = 1
    pp: Annotated[int, Field(ge=1, le=64, description='pipeline parallelism: stages the layers are split into')] = 1
    # Mixture-of-experts parallelism inside the tp ranks (lane trtllm: moe_expert_parallel_size,
    # moe_tensor_parallel_size, enable_attention_dp). The world-size rules live with the lane (they are TensorRT-LLM's).
    moe_ep: Annotated[int, Field(ge=1, le=64, description="expert parallelism: experts split over this many of "
                                                          "the tp ranks")] = 1
    moe_tp: Annotated[int, Field(ge=1, le=64)] | None = Field(
        default=None, description="tensor parallelism inside each expert; unset: tp / moe_ep")
    attention_dp: bool = Field(default=False, description="attention data parallelism: the tp ranks serve "
                                                           "requests as dp ranks, attention weights replicated")
    kv_cache_dtype: KVCacheDtype = Field(default=KVCacheDtype.AUTO, description="KV cache dtype; auto: the "
                                         "model's")
    calibration: CalibrationSpec | None = Field(default=None, description="quantization calibration; default "
                                                "for a quantized precision: the defaults below")
    disaggregated: Disagg | None = Field(
        default=None, description="serve the unit disaggregated (lane trtllm): context and generation servers, each "
                                  "role with its own parallelism, behind `trtllm-serve disaggregated`; tp, pp and "
                                  "the MoE fields stay unset (each role carries its own)")
    # Restrict this variant to some targets (by name), e.g. fp8 only where the architecture allows it.
    targets: list[str] | None = Field(default=None, description="build this variant only for these targets "
                                      "(by name), e.g. fp8 only where the architecture has it; default all")

    @property
    def name(self) -> str:
        # A disaggregated variant's parallelism is its roles' (its tag); tp and pp stay 1.
        parts = [self.precision.value] + ([] if self.disaggregated else [f"tp{self.tp}"])
        if self.pp > 1:
            parts.append(f"pp{self.pp}")
        if self.moe_ep > 1:
            parts.append(f"ep{self.moe_ep}")
        if self.moe_tp is not None and self.moe_tp != self.tp // self.moe_ep:
            parts.append(f"moetp{self.moe_tp}")
        if self.attention_dp:
            parts.append("adp")
        if self.kv_cache_dtype is not KVCacheDtype.AUTO:
            parts.append(f"kv{self.kv_cache_dtype.value}")
        if self.disaggregated is not None:
            parts.append(self.disaggregated.tag())
        return "-".join(parts)

    @property
    def gpus(self) -> int:
        """GPUs one unit of this variant serves on: tp × pp, or a disaggregated replica's (both roles' workers)."""
        return self.disaggregated.gpus if self.disaggregated is not None else self.tp * self.pp

    @property
    def moe_tp_size(self) -> int:
        """MoE tensor parallelism as TensorRT-LLM resolves it: the given moe_tp, else tp // moe_ep (Mapping)."""
        return self.moe_tp if self.moe_tp is not None else max(1, self.tp // self.moe_ep)

    @property
    def moe_parallel(self) -> bool:
        """Whether any MoE parallel field is set (a lane without MoE parallelism refuses the variant)."""
        return self.moe_ep > 1 or self.moe_tp is not None or self.attention_dp

    def key_json(self) -> dict[str, Any]:  # JSON edge: the variant as unit keys hash it
        """The variant as keys hash it: its fields without the target list, and without the MoE fields where they
        are unset (so a variant written before they existed keeps its key)."""
        data = self.model_dump(mode="json", exclude={"targets"})
        for name in KEY_OPTIONAL:
            if data.get(name) == Variant.model_fields[name].default:
                data.pop(name)
        return data

    @model_validator(mode="after")
    def _calibration_for_quantized(self) -> Variant:
        if self.precision.is_quantized and self.calibration is None:
            self.calibration = CalibrationSpec()
        return self


MOE_FIELDS = ("moe_ep", "moe_tp", "attention_dp")
# Fields a variant written before them hashes without (Variant.key_json): unset, they leave its key as it was.
KEY_OPTIONAL = (*MOE_FIELDS, "disaggregated")


class Profile(BaseModel):
    """Runtime/build shape limits. Two profiles (short/long) is normal."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]*$", max_length=64,
                               description="profile name, part of unit names")] = "default"
    max_batch_size: Annotated[int, Field(ge=1, le=4096, description="requests batched at once")] = 64
    max_input_len: Annotated[int, Field(ge=1, description="longest prompt (tokens); below max_seq_len")] = 2048
    max_seq_len: Annotated[int, Field(ge=2, description="longest sequence: prompt plus output tokens")] = 4096
    max_num_tokens: Annotated[int, Field(ge=1, description="tokens in one forward pass, over the batch")] = 8192
    kv_cache_free_gpu_memory_fraction: Annotated[float, Field(
        gt=0.0, le=0.99, description="share of the GPU memory left after the weights that the KV cache takes")] = 0.8
    paged_kv_cache: bool = Field(default=True, description="paged KV cache (TensorRT engines)")
    remove_input_padding: bool = Field(default=True, description="packed inputs without padding (TensorRT "
                                       "engines)")

    @model_validator(mode="after")
    def _input_shorter_than_sequence(self) -> Profile:
        if self.max_input_len >= self.max_seq_len:
            raise ValueError(
                f"max_input_len ({self.max_input_len}) must be < max_seq_len ({self.max_seq_len}): "
                "max_seq_len counts input plus output tokens"
            )
        return self


class Target(BaseModel):
    """A GPU architecture (and optionally SKU) that gets its own build, on a worker of that kind."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]*$", max_length=64,
                               description="target name, part of unit names and MLflow aliases")]
    arch: Arch
    # Substrings matched case-insensitively against the GPU name, e.g. ["H100", "H200"]. Empty: any SKU of the arch.
    sku: list[str] = Field(default_factory=list, description="GPU name substrings, matched case-insensitively "
                           "(H100 and H200 are both sm90); empty: any GPU of the arch")
    gpu_count: Annotated[int, Field(ge=0, le=64, description="GPUs a unit may use on its worker")] = 1
    memory_gib: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="GPU memory per device, for the VRAM preflight when no GPU is at hand"
    )
    work_pool: str | None = Field(
        default=None,
        description="Prefect work pool; defaults to the arch's pool (enginefoundry/catalog/gpu_targets.py)")

    @property
    def pool(self) -> str:
        if self.work_pool:
            return self.work_pool
        return gpu_target(self.arch.value).pool
