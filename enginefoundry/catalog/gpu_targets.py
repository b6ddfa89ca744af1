"""One table of GPU targets: architecture → compute capability, Prefect work pool, node labels, k8s template.

Everything that lists GPU pools is generated from `GPU_TARGETS` by `scripts/gen_targets.py` (deployment.yaml's
`build-unit/<pool>` deployments, the Makefile's POOLS, k8s/base-job-template-<pool>.json and
k8s/helm/values-<pool>.yaml); tests/unit/test_gpu_targets.py fails when one of them drifts, and when an `Arch`
value has no row here.

Node labels are those of NVIDIA GPU Feature Discovery (the NVIDIA device plugin's labeller):
`nvidia.com/gpu.product` is the NVML product name with characters outside `[A-Za-z0-9-_. ]` removed and runs of
spaces written as one `-` (e.g. "NVIDIA H100 80GB HBM3" → `NVIDIA-H100-80GB-HBM3`; a time-sliced GPU gets a
`-SHARED` suffix), `nvidia.com/gpu.compute.major`/`.minor` the compute capability (source:
NVIDIA/k8s-device-plugin internal/lm/resource.go@aaccdfd, `sanitise` and `newArchitectureLabels`). Check a
cluster's spelling with `kubectl get nodes -L nvidia.com/gpu.product` and add products here.

SKU rows (`SKUS`) say what a target's `sku` substring means to the predictor (its AIConfigurator system) and to
the cost step (the shipped $/GPU-hour default).

This module is pure data and text rendering: the Prefect default template it extends is passed in.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# The image a GPU job runs when the spec names none (toolchain.image): a TensorRT-LLM release with this project
# installed (docker/worker.Dockerfile). Its TensorRT-LLM version must be the spec's toolchain.trtllm_version.
DEFAULT_WORKER_IMAGE = "nvcr.io/nvidia/tensorrt-llm/release:1.2.1"
PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"
SHM_SIZE = "32Gi"
# The Prefect worker's own image (it only submits Jobs): the Prefect release this project pins, with
# prefect-kubernetes (the `-kubernetes` image variant of prefecthq/prefect).
PREFECT_WORKER_TAG = "3.9.1-python3.11-kubernetes"


class Arch(StrEnum):
    """GPU architecture by SM version; `cpu` for the reference lane without a GPU. Each value has a row in
    enginefoundry/catalog/gpu_targets.py (compute capability, work pool, node labels); tests/unit/test_catalog.py."""

    CPU = "cpu"
    SM80 = "sm80"
    SM86 = "sm86"
    SM89 = "sm89"
    SM90 = "sm90"
    SM100 = "sm100"
    SM120 = "sm120"

    @property
    def compute_capability(self) -> tuple[int, int] | None:
        return gpu_target(self.value).compute_capability


class GpuTarget(BaseModel):
    """One row: an architecture and everything the cluster needs to place a unit of it."""

    model_config = ConfigDict(frozen=True)

    arch: str = Field(description='the spec\'s `targets[].arch`, e.g. "sm90"; "cpu" for the reference lane')
    compute_capability: tuple[int, int] | None = Field(description="(major, minor); None for cpu")
    pool: str = Field(description="Prefect work pool and the build-unit/<pool> deployment name")
    products: tuple[str, ...] = Field(default=(), description="GFD nvidia.com/gpu.product labels, usual SKU first")

    @property
    def is_gpu(self) -> bool:
        return self.compute_capability is not None

    @property
    def template_file(self) -> str | None:
        """The pool's Kubernetes base job template, relative to the project root (None for cpu: process pool)."""
        return f"k8s/base-job-template-{self.pool}.json" if self.is_gpu else None

    @property
    def helm_values_file(self) -> str | None:
        return f"k8s/helm/values-{self.pool}.yaml" if self.is_gpu else None

    def products_for(self, skus: list[str] | tuple[str, ...]) -> tuple[str, ...]:
        """The products a target with these SKU substrings may land on; all of the arch's when none is given
        or none matches (the unit's own placement check still refuses a wrong GPU, with the reason)."""
        if not skus:
            return self.products
        wanted = [s.strip().lower().replace(" ", "-") for s in skus]
        matching = tuple(p for p in self.products if any(w in p.lower() for w in wanted))
        return matching or self.products


def _gpu(arch: str, major: int, minor: int, *products: str) -> GpuTarget:
    return GpuTarget(arch=arch, compute_capability=(major, minor), pool=f"gpu-{arch}", products=products)


