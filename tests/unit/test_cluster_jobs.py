"""A unit's cluster job gets what it needs: the job variables dispatch passes with `run_deployment`, rendered
into the Kubernetes Job by prefect-kubernetes' own job configuration (no cluster needed)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
import yaml

from enginefoundry.catalog.gpu_targets import gpu_target
from enginefoundry.errors import InputError
from enginefoundry.inputs.units import expand_units
from enginefoundry.planning.cluster_jobs import UnitJobVariables, secret_env_map, unit_job_variables
from enginefoundry.spec import BuildSpec, parse_spec

REPO = Path(__file__).resolve().parents[2]
IMAGE = "registry.example/enginefoundry-trtllm:1.2.1"
DIGEST = "sha256:" + "ab" * 32


def spec(tp: int = 2, arch: str = "sm80", sku: list[str] | None = None) -> BuildSpec:
    """The shipped tp=2 A100 spec, its image pinned by digest, its target varied."""
    data = yaml.safe_load((REPO / "configs" / "llama-3-70b-tp2-a100.yaml").read_text())
    data["toolchain"].update(image=IMAGE, image_digest=DIGEST)
    data["variants"][0]["tp"] = tp
    data["targets"] = [{"name": "t", "arch": arch, "gpu_count": tp, "sku": ["A100"] if sku is None else sku}]
    return parse_spec(data, base_dir=REPO / "configs")


def render(pool: str, variables: dict[str, Any]) -> dict[str, Any]:
    """The Job manifest a prefect-kubernetes worker of `pool` would submit for a flow run with these variables."""
    worker = pytest.importorskip("prefect_kubernetes.worker", reason="pip install prefect-kubernetes==0.8.0")
    from prefect.client.schemas.objects import FlowRun
    from prefect.settings import PREFECT_API_URL, temporary_settings

    template = json.loads((REPO / f"k8s/base-job-template-{pool}.json").read_text())
    # No server: with an API URL set, rendering a template without block references sends no request (without
    # one, Prefect would start a temporary server to look references up).
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        config = asyncio.run(worker.KubernetesWorkerJobConfiguration.from_template_and_values(template, variables))
    config.prepare_for_flow_run(FlowRun(id=uuid4(), flow_id=uuid4(), name="unit-run"))
    return config.job_manifest


def test_tp2_unit_job_asks_for_two_gpus_the_specs_image_and_the_selector() -> None:
    s = spec(tp=2)
    (unit,) = expand_units(s)
    variables = unit_job_variables(s, unit, {}).as_job_variables()
    a100s = ["NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-80GB-PCIe", "NVIDIA-A100-PCIE-40GB"]
    assert variables == {"gpu_count": 2, "image": f"{IMAGE}@{DIGEST}", "gpu_products": a100s}
    job = render(unit.target.pool, variables)
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert container["image"] == f"{IMAGE}@{DIGEST}"
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "nvidia.com/gpu.product", "operator": "In",
                                         "values": a100s}]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.compute.major": "8", "nvidia.com/gpu.compute.minor": "0"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    # prepare_for_flow_run filled in the flow run's identity: the worker's own part still works.
    assert any(e.get("name") == "PREFECT__FLOW_RUN_ID" for e in container["env"])


def test_pool_defaults_without_job_variables() -> None:
    job = render("gpu-sm89", {})
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["image"].startswith("nvcr.io/nvidia/tensorrt-llm/release:")


def test_secrets_travel_as_block_references() -> None:
    s = spec(tp=1)
    (unit,) = expand_units(s)
    variables = unit_job_variables(s, unit, {"HF_TOKEN": "enginefoundry-hf-token"}).as_job_variables()
    assert variables["env"] == {"HF_TOKEN": "{{ prefect.blocks.secret.enginefoundry-hf-token }}"}
    assert variables["gpu_count"] == 1


def test_cpu_unit_gets_only_env() -> None:
    s = spec(tp=1, arch="cpu")
    (unit,) = expand_units(s)
    assert unit_job_variables(s, unit, {}) == UnitJobVariables()
    assert unit_job_variables(s, unit, {}).as_job_variables() == {}
    assert gpu_target("cpu").template_file is None


def test_secret_env_map_overrides_and_refuses_junk() -> None:
    mapping = secret_env_map("HF_TOKEN=my-hf, AWS_ACCESS_KEY_ID= ,EXTRA_KEY=extra")
    assert mapping["HF_TOKEN"] == "my-hf" and mapping["EXTRA_KEY"] == "extra"
    assert "AWS_ACCESS_KEY_ID" not in mapping
    for bad in ("HF_TOKEN", "HF_TOKEN=Bad Name", "1X=ok"):
        with pytest.raises(InputError, match="EF_JOB_SECRETS"):
            secret_env_map(bad)
