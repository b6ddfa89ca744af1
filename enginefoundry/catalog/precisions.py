"""One row per precision: everything the pipeline's layers know about `variants[].precision`.

The spec validates against `Precision`; the gate reads `family` and `rank`; planning `weight_bytes`; the lanes
`min_cc`, `qformat` and `weight_only`; the predictor `gemm_mode`; the dtype map `torch_dtype`. A consumer reads its
column here and keeps no table of its own (tests/unit/test_catalog.py: every value has a complete row, and a row
added here reaches spec validation, planning and the gate with no other edit).

Pure data: this module imports nothing from enginefoundry.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Precision(StrEnum):
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"
    NVFP4 = "nvfp4"
    INT4_AWQ = "int4_awq"
    INT8_WO = "int8_wo"
    INT4_WO = "int4_wo"

    @property
    def row(self) -> PrecisionRow:
        return precision_row(self)

    @property
    def is_quantized(self) -> bool:
        return self.row.torch_dtype is None

    @property
    def rank(self) -> int:
        """Higher is more precise, by the gate's precision families: fp32 3 > bf16, fp16 2 > fp8, int8_wo 1 >
        int4_awq, int4_wo, nvfp4 0. A sibling reference must rank higher."""
        return self.row.rank


class PrecisionFamily(StrEnum):
    """The accuracy gate's families: precisions whose rounding costs about the same accuracy share one policy."""

    FULL = "full"  # fp32
    HALF = "16-bit"  # bf16, fp16
    EIGHT = "8-bit"  # fp8, int8 weight-only
    FOUR = "4-bit"  # int4 AWQ / weight-only, nvfp4


@dataclass(frozen=True)
class PrecisionRow:
    """One precision. None in an optional column means "does not apply" (e.g. no ModelOpt qformat for fp16)."""

    precision: Precision
    rank: int  # the gate's order: a sibling reference must rank higher (spec/siblings.py)
    family: PrecisionFamily  # the gate's policy family (smoke/policy.py DEFAULT_POLICIES)
    weight_bits: int  # bits a linear layer's weight is stored in
    # Bytes of scale per weight (planning/preflight.py): int4 AWQ/weight-only keep a 16-bit scale per group of 128;
    # NVFP4 an FP8 scale per block of 16 (ModelOpt numerics presets, smoke/fallback.py's sources).
    scale_bytes_per_weight: float
    torch_dtype: str | None  # the torch dtype an unquantized precision computes in; None: quantized
    # The lowest (major, minor) compute capability TensorRT-LLM runs it on (facts §2, §0), and where that is.
    min_cc: tuple[int, int] | None = None
    min_cc_where: str | None = None
    # ModelOpt PTQ --qformat (hf_ptq.py and quantize.py, ModelOpt unified HF export); None: not made by PTQ.
    qformat: str | None = None
    # ModelOpt's quant_algo in a pre-quantized source's hf_quant_config.json (modelopt/torch/export/quant_utils.py,
    # nvidia-modelopt 0.47.0); None: no such export is read as this precision.
    modelopt_quant_algo: str | None = None
    # convert_checkpoint.py --weight_only_precision (TensorRT-LLM's own weight-only quantizer); None: not weight-only
    # through convert_checkpoint.
    weight_only_precision: str | None = None
    # Weights in an integer format with higher-precision activations (builder.py refuses INT8/INT4 on 100 ≤ SM < 120).
    int_weight_only: bool = False
    # AIConfigurator's GEMM quant mode (GEMMQuantMode, aiconfigurator_core/sdk/common.py 0.12.0); None: unmodelled.
    gemm_mode: str | None = None
    # The gate may judge it against the quantization tool's simulated model of the source (smoke/simulated.py).
    simulated: bool = False
    # Offered by a precision refusal's fix hint (most precise first: table order); fp32 never answers a missing kernel.
    suggested: bool = True

    @property
    def weight_bytes(self) -> float:
        """Bytes per weight of a quantized linear layer, scales included."""
        return self.weight_bits / 8 + self.scale_bytes_per_weight


_HOPPER_ADA = "L4/L40S (sm89), H100/H200 (sm90), B200 (sm100)"
_BLACKWELL = "B200/GB200 (sm100) or sm120"

# Table order is the suggestion order of a refusal's fix (most precise first).
PRECISIONS: dict[Precision, PrecisionRow] = {r.precision: r for r in (
    PrecisionRow(Precision.FP32, rank=3, family=PrecisionFamily.FULL, weight_bits=32, scale_bytes_per_weight=0.0,
                 torch_dtype="float32", suggested=False),
    PrecisionRow(Precision.BF16, rank=2, family=PrecisionFamily.HALF, weight_bits=16, scale_bytes_per_weight=0.0,
                 torch_dtype="bfloat16", gemm_mode="bfloat16"),
    PrecisionRow(Precision.FP16, rank=2, family=PrecisionFamily.HALF, weight_bits=16, scale_bytes_per_weight=0.0,
                 torch_dtype="float16", gemm_mode="float16"),
    PrecisionRow(Precision.FP8, rank=1, family=PrecisionFamily.EIGHT, weight_bits=8, scale_bytes_per_weight=0.0,
                 torch_dtype=None, min_cc=(8, 9), min_cc_where=_HOPPER_ADA, qformat="fp8",
                 modelopt_quant_algo="FP8", gemm_mode="fp8"),
    PrecisionRow(Precision.INT8_WO, rank=1, family=PrecisionFamily.EIGHT, weight_bits=8, scale_bytes_per_weight=0.0,
                 torch_dtype=None, modelopt_quant_algo="W8A16", weight_only_precision="int8", int_weight_only=True,
                 gemm_mode="int8_wo", simulated=True),
    # int4_awq is a 4-bit weight-only GEMM with bf16 activations: AIConfigurator's nearest mode is int4_wo.
    PrecisionRow(Precision.INT4_AWQ, rank=0, family=PrecisionFamily.FOUR, weight_bits=4,
                 scale_bytes_per_weight=2 / 128, torch_dtype=None, qformat="int4_awq",
                 modelopt_quant_algo="W4A16_AWQ", int_weight_only=True, gemm_mode="int4_wo", simulated=True),
    PrecisionRow(Precision.INT4_WO, rank=0, family=PrecisionFamily.FOUR, weight_bits=4,
                 scale_bytes_per_weight=2 / 128, torch_dtype=None, weight_only_precision="int4", int_weight_only=True,
                 gemm_mode="int4_wo", simulated=True, suggested=False),
    PrecisionRow(Precision.NVFP4, rank=0, family=PrecisionFamily.FOUR, weight_bits=4, scale_bytes_per_weight=1 / 16,
                 torch_dtype=None, min_cc=(10, 0), min_cc_where=_BLACKWELL, qformat="nvfp4",
                 modelopt_quant_algo="NVFP4", gemm_mode="nvfp4"),
)}


def precision_row(precision: Precision | str) -> PrecisionRow:
    try:
        return PRECISIONS[Precision(precision)]
    except (KeyError, ValueError):
        raise KeyError(f"no precision row for {precision!r}: add it to enginefoundry/catalog/precisions.py") from None


def precisions_where(**columns: object) -> tuple[Precision, ...]:
    """The precisions whose row has each of these column values, in table order."""
    return tuple(p for p, r in PRECISIONS.items() if all(getattr(r, k) == v for k, v in columns.items()))
