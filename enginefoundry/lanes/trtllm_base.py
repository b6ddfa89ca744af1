"""What both TensorRT-LLM lanes share: option validation, the release gates (spec pin = installed release =
the image's release), the probe of the installed surface, GPU selection and bundle.json."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

from enginefoundry.catalog.precisions import PRECISIONS, precisions_where
from enginefoundry.errors import InputError, PreflightError, ToolError
from enginefoundry.gpu.detect import GPUInfo, detect_gpus, match_target
from enginefoundry.gpu.devices import host_facts
from enginefoundry.inputs.model_shape import Check
from enginefoundry.inputs.toolchain import (
    ToolchainInfo,
    ToolSurface,
    UnsupportedByRelease,
    check_against_surface,
    detect_toolchain,
    probe_surface,
    require_trtllm,
)
from enginefoundry.inputs.units import Unit
from enginefoundry.lanes.base import PROBE_CHECK, BundleInfo, Command, Lane
from enginefoundry.lanes.trtllm_flags import (
    TRTLLM_INSTALL_HINT,
    image_release_problem,
    lane_release_problem,
    registry_verdict,
    same_release,
    unsupported_env,
)
from enginefoundry.lanes.trtllm_options import OPTIONS, TrtllmOptionsBase, typed_options
from enginefoundry.schemas.base import DocumentError, parse_json
from enginefoundry.schemas.loose import JsonObject
from enginefoundry.spec import BuildSpec, KVCacheDtype, Precision

BUNDLE_FORMAT = 1
# Commands that `plan` renders run on the worker, in its image: name its interpreter, never this machine's.
WORKER_PYTHON = "python3"


# facts §2, §0. The lowest (major, minor) compute capability that has the feature, and the integer weight-only
# precisions (INT8/INT4 weights): the catalog's `min_cc` and `int_weight_only` columns.
MIN_CC = {p: row.min_cc for p, row in PRECISIONS.items() if row.min_cc}
WEIGHT_ONLY = precisions_where(int_weight_only=True)
# builder.py refuses the weight-only plugins (and INT8) only for 100 ≤ SM < 120: sm120 has them (facts §0).
NO_INT_RANGE = ((10, 0), (12, 0))


def no_int_quant(cc: tuple[int, int]) -> bool:
    return NO_INT_RANGE[0] <= cc < NO_INT_RANGE[1]


# What a precision refusal may suggest instead, most precise first (fp32 is never the answer to a missing kernel):
# the catalog's `suggested` column, in its order.
SUGGESTED = precisions_where(suggested=True)


def arch_allows(p: Precision, cc: tuple[int, int], awq_max_cc: tuple[int, int] | None = None) -> bool:
    """Whether TensorRT-LLM runs precision `p` on compute capability `cc` (facts §0, §2); `awq_max_cc`: the first
    capability without W4A16 AWQ on the lane's backend (the PyTorch backend's matrix: Blackwell)."""
    need = MIN_CC.get(p)
    if need and cc < need:
        return False
    if p in WEIGHT_ONLY and no_int_quant(cc):
        return False
    return not (p is Precision.INT4_AWQ and awq_max_cc is not None and cc >= awq_max_cc)


def precision_alternatives(cc: tuple[int, int], routes: frozenset[Precision],
                           awq_max_cc: tuple[int, int] | None = None, besides: Precision | None = None) -> list[str]:
    """The precisions a refusal may offer on `cc`: ones the lane has a route for and the architecture runs, so a
    fix hint never names one the lane would refuse in turn."""
    return [p.value for p in SUGGESTED if p is not besides and p in routes and arch_allows(p, cc, awq_max_cc)]


def precision_checks(unit: Unit, fp8_kv_on_ampere: bool, routes: frozenset[Precision] = frozenset(Precision),
                     awq_max_cc: tuple[int, int] | None = None) -> list[Check]:
    """Precision and KV dtype × architecture on TensorRT-LLM. `fp8_kv_on_ampere`: the PyTorch backend has an FP8
    KV cache on sm80/sm86 (support matrix, facts §0); the engine path does not. `routes`: the precisions the lane
    converts (the fixes offer only those)."""
    v, arch = unit.variant, unit.target.arch
    cc = arch.compute_capability
    out: list[Check] = []
    if cc is None:
        return out
    p = v.precision
    need = MIN_CC.get(p)
    instead = " / ".join(precision_alternatives(cc, routes, awq_max_cc, besides=p))
    if need and cc < need:
        where = p.row.min_cc_where or f"sm{need[0]}{need[1]}+"
        out.append(Check(name="precision_arch", ok=False,
                         message=f"{p.value} needs sm{need[0]}{need[1]}+ and target {unit.target.name} is "
                                 f"{arch.value}",
                         fix=f"restrict the variant to targets on {where} (variants[].targets), or use "
                             f"{instead} on {arch.value}"))
    elif p in WEIGHT_ONLY and no_int_quant(cc):
        out.append(Check(name="precision_arch", ok=False,
                         message=f"{p.value} on {arch.value}: \"INT8/INT4 quantization is not supported on "
                                 "SM>=100.\" (builder.py: 100 ≤ SM < 120)",
                         fix=f"use {instead} on {arch.value}, or restrict this variant to sm80–sm90 / sm120 "
                             "targets"))
    else:
        out.append(Check(name="precision_arch", ok=True, message=f"{p.value} runs on {arch.value}"))
    kv = v.kv_cache_dtype
    if kv is KVCacheDtype.FP8 and cc < (8, 9) and not fp8_kv_on_ampere:
        out.append(Check(name="kv_dtype_arch", ok=False,
                         message=f"an FP8 KV cache needs sm89+ and target {unit.target.name} is {arch.value}",
                         fix="kv_cache_dtype: auto on this target, or restrict the variant to sm89+ targets"))
    elif kv is KVCacheDtype.INT8 and no_int_quant(cc):
        out.append(Check(name="kv_dtype_arch", ok=False,
                         message=f"an INT8 KV cache on {arch.value}: INT8 quantization is not supported on SM>=100",
                         fix="kv_cache_dtype: fp8 on Blackwell"))
    return out


def chunked_prefill_check(unit: Unit, refused_because: str | None) -> list[Check]:
    """A prompt longer than max_num_tokens needs chunked prefill/context; `refused_because`: why this unit has none."""
    p = unit.profile
    if p.max_input_len <= p.max_num_tokens:
        return []
    if refused_because:
        return [Check(name="chunked_prefill", ok=False,
                      message=f"max_input_len {p.max_input_len} > max_num_tokens {p.max_num_tokens} needs chunked "
                              f"context, which needs the paged context FMHA; this unit has {refused_because}",
                      fix="max_num_tokens ≥ max_input_len, or kv_cache_dtype fp8/auto and no "
                          "use_paged_context_fmha: false")]
    return [Check(name="chunked_prefill", ok=True,
                  message=f"max_input_len {p.max_input_len} > max_num_tokens {p.max_num_tokens}: chunked prefill is "
                          "enabled for long prompts")]


def require_pinned_release(pinned: str | None, installed: str) -> None:
    """ToolError unless the spec's toolchain.trtllm_version is the installed release (no pin: anything goes). A pin
    without an rc suffix is not satisfied by a release candidate of it (trtllm_flags.same_release)."""
    if pinned and not same_release(pinned, installed):
        raise ToolError(f"the spec pins TensorRT-LLM {pinned} and the worker has {installed} installed: run the "
                        f"unit in an image that ships {pinned} (nvcr.io/nvidia/tensorrt-llm/release:{pinned}), or "
                        f"pin toolchain.trtllm_version: {installed}")


class TrtllmLaneBase(Lane):
    """Option validation, the toolchain gate, the surface probe, GPU selection and bundle.json."""

    name = "trtllm"
    install_hint = TRTLLM_INSTALL_HINT
    needs_gpu = True
    fp8_kv_on_ampere = False
    convert_tools: tuple[str, ...] = ()  # tools of the convert stage: checked by convert(), not by build()
    precision_routes: frozenset[Precision] = frozenset(Precision)  # precisions the lane converts
    awq_max_cc: tuple[int, int] | None = None  # first compute capability without int4_awq on the lane's backend

    def smoke_logprobs_missing(self, spec: BuildSpec) -> str | None:
        """trtllm-serve returns chat log-probs of the generated tokens, no prompt log-probs: `CompletionRequest` has
        no prompt_logprobs and the echo answer's log-probs are built from the generated tokens only
        (NVIDIA/TensorRT-LLM tensorrt_llm/serve/openai_protocol.py@0076e93, serve/postprocess_handlers.py@01bf192;
        docs/smoke-gate.md), so teacher forcing cannot run against it."""
        return ("teacher-forced log-probs: trtllm-serve returns no prompt log-probs "
                "(tensorrt_llm/serve/postprocess_handlers.py@01bf192)")

    def __init__(self, python: str | None = None) -> None:
        self.python = python or sys.executable
        self._toolchain: ToolchainInfo | None = None
        self._surfaces: dict[str, ToolSurface] = {}

    def validate_options(self, spec: BuildSpec) -> list[tuple[str, str]]:
        pinned = spec.toolchain.trtllm_version
        # lane_options themselves: typed, checked when the spec is parsed
        problems: list[tuple[str, str]] = self.speculation_refusal(spec)
        if pinned:
            why = lane_release_problem(self.name, pinned)
            if why:
                problems.append(("toolchain.trtllm_version", why))
        why = image_release_problem(pinned, spec.toolchain.image, self.name)
        if why:
            problems.append(("toolchain.image", why))
        for i, t in enumerate(spec.targets):
            if t.gpu_count < 1:
                problems.append((f"targets.{i}.gpu_count", f"lane {self.name} needs at least one NVIDIA GPU"))
        for i, p in enumerate(spec.profiles):
            if not p.paged_kv_cache:
                problems.append((f"profiles.{i}.paged_kv_cache",
                                 "in-flight batching (trtllm-serve, Triton inflight_fused_batching) needs the paged "
                                 "KV cache: remove the field or set it to true"))
            if not p.remove_input_padding:
                problems.append((f"profiles.{i}.remove_input_padding",
                                 "in-flight batching needs packed input (remove_input_padding): remove the field or "
                                 "set it to true"))
        return problems

    def options(self, spec: BuildSpec) -> TrtllmOptionsBase:
        """The spec's lane options as this lane's model (each lane narrows the type)."""
        return typed_options(OPTIONS[self.name], spec.lane_options)

    def toolchain(self) -> ToolchainInfo:
        if self._toolchain is None:
            self._toolchain = detect_toolchain(self.python)
        return self._toolchain

    # the installed surface ------------------------------------------------------------------------------------

    def tool_commands(self, spec: BuildSpec | None) -> dict[str, list[str]]:
        """tool name → the argv prefix whose `--help` lists its flags (lanes override)."""
        return {}

    def triton_dir(self, spec: BuildSpec | None) -> Path | None:
        return None

    def surface(self, spec: BuildSpec | None = None) -> ToolSurface:
        """What the installed release accepts, read on this host (once per tool set)."""
        tools = self.tool_commands(spec)
        triton = self.triton_dir(spec)
        cache_key = json.dumps([sorted(tools.items()), str(triton)])
        if cache_key not in self._surfaces:
            self._surfaces[cache_key] = probe_surface(self.python, tools, triton)
        return self._surfaces[cache_key]

    def versions(self) -> dict[str, str]:
        info = self.toolchain()
        version = require_trtllm(info, self.name, self.install_hint)
        why = lane_release_problem(self.name, str(version))
        if why:
            raise ToolError(why)
        # The probed surface joins the toolchain identity (unit key, manifest): same version string, other flags
        # (a patched image, another ModelOpt) → another key.
        return {**info.versions(), "surface": self.surface(None).digest()}

    def pinned_surface(self, spec: BuildSpec) -> ToolSurface:
        """The installed surface, after checking it is the release the spec pins (ToolError otherwise)."""
        surface = self.surface(spec)
        if surface.tensorrt_llm:
            require_pinned_release(spec.toolchain.trtllm_version, surface.tensorrt_llm)
        return surface

    def refuse_unsupported(self, spec: BuildSpec, unit: Unit) -> ToolSurface:
        """Before any download or GPU time: the installed release must be the pinned one and must accept every
        flag, YAML key and template key this unit's commands use (ToolchainMismatch naming the first ones)."""
        surface = self.pinned_surface(spec)
        work = self.planned_work(spec, unit, surface)
        check_against_surface(work, surface)
        env = unsupported_env(work, surface.tensorrt_llm)
        if env:
            raise UnsupportedByRelease(f"environment variable {env[0]}", f"TensorRT-LLM {surface.tensorrt_llm}",
                                       "a programming error in the lane: it must not set it for this release", env[1:])
        return surface

    def check_installed(self, spec: BuildSpec, unit: Unit) -> None:
        """The installed release is one this lane runs, the pinned one, and accepts every flag, YAML key and
        template key of the unit's build and serve commands: refused before the source is downloaded (the convert
        stage checks its own command before it runs)."""
        try:
            self.versions()
            self.refuse_unsupported(spec, unit)
        except ToolError as err:
            raise PreflightError(f"unit {unit.name}: {err}") from None

    def registry_checks(self, spec: BuildSpec, unit: Unit) -> list[Check]:
        """What the flag registry says of the unit's commands for the pinned release, before any probe: an item the
        release is known to lack refuses the unit (the same range docs/trtllm-compat.md shows); items without
        evidence for the release are named, to be probed on the worker. No pin: the probe decides everything."""
        version = spec.toolchain.trtllm_version
        # The unit's variant alone: what the lane refuses of it (the spec's other variants are their own units', and
        # validating all of them for each unit made a matrix of n variants cost n² checks).
        alone = spec.model_copy(update={"variants": [unit.variant]})
        refused = unit.variant.precision not in self.precision_routes or any(
            field.startswith("variants.0.") for field, _ in self.validate_options(alone))
        if not version or refused:  # a variant the lane refuses has no commands to judge
            return []
        try:
            work = self.describe(spec, unit)
        except (InputError, ToolError):  # refused by the lane's own rules, reported as such
            return []
        verdict = registry_verdict(work, version)
        out = []
        if verdict.absent:
            out.append(Check(name=PROBE_CHECK, ok=False,
                             message=f"TensorRT-LLM {version} has no {', '.join(verdict.absent)} "
                                     "(docs/trtllm-compat.md: the registry's release range and evidence)",
                             fix="remove the spec setting that emits it, or pin a release that has it"))
        if verdict.to_be_probed:
            out.append(Check(name=PROBE_CHECK, ok=True,
                             message=f"to be probed on the worker (no evidence read for {version}): "
                                     + ", ".join(verdict.to_be_probed)))
        return out

    def planned_work(self, spec: BuildSpec, unit: Unit, surface: ToolSurface | None) -> list[Command]:
        """The build and serve commands (with their YAML and template keys) `describe` renders for a surface; the
        convert stage checks its own command where it runs."""
        return [c for c in self.describe(spec, unit, surface) if c.tool not in self.convert_tools]

    # GPUs and bundles -----------------------------------------------------------------------------------------

    def select_gpus(self, unit: Unit, log_dir: Path) -> tuple[list[GPUInfo], dict[str, str]]:
        """The target's GPUs on this host and the env that pins the tool to them (PreflightError otherwise)."""
        used = match_target(unit.target, detect_gpus(log_dir))
        # CUDA enumerates fastest-first, nvidia-smi by PCI bus: name the GPUs by UUID, or by bus order.
        if all(g.uuid for g in used):
            env = {"CUDA_VISIBLE_DEVICES": ",".join(str(g.uuid) for g in used)}
        else:
            env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(str(g.index) for g in used)}
        return used, env

    def write_bundle_info(self, bundle: Path, unit: Unit,
                          params: dict[str, Any],  # JSON edge: the lane's build parameters
                          gpus: list[GPUInfo],
                          versions: dict[str, str], lane_info: BundleInfo) -> BundleInfo:
        """bundle.json: the lane's own fields (`lane_info`) with what every TensorRT-LLM bundle records.
        `params`: JSON edge, the lane's build parameters."""
        # TensorRT-LLM writes no GPU, SM or TensorRT version into its artifacts (facts §5): record them here.
        info = BundleInfo.model_validate({"format": BUNDLE_FORMAT, "lane": self.name, "unit": unit.name,
                                          "params": params, "versions": versions, "gpus": [g.facts() for g in gpus],
                                          "host": host_facts(), **lane_info.as_json()})
        info.write(bundle)
        return info


def read_bundle_info(bundle_dir: Path) -> BundleInfo:
    return BundleInfo.read(bundle_dir)


def fresh_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


MAX_TOOL_JSON_BYTES = 64 << 20  # an engine's config.json or a probe's result line; a few KiB to a few MiB


def parse_marker_json(text: str, marker: str, what: str) -> JsonObject:
    for line in reversed(text.splitlines()):
        idx = line.find(marker)
        if idx >= 0:
            return json_object(line[idx + len(marker):], f"{what}'s result line")
    raise ToolError(f"{what} printed no result line")


def json_object(text: str, what: str) -> JsonObject:
    """`text` as a JSON object; ToolError naming `what` otherwise."""
    try:
        data = parse_json(text, what=what, max_bytes=MAX_TOOL_JSON_BYTES)
    except DocumentError as err:
        raise ToolError(str(err)) from None
    if not isinstance(data, dict):
        raise ToolError(f"{what} is not a JSON object")
    return data