GPU_TARGETS: dict[str, GpuTarget] = {t.arch: t for t in (
    GpuTarget(arch="cpu", compute_capability=None, pool="cpu"),
    _gpu("sm80", 8, 0, "NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-80GB-PCIe",
         "NVIDIA-A100-PCIE-40GB", "NVIDIA-A30"),
    _gpu("sm86", 8, 6, "NVIDIA-A10", "NVIDIA-A10G", "NVIDIA-A40", "NVIDIA-RTX-A6000"),
    _gpu("sm89", 8, 9, "NVIDIA-L40S", "NVIDIA-L40", "NVIDIA-L4"),
    _gpu("sm90", 9, 0, "NVIDIA-H100-80GB-HBM3", "NVIDIA-H200", "NVIDIA-H100-NVL", "NVIDIA-H100-PCIe",
         "NVIDIA-GH200-480GB"),
    _gpu("sm100", 10, 0, "NVIDIA-B200"),
    _gpu("sm120", 12, 0, "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition", "NVIDIA-GeForce-RTX-5090"),
)}


@dataclass(frozen=True)
class Price:
    usd_per_hour: float  # per GPU (or per core on cpu)
    source: str


@dataclass(frozen=True)
class Sku:
    """One GPU product family as `targets[].sku` names it: a case-insensitive substring of the SKU. A consumer takes
    the first row, in table order (most specific first), that matches and has its column."""

    needle: str
    # AIConfigurator's system (aiconfigurator_core/systems/<name>.yaml in 0.12.0); None: no perf database.
    predictor_system: str | None = None
    # The shipped on-demand $/GPU-hour, with where and when it was read (bench/costs.py; search.prices overrides).
    default_price: Price | None = None


MERCATUS = "mercatus-ai.com/blog/cloud-gpu-pricing (May 2026, specialty-cloud tier, midpoint)"
SKUS: tuple[Sku, ...] = (
    Sku("gb300", "gb300"), Sku("gb200", "gb200"), Sku("b300", "b300_sxm"),
    Sku("b200", "b200_sxm", Price(6.03, "spheron.network/blog/nvidia-h200-vs-b200-vs-gb200 (on-demand, 17 Mar 2026)")),
    Sku("h200", "h200_sxm", Price(4.00, MERCATUS + ": H200 SXM5 $3.50–4.50")),
    Sku("h100 pcie", "h100_pcie"),
    Sku("h100", "h100_sxm", Price(3.00, MERCATUS + ": H100 SXM5 $2.50–3.50")),
    Sku("a100 pcie", "a100_pcie"),
    Sku("a100", "a100_sxm", Price(1.30, MERCATUS + ": A100 80GB $1.10–1.50")),
    Sku("l40s", "l40s"), Sku("l4", "l4"), Sku("a30", "a30"),
    Sku("rtx pro 6000", "rtx_pro_6000_server"),
)


def gpu_target(arch: str) -> GpuTarget:
    try:
        return GPU_TARGETS[arch]
    except KeyError:
        raise KeyError(f"no GPU target row for arch {arch!r}: add it to enginefoundry/catalog/gpu_targets.py") from None


def pools() -> list[str]:
    """Every work pool, in table order (cpu first)."""
    return [t.pool for t in GPU_TARGETS.values()]


def gpu_pools() -> list[GpuTarget]:
    return [t for t in GPU_TARGETS.values() if t.is_gpu]


# --- generated files ---------------------------------------------------------------------------------------

