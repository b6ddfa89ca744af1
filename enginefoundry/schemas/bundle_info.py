"""bundle.json: what a bundle is and how its server starts (written by a lane's build, read by its serve command).

A bundle folder is anyone's to hand over, so bundle.json is read through `BundleInfo.read` (bounded), never
`json.loads`. The facts recorded about the build's GPUs, host and device are typed here too (enginefoundry.gpu fills
them in).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError
from typing_extensions import TypedDict

from enginefoundry.errors import InputError, first_problem
from enginefoundry.schemas.base import Document, DocumentError


class GpuFacts(TypedDict, total=False):
    """What a manifest and bundle.json record about one build GPU (GPUInfo.facts); every key optional on read."""

    name: str
    compute_capability: str
    arch: str
    memory_total_mib: int
    driver_version: str | None


class HostFacts(TypedDict, total=False):
    """The build host, as a manifest and bundle.json record it (`host_facts`); every key optional on read."""

    hostname_hash: str
    machine: str
    cpu: str
    cpu_count: int | None
    python: str


class TorchDeviceFacts(TypedDict, total=False):
    """What torch sees of a device (`torch_device_facts`); the GPU keys only for a CUDA device."""

    device: str
    torch: str
    gpu_name: str
    compute_capability: str
    arch: str
    memory_gib: float
    cuda: str | None


class DeviceFacts(HostFacts, TorchDeviceFacts, total=False):
    """A reference-lane build's device: the host's facts and what torch sees of the device it ran on."""


BUNDLE_INFO = "bundle.json"


class _BundlePart(BaseModel):
    """A part of bundle.json: written with the keys the lane set (no defaults added, the file's bytes stay as the
    lane has always written them), read leniently (a bundle from before a field existed still serves)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    def as_json(self) -> dict[str, JsonValue]:
        """The keys the lane set, as JSON values (the file's content)."""
        return self.model_dump(mode="json", exclude_unset=True)


class ServeSettings(_BundlePart):
    """bundle.json `serve`: how the lane's server is reached and started."""

    health: str = "/health"
    yaml_flag: str | None = None  # trtllm: the trtllm-serve flag that takes the LLM API YAML (the probe's choice)
    model_dir: str | None = None  # reference: the model folder inside the bundle


class TritonSettings(_BundlePart):
    """bundle.json `triton`: the Triton model repository a serving team launches (not run at build time)."""

    bundle_mount: str | None = None
    launch: list[str] = Field(default_factory=list)
    model_repo: str | None = None  # trtllm: the LLM API model's repository folder
    model: str | None = None
    checkpoint: str | None = None


class AutotunerCache(_BundlePart):
    """bundle.json `autotuner_cache`: the warm-up's profiling cache and what it was made with."""

    file: str
    files: list[str] | None = None  # the rank files a multi-GPU warm-up saved (absent: `file` alone)
    tensorrt_llm: str | None = None
    gpu_name: str | None = None
    compute_capability: str | None = None


class CheckpointRef(_BundlePart):
    path: str


class DisaggSettings(_BundlePart):
    """bundle.json `disaggregated` (lane trtllm): a disaggregated unit's serving files in the bundle; its server is
    the launcher, which starts the workers and the router (enginefoundry.lanes.disagg_launch)."""

    launcher: str  # disagg_launch.py
    plan: str  # disagg.json: the router's config and each worker's role, YAML and GPU ids
    router: str  # disagg_config.yaml as built (the launcher writes its own with the ports it chose)
    roles: dict[str, str] = Field(default_factory=dict)  # role → its LLM-API YAML


class BundleInfo(_BundlePart, Document):
    """bundle.json: what a bundle is and how its server starts; written by the lane's build, read back by its
    serve_command and the serving files. Every field is optional on read: each reader checks what it needs."""

    SCHEMA_NAME: ClassVar[str] = "bundle-info"
    SCHEMA_VERSION: ClassVar[int] = 1  # the file's own `format` field says which layout a lane wrote
    MAX_BYTES: ClassVar[int] = 1 << 20  # a bundle.json is a few KiB

    format: int | None = None
    lane: str | None = None
    unit: str | None = None
    params: dict[str, JsonValue] = Field(default_factory=dict)  # the lane's build parameters
    versions: dict[str, str] = Field(default_factory=dict)
    gpus: list[GpuFacts] = Field(default_factory=list)
    host: HostFacts = Field(default_factory=lambda: HostFacts())
    device: DeviceFacts = Field(default_factory=lambda: DeviceFacts())  # reference lane
    serve: ServeSettings = Field(default_factory=ServeSettings)
    # lane trtllm
    checkpoint: CheckpointRef | None = None
    runtime_config: str | None = None
    autotuner_cache: AutotunerCache | None = None
    disaggregated: DisaggSettings | None = None
    # lane trtllm-engine
    engine_dir: str | None = None
    tokenizer_dir: str | None = None
    triton_model_repo: str | None = None
    engine_version: JsonValue = None  # the engine config's own `version`, recorded as it is
    triton: TritonSettings | None = None

    @classmethod
    def of(cls, data: BundleInfo | Mapping[str, object], where: Path | str = BUNDLE_INFO) -> BundleInfo:
        """`data` as a BundleInfo: validated when it is a mapping (a parsed bundle.json), as it is otherwise."""
        if isinstance(data, BundleInfo):
            return data
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            field, msg = first_problem(err)
            raise InputError(f"{where}: {field}: {msg}: not a bundle.json enginefoundry wrote; rebuild "
                             "the bundle") from None

    @classmethod
    def read(cls, bundle_dir: Path) -> BundleInfo:
        """The bundle's bundle.json, parsed within bounds; InputError when the folder has none or it is not one
        enginefoundry wrote (a bundle folder is anyone's to hand over)."""
        path = Path(bundle_dir) / BUNDLE_INFO
        try:
            return cls.parse(path.read_bytes(), what=str(path))
        except FileNotFoundError:
            raise InputError(f"{path} does not exist: {bundle_dir} is not a bundle built by enginefoundry") from None
        except DocumentError as err:
            raise InputError(f"{err}: rebuild the bundle") from None

    def write(self, bundle_dir: Path) -> None:

        (Path(bundle_dir) / BUNDLE_INFO).write_text(json.dumps(self.as_json(), indent=2, sort_keys=True))
