"""Facts about the device a unit is built on, recorded in the manifest and MLflow."""

from __future__ import annotations

import hashlib
import os
import platform

from enginefoundry.schemas.bundle_info import HostFacts, TorchDeviceFacts


def host_facts() -> HostFacts:
    return {
        "hostname_hash": _short_hash(platform.node()),  # identifies the builder without leaking its name
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }


def torch_device_facts(device: str) -> TorchDeviceFacts:
    """What torch sees for `device` ("cpu" or "cuda:N")."""
    import torch

    facts: TorchDeviceFacts = {"device": device, "torch": torch.__version__}
    if device.startswith("cuda"):
        idx = int(device.split(":", 1)[1]) if ":" in device else 0
        props = torch.cuda.get_device_properties(idx)
        major, minor = torch.cuda.get_device_capability(idx)
        facts["gpu_name"] = props.name
        facts["compute_capability"] = f"{major}.{minor}"
        facts["arch"] = f"sm{major}{minor}"
        facts["memory_gib"] = round(props.total_memory / 2**30, 1)
        facts["cuda"] = torch.version.cuda
    return facts


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]
