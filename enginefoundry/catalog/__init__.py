"""The catalog: one row per value of each noun that cuts across the pipeline's layers.

A precision (`precisions.PRECISIONS`), a GPU target and SKU (`gpu_targets.GPU_TARGETS`, `gpu_targets.SKUS`) and a
store URI scheme (`schemes.SCHEMES`) each have one row here; lanes, smoke, search, bench, planning, spec, store and
records read their column and keep no table of their own. Pure data: a foundation package that imports nothing
from enginefoundry (docs/architecture.md#recipes says how to add a row).
"""

from enginefoundry.catalog.gpu_targets import GPU_TARGETS, SKUS, Arch, GpuTarget, Price, Sku, gpu_target
from enginefoundry.catalog.precisions import (
    PRECISIONS,
    Precision,
    PrecisionFamily,
    PrecisionRow,
    precision_row,
    precisions_where,
)
from enginefoundry.catalog.schemes import SCHEMES, SchemeKind, StoreScheme, is_store_uri, scheme_of

__all__ = [
    "GPU_TARGETS", "PRECISIONS", "SCHEMES", "SKUS", "Arch", "GpuTarget", "Precision", "PrecisionFamily",
    "PrecisionRow", "Price", "SchemeKind", "Sku", "StoreScheme", "gpu_target", "is_store_uri", "precision_row",
    "precisions_where", "scheme_of",
]
