"""Secrets reach a unit's Kubernetes Job by reference: dispatch keeps the env pairs whose Prefect Secret block
exists, and prefect-kubernetes, given a client of a real Prefect server, resolves the reference into the Job."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING
from uuid import uuid4

import pytest

from enginefoundry.flows.dispatch import existing_secret_blocks
from enginefoundry.inputs.units import expand_units
from enginefoundry.planning.cluster_jobs import secret_env_map, unit_job_variables
from enginefoundry.spec import parse_spec
from tests.support.paths import REPO

if TYPE_CHECKING:
    from tests.support.cluster import PrefectServer


@pytest.mark.services
def test_secret_blocks_resolve_into_the_job(prefect_server: PrefectServer, unique: str) -> None:
    worker = pytest.importorskip("prefect_kubernetes.worker", reason="pip install prefect-kubernetes==0.8.0")
    import yaml
    from prefect.blocks.system import Secret
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import FlowRun
    from prefect.settings import PREFECT_API_URL, temporary_settings

    block = f"ef-hf-token-{unique}"
    with temporary_settings({PREFECT_API_URL: prefect_server.api}):
        Secret(value=f"hf_{unique}").save(block)
        wanted = secret_env_map(f"HF_TOKEN={block},AWS_ACCESS_KEY_ID=no-such-block-{unique}")
        with get_client(sync_client=True) as client:
            found = existing_secret_blocks(client, wanted)
        assert found == {"HF_TOKEN": block}  # the missing block (and the defaults nobody created) left out

        data = yaml.safe_load((REPO / "configs" / "llama-3-70b-tp2-a100.yaml").read_text())
        spec = parse_spec(data, base_dir=REPO / "configs")
        (unit,) = expand_units(spec)
        variables = unit_job_variables(spec, unit, found).as_job_variables()
        assert f"hf_{unique}" not in json.dumps(variables)  # only the reference travels
        template = json.loads((REPO / f"k8s/base-job-template-{unit.target.pool}.json").read_text())

        async def render() -> dict:
            async with get_client() as client:
                config = await worker.KubernetesWorkerJobConfiguration.from_template_and_values(
                    template, variables, client=client)
            config.prepare_for_flow_run(FlowRun(id=uuid4(), flow_id=uuid4(), name="unit-run"))
            return config.job_manifest

        job = asyncio.run(render())
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "HF_TOKEN", "value": f"hf_{unique}"} in container["env"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert container["image"] == spec.toolchain.image
