"""The lane interface: what `convert`, `build` and `serve` mean for one toolchain.

Nothing outside a lane module knows a toolchain flag. Each lane turns the spec into concrete work
(commands, config files, bundles) and can describe that work without running it (for `plan`).
"""

from __future__ import annotations

import shlex
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, Field, JsonValue

from enginefoundry.inputs.model_shape import Check, ModelShape
from enginefoundry.inputs.toolchain import ToolSurface
from enginefoundry.inputs.units import Unit

# bundle.json's model lives with the other documents (enginefoundry.schemas); lanes and their callers name it here.
from enginefoundry.schemas.bundle_info import BUNDLE_INFO as BUNDLE_INFO
from enginefoundry.schemas.bundle_info import AutotunerCache as AutotunerCache
from enginefoundry.schemas.bundle_info import BundleInfo as BundleInfo
from enginefoundry.schemas.bundle_info import CheckpointRef as CheckpointRef
from enginefoundry.schemas.bundle_info import ServeSettings as ServeSettings
from enginefoundry.schemas.bundle_info import TritonSettings as TritonSettings
from enginefoundry.spec import BuildSpec, Variant
from enginefoundry.spec.lane_options import LaneOptions

# Check.name of what a lane's release registry says of a unit's commands before the probe (`plan` lists the items
# to be probed on the worker under the unit's commands).
PROBE_CHECK = "release_registry"


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
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return (env + " " if env else "") + shlex.join(self.argv)


class ConvertResult(BaseModel):
    """A converted checkpoint folder (shared by every target that needs it)."""

    checkpoint_dir: str
    params: dict[str, Any] = Field(default_factory=dict)  # JSON edge: recorded in the checkpoint's manifest
    commands: list[Command] = Field(default_factory=list)


class BuildResult(BaseModel):
    """The unit's bundle folder: everything the serve step and a serving team need."""

    bundle_dir: str
    params: dict[str, Any] = Field(default_factory=dict)  # JSON edge: the manifest's build_params
    device: dict[str, Any] = Field(default_factory=dict)  # JSON edge: the manifest's device facts
    commands: list[Command] = Field(default_factory=list)
    metrics: dict[str, float] = Field(default_factory=dict)


class WeightsEstimate(Protocol):
    """What `Lane.build_footprint` reads of preflight's memory estimate (enginefoundry.planning.preflight)."""

    @property
    def weights_bytes_total(self) -> int: ...


SERVE_CWD_VAR = "EF_SERVE_CWD"  # ${EF_SERVE_CWD} in a ServeCommand's env: the server's working folder


class ServeCommand(BaseModel):
    command: Command
    model_name: str  # the `model` field requests must carry
    health_path: str = "/health"
    tokenizer_dir: str  # local tokenizer for clients (benchmark tools)
    # Names the server's working folder must hold, as symbolic links to these paths: a server that pins the
    # request `model` to the (relative) path it was started with then answers to the model's name.
    links: dict[str, str] = Field(default_factory=dict)
    # Names the server's working folder must hold as private copies of these files, made afresh at each start:
    # files the server writes back into (TensorRT-LLM's autotuner cache), which must not change in the bundle.
    # An env value names that folder as ${EF_SERVE_CWD} (SERVE_CWD_VAR).
    copies: dict[str, str] = Field(default_factory=dict)
    # False: a server only the smoke stage runs (one that returns log-probs, `Lane.smoke_serve_command`); the
    # benchmark and the published serving files run the lane's own server.
    shipped: bool = True


