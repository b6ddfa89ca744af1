"""The GPUs of this host and of a target: detection (NVML, nvidia-smi), placement of a unit's ranks on devices,
the devices a process may see, and the precision → dtype map.

Its face (`__all__`): what other packages use of it, loaded on first use (enginefoundry/_face.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from enginefoundry._face import lazy_face

if TYPE_CHECKING:
    from enginefoundry.gpu.detect import GPUInfo, detect_driver, detect_gpus, match_target
    from enginefoundry.gpu.devices import host_facts, torch_device_facts
    from enginefoundry.gpu.placement import check_placement
    from enginefoundry.gpu.precisions import (
        KV_BYTES,
        SAME_KV_DTYPE,
        SHORT_DTYPE,
        SPREAD_DTYPE,
        TORCH_BYTES,
        TORCH_DTYPE,
        activation_dtype,
    )

__all__ = [
    "KV_BYTES",
    "SAME_KV_DTYPE",
    "SHORT_DTYPE",
    "SPREAD_DTYPE",
    "TORCH_BYTES",
    "TORCH_DTYPE",
    "GPUInfo",
    "activation_dtype",
    "check_placement",
    "detect_driver",
    "detect_gpus",
    "host_facts",
    "match_target",
    "torch_device_facts",
]

__getattr__, __dir__ = lazy_face(__name__)
