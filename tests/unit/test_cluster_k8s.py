"""The Kubernetes base job templates of the GPU pools (k8s/): up to date with their generator and rendered
into the Job a kubernetes worker would submit (with prefect-kubernetes, where it is installed). A real Prefect
server accepting them: tests/integration/test_k8s_pools_server.py."""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import pytest

from tests.support.paths import REPO

K8S = REPO / "k8s"
PRODUCTS = {"gpu-sm80": ("8", "0"), "gpu-sm89": ("8", "9"), "gpu-sm90": ("9", "0"), "gpu-sm100": ("10", "0")}


def generator() -> Any:
    spec = importlib.util.spec_from_file_location("make_templates", K8S / "make_templates.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def template(pool: str) -> dict[str, Any]:
    return json.loads((K8S / f"base-job-template-{pool}.json").read_text())


def test_committed_templates_are_generated_ones() -> None:
    assert generator().main(["--check"]) == 0, "run .venv/bin/python k8s/make_templates.py"
    assert set(generator().POOLS) == set(PRODUCTS)


@pytest.mark.parametrize("pool", sorted(PRODUCTS))
def test_rendered_job_asks_for_the_pools_gpus(pool: str) -> None:
    from prefect.utilities.templating import apply_values

    base = template(pool)
    defaults = {k: v["default"] for k, v in base["variables"]["properties"].items() if "default" in v}
    job = apply_values(base["job_configuration"], {**defaults, "gpu_count": 2})["job_manifest"]
    pod = job["spec"]["template"]["spec"]
    major, minor = PRODUCTS[pool]
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == defaults["gpu_product"]
    assert (pod["nodeSelector"]["nvidia.com/gpu.compute.major"], pod["nodeSelector"]["nvidia.com/gpu.compute.minor"]) \
        == (major, minor)
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert container["image"].startswith("nvcr.io/nvidia/tensorrt-llm/release:")
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}} in pod["volumes"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
