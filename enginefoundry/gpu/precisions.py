"""Dtypes by precision: what torch dtype a variant computes in, and how many bytes its KV cache takes. The
precision → torch dtype column is the catalog's (enginefoundry/catalog/precisions.py `torch_dtype`)."""

from __future__ import annotations

from typing import Protocol

from enginefoundry.catalog.precisions import PRECISIONS
from enginefoundry.spec import KVCacheDtype, Precision

# variants[].precision → torch dtype name, for the unquantized precisions (the catalog's column).
TORCH_DTYPE: dict[Precision, str] = {p: row.torch_dtype for p, row in PRECISIONS.items() if row.torch_dtype}
# torch dtype name → the short name the smoke gate's references and policies use (fp32, fp16, bf16).
SHORT_DTYPE: dict[str, str] = {torch_name: precision.value for precision, torch_name in TORCH_DTYPE.items()}
TORCH_BYTES: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1}
# The smoke gate's log-prob spread (smoke/reference.compute_spread): a reference's weights, rounded to its dtype,
# run again in wider arithmetic.
SPREAD_DTYPE: dict[str, str] = {"fp32": "float64", "bf16": "float32", "fp16": "float32"}
# A KV cache of the model's own dtype, by torch dtype name.
SAME_KV_DTYPE: dict[str, KVCacheDtype] = {"float16": KVCacheDtype.FP16, "bfloat16": KVCacheDtype.BF16}
KV_BYTES: dict[KVCacheDtype, int] = {KVCacheDtype.FP8: 1, KVCacheDtype.INT8: 1, KVCacheDtype.FP16: 2,
                                     KVCacheDtype.BF16: 2}


class HasDtype(Protocol):
    dtype: str | None


def activation_dtype(precision: Precision, shape: HasDtype | None, override: str | None = None) -> str | None:
    """torch dtype name the model computes in: the variant's for fp16/bf16/fp32, else the checkpoint's."""
    if precision in TORCH_DTYPE:
        return TORCH_DTYPE[precision]
    if override:
        return override
    if shape and shape.dtype in ("float16", "bfloat16"):
        return shape.dtype
    if shape and shape.dtype == "float32":
        return "float16"  # convert_checkpoint turns fp32 sources into fp16 (facts §3)
    return None
