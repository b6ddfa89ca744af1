#!/usr/bin/env python3
"""Write the Kubernetes base job template of each GPU work pool: k8s/base-job-template-<pool>.json.

    .venv/bin/python k8s/make_templates.py          # rewrite the committed files
    .venv/bin/python k8s/make_templates.py --check  # exit 1 when they are out of date

Each template is Prefect's own default for the `kubernetes` worker type (shipped inside the prefect package,
so the variables match what prefect-kubernetes expects) plus what a GPU build needs: a node selector on the
GPU Feature Discovery labels (`nvidia.com/gpu.product`, and the compute capability as a guard), an
`nvidia.com/gpu` limit (the scheduler then gives each build its own GPUs), the NVIDIA taint tolerated, a
RAM-backed /dev/shm (NCCL and the TensorRT-LLM executor use shared memory; the container default is 64 MiB)
and a TensorRT-LLM release image.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TRTLLM_IMAGE = "nvcr.io/nvidia/tensorrt-llm/release:1.2.1"
# pool → (compute capability major, minor, the GPU Feature Discovery product label of the usual SKU)
POOLS: dict[str, tuple[str, str, str]] = {
    "gpu-sm80": ("8", "0", "NVIDIA-A100-SXM4-80GB"),
    "gpu-sm89": ("8", "9", "NVIDIA-L40S"),
    "gpu-sm90": ("9", "0", "NVIDIA-H100-80GB-HBM3"),
    "gpu-sm100": ("10", "0", "NVIDIA-B200"),
}


def prefect_kubernetes_default() -> dict[str, Any]:
    """The base job template `prefect work-pool create --type kubernetes` would use, from prefect's package."""
    import prefect

    path = (Path(prefect.__file__).parent / "server" / "api" / "collections_data" / "views"
            / "aggregate-worker-metadata.json")
    return json.loads(path.read_text())["prefect-kubernetes"]["kubernetes"]["default_base_job_configuration"]


def template(pool: str) -> dict[str, Any]:
    major, minor, product = POOLS[pool]
    base = copy.deepcopy(prefect_kubernetes_default())
    props = base["variables"]["properties"]
    props["image"].update(default=TRTLLM_IMAGE, description=(
        "A TensorRT-LLM release image with enginefoundry installed (k8s/README.md); its TensorRT-LLM version must "
        "be the spec's toolchain.trtllm_version"))
    props["gpu_product"] = {"title": "GPU product", "type": "string", "default": product, "description": (
        "Node label nvidia.com/gpu.product (GPU Feature Discovery) of the GPU model to build on; an engine is "
        "built for one GPU model")}
    props["gpu_count"] = {"title": "GPUs", "type": "integer", "default": 1, "minimum": 1,
                          "description": "nvidia.com/gpu limit: the target's gpu_count (tp × pp)"}
    props["shm_size"] = {"title": "/dev/shm size", "type": "string", "default": "32Gi",
                         "description": "size limit of the RAM-backed /dev/shm"}
    base["variables"]["description"] = f"Kubernetes job variables for enginefoundry unit builds on pool {pool}."

    job = base["job_configuration"]["job_manifest"]
    job["metadata"]["labels"] = "{{ labels }}"
    pod = job["spec"]["template"]["spec"]
    pod["nodeSelector"] = {"nvidia.com/gpu.product": "{{ gpu_product }}",
                           "nvidia.com/gpu.compute.major": major, "nvidia.com/gpu.compute.minor": minor}
    pod["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    pod["volumes"] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "{{ shm_size }}"}}]
    container = pod["containers"][0]
    container["resources"]["limits"]["nvidia.com/gpu"] = "{{ gpu_count }}"
    container["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    return base


def path_of(pool: str) -> Path:
    return HERE / f"base-job-template-{pool}.json"


def render(pool: str) -> str:
    return json.dumps(template(pool), indent=2) + "\n"


def main(argv: list[str]) -> int:
    stale = [p for p in POOLS if not path_of(p).is_file() or path_of(p).read_text() != render(p)]
    if "--check" in argv:
        for pool in stale:
            print(f"{path_of(pool).name} is out of date: run k8s/make_templates.py", file=sys.stderr)
        return 1 if stale else 0
    for pool in POOLS:
        path_of(pool).write_text(render(pool))
        print(f"wrote {path_of(pool).relative_to(HERE.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
