"""The lane interface: what `convert`, `build` and `serve` mean for one toolchain.

Nothing outside a lane module knows a toolchain flag. Each lane turns the spec into concrete work
(commands, config files, bundles) and can describe that work without running it (for `plan`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from enginefoundry.build.units import Unit
from enginefoundry.spec import BuildSpec, Variant


class Command(BaseModel):
    """One external command: what `plan` prints and what the runner executes."""

    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    description: str = ""
    # What the command uses, for the check against the installed release (not part of the command line):
    tool: str | None = Field(default=None, description="the flag registry's tool name, e.g. trtllm-build")
    llm_api_keys: list[str] = Field(default_factory=list, description="dotted keys of the LLM API YAML it reads")
    template_keys: dict[str, list[str]] = Field(default_factory=dict, description="Triton template → keys")

    def shell(self) -> str:
        import shlex

        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return (env + " " if env else "") + shlex.join(self.argv)


class ConvertResult(BaseModel):
    """A converted checkpoint folder (shared by every target that needs it)."""

    checkpoint_dir: str
    params: dict[str, Any] = Field(default_factory=dict)
    commands: list[Command] = Field(default_factory=list)


class BuildResult(BaseModel):
    """The unit's bundle folder: everything the serve step and a serving team need."""

    bundle_dir: str
    params: dict[str, Any] = Field(default_factory=dict)
    device: dict[str, Any] = Field(default_factory=dict)
    commands: list[Command] = Field(default_factory=list)
    metrics: dict[str, float] = Field(default_factory=dict)


class ServeCommand(BaseModel):
    command: Command
    model_name: str  # the `model` field requests must carry
    health_path: str = "/health"
    tokenizer_dir: str  # local tokenizer for clients (benchmark tools)
    # Names the server's working folder must hold, as symbolic links to these paths: a server that pins the
    # request `model` to the (relative) path it was started with then answers to the model's name.
    links: dict[str, str] = Field(default_factory=dict)


class Lane(ABC):
    """A toolchain. Besides convert/build/serve it answers what preflight asks, so preflight knows no lane by name:
    its own checks (`preflight_checks`) and its memory model (the attributes below and `build_footprint`)."""

    name: str
    needs_gpu: bool = False  # refuse cpu targets
    embedding_sharded: bool = True  # the embedding is split over tp ranks (False: replicated on every tp rank)
    sizes_kv_pool: bool = True  # the runtime gives the free memory to a KV pool (the KV budget check applies)

    def preflight_checks(self, spec: BuildSpec, unit: Unit, shape: Any) -> list[Any]:
        """This lane's own preflight checks (enginefoundry.build.model_shape.Check) for a unit; `shape` may be None."""
        return []

    def build_footprint(self, spec: BuildSpec, unit: Unit, est: Any, source_bytes: int,
                        per_rank_bytes: int) -> tuple[float, float]:
        """(host memory, disk) the build needs, before the 10 % margin: by default the source plus the output."""
        return source_bytes + est.weights_bytes_total, source_bytes + est.weights_bytes_total

    def validate_options(self, spec: BuildSpec) -> list[tuple[str, str]]:
        """Problems with lane-specific spec fields, as (field path, message). `lane_options` itself is the lane's
        typed options model, already checked when the spec was parsed."""
        return []

    def check_installed(self, spec: BuildSpec, unit: Unit) -> None:
        """Preflight on the machine that runs the unit, before any download or GPU time: PreflightError when the
        installed toolchain cannot run it (another release than the pinned one, a flag or key it lacks)."""
        return None

    @abstractmethod
    def versions(self) -> dict[str, str]:
        """Installed toolchain versions. Raises ToolError when the toolchain is missing or wrong."""

    @abstractmethod
    def convert(self, spec: BuildSpec, variant: Variant, source_dir: Path, workdir: Path) -> ConvertResult:
        """Turn the fetched checkpoint into this variant's checkpoint under workdir."""

    @abstractmethod
    def build(self, spec: BuildSpec, unit: Unit, checkpoint_dir: Path, workdir: Path) -> BuildResult:
        """Build the unit's bundle under workdir, on a device of the unit's target."""

    @abstractmethod
    def serve_command(self, bundle_dir: Path, host: str, port: int) -> ServeCommand:
        """The command that serves the bundle on an OpenAI-compatible endpoint."""

    def named_serve_command(self, bundle_dir: Path, host: str, port: int, name: str) -> ServeCommand:
        """`serve_command`, answering to the model's name (the spec's `model.name`) where the lane's server can;
        by default the lane's own `model` name stands."""
        return self.serve_command(bundle_dir, host, port)

    def describe(self, spec: BuildSpec, unit: Unit, surface: Any = None) -> list[Command]:
        """The commands this lane would run for a unit, without running anything (for `plan`). `surface`: what
        the worker's toolchain accepts (a probe result) when known, else the spec's pinned release decides."""
        return []
