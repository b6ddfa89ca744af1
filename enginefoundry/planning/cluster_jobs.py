"""What a unit's cluster job needs, as Prefect job variables: its GPUs, the spec's image, the GPU products it may
land on, and secrets as references to Prefect Secret blocks.

The variables are those of the pools' base job templates (k8s/base-job-template-<pool>.json, generated from
enginefoundry/catalog/gpu_targets.py): `image`, `gpu_count`, `gpu_products` and Prefect's own `env`. A worker of another
type (the `process` pools of the local stack) ignores the variables its template does not use; the Prefect
server accepts them because the templates' variable schemas allow extra keys.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

from enginefoundry.catalog.gpu_targets import gpu_target
from enginefoundry.errors import InputError
from enginefoundry.inputs.units import Unit
from enginefoundry.schemas.loose import PrefectJobVariables
from enginefoundry.spec import BuildSpec

# Environment variable → Prefect Secret block holding its value. A unit job gets the ones whose block exists
# (`prefect block create secret` or `Secret(value=…).save("enginefoundry-hf-token")`); the worker resolves the
# reference when it builds the job (prefect/workers/base.py `from_template_and_values` →
# `resolve_block_document_references`), so the value never travels in flow-run parameters or job variables.
DEFAULT_SECRET_ENV: dict[str, str] = {
    "HF_TOKEN": "enginefoundry-hf-token",
    "AWS_ACCESS_KEY_ID": "enginefoundry-aws-access-key-id",
    "AWS_SECRET_ACCESS_KEY": "enginefoundry-aws-secret-access-key",
    "MLFLOW_TRACKING_TOKEN": "enginefoundry-mlflow-tracking-token",
}
SECRET_ENV_VARIABLE = "EF_JOB_SECRETS"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_BLOCK_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")


class UnitJobVariables(BaseModel):
    """Job variables for one unit's flow run (`run_deployment(..., job_variables=...)`)."""

    model_config = ConfigDict(frozen=True)

    gpu_count: int | None = Field(default=None, description="nvidia.com/gpu limit: tp × pp; None on cpu targets")
    gpu_products: list[str] | None = Field(default=None, description="nvidia.com/gpu.product values allowed")
    image: str | None = Field(default=None, description="toolchain.image, pinned @ toolchain.image_digest")
    env: dict[str, str] = Field(default_factory=dict, description="name → '{{ prefect.blocks.secret.<block> }}'")

    def as_job_variables(self) -> PrefectJobVariables:
        return self.model_dump(exclude_none=True, exclude_defaults=True)


def secret_reference(block: str) -> str:
    return "{{ prefect.blocks.secret." + block + " }}"


def secret_env_map(text: str | None) -> dict[str, str]:
    """`EF_JOB_SECRETS` ("HF_TOKEN=my-hf-token,AWS_SECRET_ACCESS_KEY=s3-secret"; an empty block name drops a
    variable) over the defaults."""
    out = dict(DEFAULT_SECRET_ENV)
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, sep, block = (part.strip() for part in item.partition("="))
        if not sep or not _ENV_NAME.match(name) or (block and not _BLOCK_NAME.match(block)):
            raise InputError(f"{SECRET_ENV_VARIABLE}: '{item.strip()}' is not NAME=secret-block-name (a block name "
                             "is lower-case letters, digits and '-'), e.g. HF_TOKEN=enginefoundry-hf-token")
        if block:
            out[name] = block
        else:
            out.pop(name, None)
    return out


def pinned_image(image: str | None, digest: str | None) -> str | None:
    """`repo[:tag]@sha256:…` when the spec pins a digest (the digest is part of the cache key)."""
    if not image:
        return None
    if not digest or "@" in image:
        return image
    return f"{image}@{digest}"


def unit_job_variables(spec: BuildSpec, unit: Unit, secret_blocks: Mapping[str, str]) -> UnitJobVariables:
    """The job variables of `unit`; `secret_blocks` maps env names to Secret blocks known to exist."""
    env = {name: secret_reference(block) for name, block in sorted(secret_blocks.items())}
    row = gpu_target(unit.target.arch.value)
    if not row.is_gpu:
        return UnitJobVariables(env=env)
    return UnitJobVariables(
        gpu_count=unit.variant.gpus,
        gpu_products=list(row.products_for(unit.target.sku)),
        image=pinned_image(spec.toolchain.image, spec.toolchain.image_digest),
        env=env,
    )
