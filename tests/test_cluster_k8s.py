"""The Kubernetes base job templates of the GPU pools (k8s/): up to date with their generator, accepted by a
real Prefect server as `kubernetes` work pools (no prefect-kubernetes needed for that), and rendered into the
Job a kubernetes worker would submit (with prefect-kubernetes, where it is installed)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from tests.cluster_stack import PrefectServer
from tests.conftest import REPO

# The session fixtures (one Prefect server for all cluster tests) live in a plugin, shared by every module.
pytest_plugins = ["tests.cluster_stack"]
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


@pytest.mark.services
def test_prefect_server_accepts_kubernetes_pools(prefect_server: PrefectServer, unique: str, tmp_path: Path) -> None:
    for pool in PRODUCTS:
        name = f"{pool}-k8s-{unique}"
        made = prefect_server.prefect("work-pool", "create", name, "--type", "kubernetes", "--base-job-template",
                                      str(K8S / f"base-job-template-{pool}.json"))
        assert made.returncode == 0, made.stdout + made.stderr
        with prefect_server.client() as http:
            stored = http.get(f"/work_pools/{name}").json()
        assert stored["type"] == "kubernetes"
        assert stored["base_job_template"] == template(pool)
    # The server validates templates: a placeholder without a variable is refused.
    broken = template("gpu-sm90")
    broken["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]["nodeSelector"]["x"] = "{{ nope }}"
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(broken))
    refused = prefect_server.prefect("work-pool", "create", f"broken-{unique}", "--type", "kubernetes",
                                     "--base-job-template", str(path))
    assert refused.returncode != 0
    assert "nope" in refused.stdout + refused.stderr


def test_kubernetes_worker_renders_the_job() -> None:
    worker = pytest.importorskip("prefect_kubernetes.worker", reason="pip install prefect-kubernetes==0.8.0")
    config = asyncio.run(worker.KubernetesWorkerJobConfiguration.from_template_and_values(
        template("gpu-sm90"), {"gpu_product": "NVIDIA-H200", "image": "registry.example/enginefoundry:1.2.1"}))
    pod = config.job_manifest["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert pod["containers"][0]["image"] == "registry.example/enginefoundry:1.2.1"
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert config.job_manifest["kind"] == "Job" and config.namespace == "default"
