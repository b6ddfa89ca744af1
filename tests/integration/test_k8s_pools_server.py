"""The Kubernetes base job templates of the GPU pools (k8s/) are accepted by a real Prefect server as
`kubernetes` work pools (no prefect-kubernetes needed for that), a broken template is refused, and the Job a
kubernetes worker would submit is rendered from them (prefect-kubernetes starts a temporary Prefect server)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import PrefectServer
from tests.support.paths import REPO

K8S = REPO / "k8s"
PRODUCTS = ("gpu-sm80", "gpu-sm89", "gpu-sm90", "gpu-sm100")


def template(pool: str) -> dict[str, Any]:
    return json.loads((K8S / f"base-job-template-{pool}.json").read_text())


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


def test_kubernetes_worker_renders_the_job(prefect_server: PrefectServer) -> None:
    worker = pytest.importorskip("prefect_kubernetes.worker", reason="pip install prefect-kubernetes==0.8.0")
    from prefect.settings import PREFECT_API_URL, temporary_settings

    # Rendering asks the API (for variables and blocks): the session's server, not a temporary one per call.
    with temporary_settings(updates={PREFECT_API_URL: prefect_server.api}):
        config = asyncio.run(worker.KubernetesWorkerJobConfiguration.from_template_and_values(
            template("gpu-sm90"), {"gpu_product": "NVIDIA-H200", "image": "registry.example/enginefoundry:1.2.1"}))
    pod = config.job_manifest["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert pod["containers"][0]["image"] == "registry.example/enginefoundry:1.2.1"
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert config.job_manifest["kind"] == "Job" and config.namespace == "default"
