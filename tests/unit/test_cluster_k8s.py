"""The Kubernetes base job templates of the GPU pools (k8s/, generated from enginefoundry/catalog/gpu_targets.py and
checked against it by tests/unit/test_gpu_targets.py) render into the Job a pool asks for.
tests/unit/test_cluster_jobs.py renders them with prefect-kubernetes; a real Prefect server accepting them:
tests/integration/test_k8s_pools_server.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from enginefoundry.catalog.gpu_targets import gpu_pools
from tests.support.paths import REPO

K8S = REPO / "k8s"
PRODUCTS = {t.pool: tuple(str(n) for n in t.compute_capability or ()) for t in gpu_pools()}


def template(pool: str) -> dict[str, Any]:
    return json.loads((K8S / f"base-job-template-{pool}.json").read_text())


@pytest.mark.parametrize("pool", sorted(PRODUCTS))
def test_rendered_job_asks_for_the_pools_gpus(pool: str) -> None:
    from prefect.utilities.templating import apply_values

    base = template(pool)
    defaults = {k: v["default"] for k, v in base["variables"]["properties"].items() if "default" in v}
    job = apply_values(base["job_configuration"], {**defaults, "gpu_count": 2})["job_manifest"]
    pod = job["spec"]["template"]["spec"]
    major, minor = PRODUCTS[pool]
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"][0]["values"] == defaults["gpu_products"]
    assert (pod["nodeSelector"]["nvidia.com/gpu.compute.major"], pod["nodeSelector"]["nvidia.com/gpu.compute.minor"]) \
        == (major, minor)
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert container["image"].startswith("nvcr.io/nvidia/tensorrt-llm/release:")
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}} in pod["volumes"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
