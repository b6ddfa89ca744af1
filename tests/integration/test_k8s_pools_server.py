"""The Kubernetes base job templates of the GPU pools (k8s/) are accepted by a real Prefect server as
`kubernetes` work pools (no prefect-kubernetes needed for that), a broken template is refused, and the Job a
kubernetes worker would submit is rendered from them in tests/unit/test_cluster_jobs.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from enginefoundry.catalog.gpu_targets import gpu_pools
from tests.support.cluster import PrefectServer
from tests.support.paths import REPO

K8S = REPO / "k8s"
PRODUCTS = tuple(t.pool for t in gpu_pools())


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