def job_template(target: GpuTarget,
                 prefect_default: dict[str, Any]) -> dict[str, Any]:  # JSON edge: Prefect's job template
    """The pool's base job template: Prefect's default for the `kubernetes` worker type plus what a GPU build
    needs: the GPU products as a required node affinity and the compute capability as a node selector (a guard
    against a wrong product), an `nvidia.com/gpu` limit (the scheduler then gives each build its own GPUs), the
    NVIDIA taint tolerated, a RAM-backed /dev/shm (NCCL and the TensorRT-LLM executor use shared memory; the
    container default is 64 MiB) and a TensorRT-LLM release image."""
    assert target.compute_capability is not None, f"{target.arch} has no Kubernetes template"
    major, minor = target.compute_capability
    base = copy.deepcopy(prefect_default)
    props = base["variables"]["properties"]
    props["image"].update(default=DEFAULT_WORKER_IMAGE, description=(
        "A TensorRT-LLM release image with enginefoundry installed (docker/worker.Dockerfile); dispatch sets the "
        "spec's toolchain.image (@ its image_digest)"))
    props["gpu_products"] = {
        "title": "GPU products", "type": "array", "items": {"type": "string"}, "default": list(target.products),
        "description": f"Node label {PRODUCT_LABEL} values (GPU Feature Discovery) the job may land on; an "
                       "engine is built for one GPU model, so dispatch narrows this to the target's SKUs"}
    props["gpu_count"] = {"title": "GPUs", "type": "integer", "default": 1, "minimum": 1,
                          "description": f"{GPU_RESOURCE} limit: the unit's tp × pp"}
    props["shm_size"] = {"title": "/dev/shm size", "type": "string", "default": SHM_SIZE,
                         "description": "size limit of the RAM-backed /dev/shm"}
    base["variables"]["description"] = f"Kubernetes job variables for enginefoundry unit builds on pool {target.pool}."

    job = base["job_configuration"]["job_manifest"]
    job["metadata"]["labels"] = "{{ labels }}"
    pod = job["spec"]["template"]["spec"]
    pod["nodeSelector"] = {"nvidia.com/gpu.compute.major": str(major), "nvidia.com/gpu.compute.minor": str(minor)}
    pod["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": PRODUCT_LABEL, "operator": "In", "values": "{{ gpu_products }}"}]}]}}}
    pod["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    pod["volumes"] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "{{ shm_size }}"}}]
    container = pod["containers"][0]
    container["resources"]["limits"][GPU_RESOURCE] = "{{ gpu_count }}"
    container["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    return base


def render_job_template(target: GpuTarget, prefect_default: dict[str, Any]) -> str:  # JSON edge: Prefect's job template
    return json.dumps(job_template(target, prefect_default), indent=2) + "\n"


def render_helm_values(target: GpuTarget) -> str:
    """Values for the `prefect-worker` Helm chart (PrefectHQ/prefect-helm charts/prefect-worker/values.yaml@72dfb57:
    worker.apiConfig, serverApiConfig.apiUrl, config.workPool/type, config.baseJobTemplate.configuration): one
    worker of type kubernetes polling this pool, creating the pool from the committed base job template."""
    assert target.template_file is not None
    return "\n".join([
        "# Generated by scripts/gen_targets.py from enginefoundry/catalog/gpu_targets.py: do not edit.",
        f"#   helm install prefect-worker-{target.pool} prefect/prefect-worker -n prefect \\",
        f"#     -f {target.helm_values_file} \\",
        f"#     --set-file worker.config.baseJobTemplate.configuration={target.template_file}",
        f"fullnameOverride: prefect-worker-{target.pool}",
        "worker:",
        "  image:",
        "    repository: prefecthq/prefect",
        f"    prefectTag: {PREFECT_WORKER_TAG}",
        "  apiConfig: server",
        "  serverApiConfig:",
        "    # the in-cluster Prefect server (prefect-server chart); override with --set for another",
        "    apiUrl: http://prefect-server.prefect.svc.cluster.local:4200/api",
        "  config:",
        f"    workPool: {target.pool}",
        "    type: kubernetes",
        "    # the pool's template comes with --set-file (above); used when the chart creates the pool",
        "    baseJobTemplate:",
        "      configuration: null",
        "  # The worker only submits Jobs (one per unit, with the unit's GPUs); it needs no GPU itself.",
        "  resources:",
        "    requests: {cpu: 100m, memory: 256Mi}",
        "    limits: {cpu: 1000m, memory: 1Gi}",
        "",
    ])


def render_deployments(indent: str = "  ") -> str:
    """The `build-unit/<pool>` deployments of deployment.yaml, one per row (the block between the markers)."""
    lines = []
    for t in GPU_TARGETS.values():
        lines += [f"{indent}- <<: *unit_deployment",
                  f"{indent}  name: {t.pool}",
                  f"{indent}  tags: [enginefoundry, unit, {t.pool}]",
                  f"{indent}  work_pool: {{name: {t.pool}, work_queue_name: default}}"]
    return "\n".join(lines) + "\n"


def render_makefile_pools() -> str:
    return f"POOLS := {' '.join(pools())}\n"


BEGIN = "# BEGIN generated by scripts/gen_targets.py from enginefoundry/catalog/gpu_targets.py: do not edit\n"
END = "# END generated\n"


def replace_block(text: str, block: str, where: str) -> str:
    """`text` with the lines between the BEGIN/END markers replaced by `block`."""
    head, sep, rest = text.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise ValueError(f"{where} lacks the generated-block markers:\n{BEGIN}{END}")
    return head + BEGIN + block + END + tail