class Lane(ABC):
    """A toolchain. Besides convert/build/serve it answers what preflight asks, so preflight knows no lane by name:
    its own checks (`preflight_checks`) and its memory model (the attributes below and `build_footprint`)."""

    name: str
    needs_gpu: bool = False  # refuse cpu targets
    embedding_sharded: bool = True  # the embedding is split over tp ranks (False: replicated on every tp rank)
    sizes_kv_pool: bool = True  # the runtime gives the free memory to a KV pool (the KV budget check applies)
    moe_parallel: bool = False  # variants may set moe_ep / moe_tp / attention_dp (enginefoundry.lanes.moe_parallel)
    # The largest LoRA rank of model.adapters this lane builds (enginefoundry/inputs/adapters.py); None: no adapters.
    max_lora_rank: int | None = None
    # Precisions whose converted checkpoint is ModelOpt's unified export, which smoke.reference_precision: simulated
    # dequantizes into the unit's reference (enginefoundry/smoke/simulated.py `dequantized_checkpoint`).
    dequantizable: frozenset[str] = frozenset()
    # A pre-quantized FP8 or NVFP4 source: this lane's server quantizes each linear's input as the export says (an
    # engine's FP8/NVFP4 GEMMs), so its reference simulates that too (inputs/dequantize.py); False: it serves the
    # dequantized weights, and its reference is those weights alone.
    quantizes_activations: bool = True
    # A speculative unit's non-speculative twin is a second server of the bundle (`twin_serve_command`), not a
    # request switch of its own (`speculative_twin`).
    serves_twin_apart: bool = False
    # The spec's `speculative.algorithm` values this lane serves (enginefoundry/spec/speculative.py); others are
    # refused at validate with the lanes that serve them.
    speculative_algorithms: frozenset[str] = frozenset()
    # Variants may set `disaggregated` (context and generation servers behind a router: lane trtllm's
    # `trtllm-serve disaggregated`, enginefoundry.lanes.trtllm_disagg); other lanes refuse it at validate.
    disaggregated: bool = False

    def smoke_logprobs_missing(self, spec: BuildSpec) -> str | None:
        """Which of the gate's log-prob checks the smoke stage's server cannot serve, and why (the server's own
        code as evidence); None where it returns both chat log-probs and the prompt log-probs of teacher forcing
        (or nothing is known against it). `smoke.logprob_checks: required` is refused at plan and validate on it."""
        return None

    def dtype_option(self, spec: BuildSpec) -> str | None:
        """The activation dtype (a torch dtype name) the spec sets for this lane's quantized builds, None where they
        follow the checkpoint: a simulated reference computes in it (smoke.simulated.simulated_dtype)."""
        return None

    def preflight_checks(self, spec: BuildSpec, unit: Unit, shape: ModelShape | None) -> list[Check]:
        """This lane's own preflight checks (enginefoundry.inputs.model_shape.Check) for a unit; `shape` may be None."""
        return []

    def build_footprint(self, spec: BuildSpec, unit: Unit, est: WeightsEstimate, source_bytes: int,
                        per_rank_bytes: int) -> tuple[float, float]:
        """(host memory, disk) the build needs, before the 10 % margin: by default the source plus the output."""
        return source_bytes + est.weights_bytes_total, source_bytes + est.weights_bytes_total

    def validate_options(self, spec: BuildSpec) -> list[tuple[str, str]]:
        """Problems with lane-specific spec fields, as (field path, message). `lane_options` itself is the lane's
        typed options model, already checked when the spec was parsed."""
        return self.speculation_refusal(spec) + self.disaggregation_refusal(spec)

    def disaggregation_refusal(self, spec: BuildSpec) -> list[tuple[str, str]]:
        """A lane that serves a unit as one server: every variant with `disaggregated` is refused, with the fix."""
        if self.disaggregated:
            return []
        return [(f"variants.{i}.disaggregated", f"lane {self.name} serves a unit as one server: remove "
                                                "disaggregated, or use lane trtllm (trtllm-serve disaggregated)")
                for i, v in enumerate(spec.variants) if v.disaggregated is not None]

    def adapter_request(self, spec: BuildSpec, name: str) -> dict[str, JsonValue] | None:
        """For a unit serving adapters (model.adapter_mode serve): the request fields that select adapter `name`,
        the request's `model` staying the base's; None where the request's OpenAI `model` names the adapter (the
        reference lane's scoring server)."""
        return None

    def speculative_twin(self, spec: BuildSpec) -> dict[str, bool] | None:
        """For a speculative spec: the request fields that make the unit's smoke server answer without speculation
        (its non-speculative twin, which the gate's lossless rule compares answers with); None where the lane has
        no such switch (the lossless rule then fails: it could not run)."""
        return None

    def twin_serve_command(self, bundle_dir: Path, host: str, port: int, model_name: str) -> ServeCommand | None:
        """For a speculative unit whose server has no request switch (`speculative_twin` None): a second server of
        the same bundle without speculation, which the pipeline starts after the unit's own is stopped (never both
        at once: each takes its share of the GPU's free memory) to ask the smoke prompts and the benchmark's
        points again. None: the lane has none (the lossless rule then fails as not run)."""
        return None

    def speculation_refusal(self, spec: BuildSpec) -> list[tuple[str, str]]:
        """`speculative.algorithm` when this lane does not serve it, with the lanes that do."""
        sp = spec.speculative
        if sp is None or sp.algorithm.value in self.speculative_algorithms:
            return []
        from enginefoundry.lanes.registry import lanes_serving

        others = lanes_serving(sp.algorithm.value)
        mine = f" (it serves {', '.join(sorted(self.speculative_algorithms))})" if self.speculative_algorithms else ""
        return [("speculative.algorithm", f"lane {self.name} does not serve {sp.algorithm.value} speculation{mine}: "
                                          f"use lane {' or '.join(others) or 'trtllm'}, or remove the speculative "
                                          "section")]

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
    def build(self, spec: BuildSpec, unit: Unit, checkpoint_dir: Path, workdir: Path,
              draft_dir: Path | None = None, adapter_dirs: dict[str, Path] | None = None) -> BuildResult:
        """Build the unit's bundle under workdir, on a device of the unit's target. `draft_dir`: the fetched
        `speculative.draft` checkpoint, for a spec whose speculation drafts with one. `adapter_dirs`: name → fetched
        LoRA adapter folder, for a unit serving them (model.adapter_mode serve; lanes without it refuse adapters)."""

    @abstractmethod
    def serve_command(self, bundle_dir: Path, host: str, port: int) -> ServeCommand:
        """The command that serves the bundle on an OpenAI-compatible endpoint."""

    def named_serve_command(self, bundle_dir: Path, host: str, port: int, name: str) -> ServeCommand:
        """`serve_command`, answering to the model's name (the spec's `model.name`) where the lane's server can;
        by default the lane's own `model` name stands."""
        return self.serve_command(bundle_dir, host, port)

    def smoke_serve_command(self, bundle_dir: Path, host: str, port: int, name: str,
                            options: LaneOptions | None = None) -> ServeCommand:
        """The server the pipeline's smoke stage judges (`options`: the spec's lane_options). By default the one the
        unit ships with (`named_serve_command`); a lane whose own server returns no log-probs may start one that
        does, with the same weights and model code, marked `shipped=False` (the benchmark then starts its own)."""
        return self.named_serve_command(bundle_dir, host, port, name)

    def describe(self, spec: BuildSpec, unit: Unit, surface: ToolSurface | None = None) -> list[Command]:
        """The commands this lane would run for a unit, without running anything (for `plan`). `surface`: what
        the worker's toolchain accepts (a probe result) when known, else the spec's pinned release decides."""
        return []
