"""The Kubernetes base job templates of the GPU pools (k8s/, generated from enginefoundry/gpu_targets.py and
checked against it by tests/unit/test_gpu_targets.py): accepted by a real Prefect server as `kubernetes` work
pools. tests/unit/test_cluster_jobs.py renders them into Jobs with prefect-kubernetes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from enginefoundry.gpu_targets import gpu_pools
from tests.cluster_stack import PrefectServer
from tests.conftest import REPO

# The session fixtures (one Prefect server for all cluster tests) live in a plugin, shared by every module.
pytest_plugins = ["tests.cluster_stack"]
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
