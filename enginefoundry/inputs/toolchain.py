"""Which TensorRT-LLM, TensorRT, CUDA and driver a worker has.

`import tensorrt_llm` prints a banner on stdout (`[TensorRT-LLM] TensorRT LLM version: …`) and is slow, so the
versions are read in a child interpreter that prints one JSON line behind a marker; only that line is parsed.
The driver comes from the GPU detection (NVML or nvidia-smi), which needs no import of the toolkit.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import re
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import yaml
from pydantic import BaseModel, Field

from enginefoundry.errors import PreflightError, ToolError
from enginefoundry.runner import run_tool
from enginefoundry.schemas.base import DocumentError, parse_json
from enginefoundry.schemas.loose import JsonObject

PROBE_MARKER = "ENGINEFOUNDRY_TOOLCHAIN_JSON "
# Environment variables the lanes set → the file of the tensorrt_llm package that reads them (PR #7738:
# tensorrt_llm/_torch/autotuner.py reads TLLM_AUTOTUNER_CACHE_PATH): the probe greps it, without importing.
ENV_SOURCES = {"TLLM_AUTOTUNER_CACHE_PATH": "_torch/autotuner.py"}
# The speculative_config classes of the PyTorch backend (tensorrt_llm.llmapi.llm_args): the probe reads the
# decoding_type each answers to and their fields. lora_config's LoraConfig: its fields (tensorrt_llm/lora_helper.py
# @037d4ba1 has it as a dataclass, the 1.4-era llmapi reference as a pydantic model).
SPEC_CLASSES = ("DraftTargetDecodingConfig", "EagleDecodingConfig", "Eagle3DecodingConfig", "MTPDecodingConfig",
                "NGramDecodingConfig")

# Runs in the worker's interpreter. Every import is guarded: a missing package is data, not a crash.
PROBE_SCRIPT = f"""
import json, sys
out = {{"python": sys.version.split()[0], "errors": {{}}}}
def probe(key, fn):
    try:
        out[key] = fn()
    except BaseException as err:  # ImportError, but also CUDA init failures raised at import time
        first = (str(err).splitlines() or [""])[0][:300]
        out["errors"][key] = type(err).__name__ + (": " + first if first else "")
def _trtllm():
    import tensorrt_llm
    return tensorrt_llm.__version__
def _tensorrt():
    import tensorrt
    return tensorrt.__version__
def _torch():
    import torch
    out["cuda"] = torch.version.cuda
    out["cuda_available"] = bool(torch.cuda.is_available())
    return torch.__version__
def _modelopt():
    import modelopt
    return modelopt.__version__
def _llm_api():
    # The PyTorch-backend args class and the two nested configs the lanes write (pydantic, extra="forbid").
    from tensorrt_llm.llmapi import llm_args
    fields = {{"": sorted(llm_args.TorchLlmArgs.model_fields)}}
    for key, cls in (("kv_cache_config", "KvCacheConfig"), ("cuda_graph_config", "CudaGraphConfig")):
        if hasattr(llm_args, cls):
            fields[key] = sorted(getattr(llm_args, cls).model_fields)
    # speculative_config: the decoding_type each *DecodingConfig class answers to, and their fields together
    spec_fields, spec_types = set(), set()
    for cls in {SPEC_CLASSES!r}:
        model = getattr(llm_args, cls, None)
        if model is None or "decoding_type" not in getattr(model, "model_fields", {{}}):
            continue
        spec_types.add(str(model.model_fields["decoding_type"].default))
        spec_fields.update(model.model_fields)
    if spec_types:
        fields["speculative_config"] = sorted(spec_fields)
        fields["speculative_config.decoding_type"] = sorted(spec_types)
    # lora_config: LoraConfig's fields, a pydantic model (llmapi reference) or a dataclass (lora_helper.py)
    lora = getattr(llm_args, "LoraConfig", None)
    if lora is None:
        try:
            from tensorrt_llm.lora_helper import LoraConfig as lora
        except ImportError:
            lora = None
    if lora is not None:
        import dataclasses
        names = getattr(lora, "model_fields", None)
        if names is None and dataclasses.is_dataclass(lora):
            names = [f.name for f in dataclasses.fields(lora)]
        if names is not None:
            fields["lora_config"] = sorted(names)
    return fields
def _env_reads():
    # Environment variables have no --help: whether the installed package reads one is read from the source file
    # that does (ENV_SOURCES), found without importing the package.
    import importlib.util, os
    root = os.path.dirname(importlib.util.find_spec("tensorrt_llm").origin)
    out = {{}}
    for name, rel in {ENV_SOURCES!r}.items():
        try:
            with open(os.path.join(root, rel), errors="replace") as f:
                out[name] = name in f.read()
        except OSError:
            out[name] = False
    return out
surface = "--surface" in sys.argv  # the surface probe: versions and option fields, no torch/TensorRT import
if not surface:
    probe("torch", _torch)
    probe("tensorrt", _tensorrt)
probe("modelopt", _modelopt)
probe("tensorrt_llm", _trtllm)
if surface:
    probe("llm_api", _llm_api)
    probe("env_reads", _env_reads)
print({PROBE_MARKER!r} + json.dumps(out), flush=True)
"""

_VERSION = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?(.*)$")


@dataclass(frozen=True)
class Version:
    """A release number as TensorRT-LLM writes it: 1.2.1, 1.3.0rc29, 1.2.0.post1, 1.4.0.dev2026…

    Lane gating compares the release part only: 1.3.0rc0 counts as 1.3 (PEP 440 would sort it below 1.3.0,
    which is exactly the mistake that lets a 1.3 release candidate into the engine lane).
    """

    major: int
    minor: int
    patch: int
    suffix: str = ""

    @property
    def release(self) -> tuple[int, int, int]:
        return (self.major, self.minor, self.patch)

    @property
    def is_prerelease(self) -> bool:
        return self.pre is not None

    @property
    def pre(self) -> tuple[str, int] | None:
        """The pre-release tag, normalised: 1.3.0rc24 → ("rc", 24), 1.4.0.dev2 → ("dev", 2); None for a final
        release (1.2.1, and a post or build suffix such as 1.2.0.post1 or the Triton matrix's 1.0.3.2510)."""
        m = _PRE.match(self.suffix)
        if not m:
            return None
        kind = {"alpha": "a", "beta": "b", "pre": "rc"}.get(m.group(1).lower(), m.group(1).lower())
        return kind, int(m.group(2) or 0)

    @property
    def sort_key(self) -> tuple[tuple[int, int, int], int, int]:
        """Orders releases as pip does for what matters here: 1.3.0rc24 < 1.3.0rc25 < 1.3.0 < 1.3.1."""
        pre = self.pre
        if pre is None:
            return (self.release, len(_PRE_ORDER), 0)
        return (self.release, _PRE_ORDER.index(pre[0]), pre[1])

    def same_release(self, other: Version) -> bool:
        """Whether `other` is this release: the same numbers and the same pre-release tag. A pin without an rc
        suffix (1.2.0) is not satisfied by a release candidate of it (1.2.0rc8), nor 1.3.0rc24 by 1.3.0rc25; a
        post or build suffix (1.2.0.post1) does not make another release."""
        return self.release == other.release and self.pre == other.pre

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}{self.suffix}"


_PRE = re.compile(r"^[.\-]?(dev|alpha|beta|a|b|rc|pre)\.?(\d*)", re.IGNORECASE)
_PRE_ORDER = ("dev", "a", "b", "rc")


@functools.lru_cache(maxsize=512)  # Version is frozen; the registry asks for the same few releases thousands of times
def parse_version(text: str) -> Version:
    m = _VERSION.match(text or "")
    if not m:
        raise ValueError(f"'{text}' is not a version number such as 1.2.1 or 1.3.0rc2")
    return Version(int(m.group(1)), int(m.group(2)), int(m.group(3) or 0), m.group(4).strip())


class ToolchainInfo(BaseModel):
    """What the worker's interpreter can import, plus the driver. None: not installed / not found."""

    python: str | None = None
    tensorrt_llm: str | None = None
    tensorrt: str | None = None
    torch: str | None = None
    cuda: str | None = Field(default=None, description="CUDA runtime torch was built against")
    cuda_available: bool | None = None
    modelopt: str | None = None
    driver: str | None = None
    cuda_driver: str | None = Field(default=None, description="newest CUDA the driver supports")
    errors: dict[str, str] = Field(default_factory=dict)

    def versions(self) -> dict[str, str]:
        """The non-empty versions, for keys, manifests and MLflow tags."""
        keys = ("tensorrt_llm", "tensorrt", "torch", "cuda", "modelopt", "driver", "cuda_driver")
        return {k: str(getattr(self, k)) for k in keys if getattr(self, k)}


MAX_PROBE_BYTES = 1 << 20  # the probe prints a few hundred bytes of versions and errors


def parse_probe_output(text: str) -> JsonObject:
    """The JSON of the marker line; everything else (banners, warnings) is ignored."""
    for line in reversed(text.splitlines()):
        idx = line.find(PROBE_MARKER)
        if idx >= 0:
            try:
                data = parse_json(line[idx + len(PROBE_MARKER):], what="the result line", max_bytes=MAX_PROBE_BYTES)
            except DocumentError as err:
                raise ToolError(f"toolchain probe printed a malformed result line ({err}): {line[:200]}") from None
            if not isinstance(data, dict):
                raise ToolError(f"toolchain probe printed a malformed result line (not an object): {line[:200]}")
            return data
    raise ToolError("toolchain probe printed no result line; the interpreter may have crashed at import:\n"
                    + "\n".join(text.splitlines()[-15:]))


def toolchain_from_probe(data: JsonObject, driver: str | None = None,
                         cuda_driver: str | None = None) -> ToolchainInfo:
    fields = {k: data.get(k) for k in ("python", "tensorrt_llm", "tensorrt", "torch", "cuda", "cuda_available",
                                        "modelopt")}
    return ToolchainInfo(**fields, driver=driver, cuda_driver=cuda_driver, errors=dict(data.get("errors") or {}))


def detect_toolchain(python: str | None = None, *, timeout_s: float = 300.0, log_dir: Path | None = None,
                     with_driver: bool = True) -> ToolchainInfo:
    """Probe `python` (default: this interpreter) for TRT-LLM, TensorRT, torch/CUDA and ModelOpt; add the driver."""
    argv = [python or sys.executable, "-c", PROBE_SCRIPT]
    with tempfile.TemporaryDirectory(prefix="ef-probe-") as tmp:
        log = (log_dir or Path(tmp)) / "toolchain-probe.log"
        run_tool(argv, log, timeout_s=timeout_s, what="toolchain probe",
                 env={"PYTHONUNBUFFERED": "1", "TLLM_LOG_LEVEL": "error"})
        data = parse_probe_output(log.read_text(errors="replace"))
    driver = cuda_driver = None
    if with_driver:
        from enginefoundry.gpu.detect import detect_driver

        driver, cuda_driver = detect_driver()
    return toolchain_from_probe(data, driver, cuda_driver)


def installed_version(distribution: str) -> str | None:
    """A distribution's version from its metadata, without importing it (no banner, no CUDA init)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def require_trtllm(info: ToolchainInfo, lane: str, install_hint: str) -> Version:
    """The installed TRT-LLM version, or ToolError saying how to get one."""
    if not info.tensorrt_llm:
        why = info.errors.get("tensorrt_llm", "not installed")
        raise ToolError(
            f"lane {lane} needs TensorRT-LLM and the worker's Python cannot import it ({why}). {install_hint}"
        )
    try:
        return parse_version(info.tensorrt_llm)
    except ValueError:
        raise ToolError(f"TensorRT-LLM reports an unreadable version '{info.tensorrt_llm}'") from None


# --- the installed surface: what the worker's release accepts, read before any download or GPU time ---------

class ToolHelp(BaseModel):
    """A tool's flags and choice lists, parsed from its `--help` (argparse or click)."""

    flags: list[str] = Field(default_factory=list)
    choices: dict[str, list[str]] = Field(default_factory=dict)
    error: str | None = None


_OPTION_LINE = re.compile(r"^\s{0,8}(-\w,\s+)?--\w")
_FLAG = re.compile(r"--([A-Za-z0-9][\w-]*)(?:[ =](?:\{([^}]*)\}|\[([^\]]*\|[^\]]*)\]))?")


def parse_help(text: str) -> ToolHelp:
    """Flags and choices from argparse (`--qformat {fp8,int8_wo}`, usage `[--tp_size TP_SIZE]`) or click
    (`--backend [pytorch|trt]`, aliases `--tensor_parallel_size, --tp_size INTEGER`) help text. Only the usage
    block and option lines count: a flag named in another option's description is not the tool's."""
    flags: set[str] = set()
    choices: dict[str, list[str]] = {}
    in_usage = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.lower().startswith("usage:"):
            in_usage = True
        elif in_usage and not stripped:
            in_usage = False
        if not (in_usage or _OPTION_LINE.match(line)):
            continue
        spec = line if in_usage else re.split(r"(?<=\S)\s{2,}", line.strip(), maxsplit=1)[0]
        for m in _FLAG.finditer(spec):
            name = m.group(1).replace("-", "_")
            flags.add(name)
            values = m.group(2) or m.group(3)
            if values:
                sep = "," if m.group(2) else "|"
                choices[name] = [v.strip() for v in values.split(sep) if v.strip()]
    return ToolHelp(flags=sorted(flags), choices=choices)


class ToolSurface(BaseModel):
    """What the installed toolchain accepts: versions, each tool's flags, the LLM API option fields and the Triton
    templates' keys. Its digest joins the toolchain identity (unit key, manifest)."""

    tensorrt_llm: str | None = None
    modelopt: str | None = None
    tools: dict[str, ToolHelp] = Field(default_factory=dict)
    llm_api: dict[str, list[str]] | None = Field(default=None, description="'' → TorchLlmArgs fields; nested")
    triton_templates: dict[str, list[str]] | None = None
    env_reads: dict[str, bool] | None = Field(default=None, description="env var → the installed package reads it")
    errors: dict[str, str] = Field(default_factory=dict)

    def digest(self) -> str:
        """What the surface accepts, hashed. Error texts stay out (they carry log paths): an unreadable tool counts
        as "unavailable", the same on every host."""
        data = self.model_dump(mode="json", exclude={"errors"})
        for tool in data["tools"].values():
            tool["error"] = "unavailable" if tool["error"] else None
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


class UnsupportedByRelease(PreflightError):
    """A unit uses a flag, YAML key or template key the installed release lacks: refused before it runs."""

    def __init__(self, item: str, release: str, fix: str, more: list[str] | None = None) -> None:
        self.item, self.release, self.fix, self.more = item, release, fix, list(more or [])
        extra = f" (and {len(self.more)} more: {', '.join(self.more[:5])})" if self.more else ""
        super().__init__(f"{item} is not accepted by the installed {release}{extra}: {fix}")


_PLACEHOLDER = re.compile(r"\$\{(\w+)\}")


def template_keys(triton_dir: Path) -> dict[str, list[str]]:
    """`${key}` placeholders of each inflight_batcher_llm template under a Triton backend tree."""
    root = Path(triton_dir) / "all_models" / "inflight_batcher_llm"
    out = {}
    for cfg in sorted(root.glob("*/config.pbtxt")):
        out[cfg.parent.name] = sorted(set(_PLACEHOLDER.findall(cfg.read_text(errors="replace"))))
    return out


LLMAPI_TEMPLATE = "llmapi/tensorrt_llm"  # the LLM API (PyTorch backend) Triton model under all_models/
LLMAPI_FILES = ("config.pbtxt", "1/model.py", "1/model.yaml")


def llmapi_template_keys(triton_dir: Path) -> dict[str, list[str]]:
    """{LLMAPI_TEMPLATE: dotted keys of its model.yaml (top level and triton_config.*)} when the tree has the LLM API
    Triton model (config.pbtxt, 1/model.py, 1/model.yaml), else {}. An unreadable model.yaml counts as absent."""
    root = Path(triton_dir) / "all_models" / LLMAPI_TEMPLATE
    if not all((root / name).is_file() for name in LLMAPI_FILES):
        return {}
    try:
        data = yaml.safe_load((root / "1" / "model.yaml").read_text(errors="replace"))
    except yaml.YAMLError:
        return {}
    if not isinstance(data, dict):
        return {}
    keys = [str(k) for k in data]
    triton = data.get("triton_config")
    if isinstance(triton, dict):
        keys += [f"triton_config.{k}" for k in triton]
    return {LLMAPI_TEMPLATE: sorted(keys)}


def probe_surface(python: str, tools: dict[str, list[str]], triton_dir: Path | None = None, *,
                  timeout_s: float = 300.0) -> ToolSurface:
    """Run the version/LLM-API probe in `python` and `<tool> --help` for each tool; read the templates."""
    with tempfile.TemporaryDirectory(prefix="ef-surface-") as tmp:
        log = Path(tmp) / "surface-probe.log"
        run_tool([python, "-c", PROBE_SCRIPT, "--surface"], log, timeout_s=timeout_s, what="toolchain probe",
                 env={"PYTHONUNBUFFERED": "1", "TLLM_LOG_LEVEL": "error"})
        data = parse_probe_output(log.read_text(errors="replace"))
        surface = ToolSurface(tensorrt_llm=data.get("tensorrt_llm"), modelopt=data.get("modelopt"),
                              llm_api=data.get("llm_api"), env_reads=data.get("env_reads"),
                              errors=dict(data.get("errors") or {}))
        for name, argv in sorted(tools.items()):
            help_log = Path(tmp) / f"help-{len(surface.tools)}.log"
            try:
                run_tool([*argv, "--help"], help_log, timeout_s=timeout_s, what=f"{name} --help",
                         env={"TLLM_LOG_LEVEL": "error", "COLUMNS": "200"})
                surface.tools[name] = parse_help(help_log.read_text(errors="replace"))
            except ToolError as err:
                surface.tools[name] = ToolHelp(error=str(err).splitlines()[0][:300])
    if triton_dir is not None and Path(triton_dir).is_dir():
        surface.triton_templates = {**template_keys(Path(triton_dir)), **llmapi_template_keys(Path(triton_dir))}
    return surface


class ToolUse(Protocol):
    """What a command says it uses, for the check against a release (enginefoundry.lanes.base.Command)."""

    @property
    def argv(self) -> list[str]: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def tool(self) -> str | None: ...
    @property
    def llm_api_keys(self) -> list[str]: ...
    @property
    def template_keys(self) -> Mapping[str, list[str]]: ...


def check_against_surface(commands: Sequence[ToolUse], surface: ToolSurface) -> None:
    """UnsupportedByRelease for the first command part the surface lacks (every one is named in `more`).

    A command says what it uses: `tool` (the registry's tool name), its argv flags, `llm_api_keys` (dotted
    paths of the YAML it reads) and `template_keys` ({template: keys}). A tool whose --help could not be read
    refuses the unit too: a missing tool fails later anyway, and costs GPU time first."""
    release = f"TensorRT-LLM {surface.tensorrt_llm or '(not importable)'}" + (
        f" / ModelOpt {surface.modelopt}" if surface.modelopt else "")
    missing: list[tuple[str, str]] = []
    for cmd in commands:
        tool = cmd.tool
        if tool:
            help_ = surface.tools.get(tool)
            if help_ is None or help_.error:
                why = help_.error if help_ else "not probed"
                missing.append((f"{tool} (its --help: {why})", f"install the release's {tool} or point the lane "
                                                                  "option at it"))
            else:
                argv = list(cmd.argv)
                for i, tok in enumerate(argv):
                    if not tok.startswith("--"):
                        continue
                    name = tok[2:].split("=", 1)[0].replace("-", "_")
                    if name not in help_.flags:
                        missing.append((f"{tool} --{name}", "upgrade to a release that has it, or drop the spec "
                                                            "setting that emits it"))
                        continue
                    value = argv[i + 1] if i + 1 < len(argv) else None
                    allowed = help_.choices.get(name)
                    if allowed and value is not None and not value.startswith("--") and value not in allowed:
                        missing.append((f"{tool} --{name} {value}", f"this release accepts {', '.join(allowed)}"))
        for key in cmd.llm_api_keys:
            if surface.llm_api is None:
                missing.append(("the LLM API option fields (TorchLlmArgs)", "install a TensorRT-LLM whose "
                                "tensorrt_llm.llmapi.llm_args has TorchLlmArgs"))
                break
            name, is_choice, value = key.partition("=")
            parent, _, leaf = name.rpartition(".")
            if is_choice:  # a value that picks an upstream class (speculative_config.decoding_type=Eagle3)
                parent, leaf = name, value
            fields = surface.llm_api.get(parent)
            if fields is not None and leaf not in fields:
                missing.append((f"LLM API option {key}", "remove the lane option that writes it, or use a "
                                                         "release that has it"))
        for template, keys in cmd.template_keys.items():
            if surface.triton_templates is None:
                missing.append((f"the Triton template {template} (under all_models/)", "set lane option "
                                "triton_dir to the release's Triton backend tree"))
                break
            have = set(surface.triton_templates.get(template, []))
            for key in keys:
                if key not in have:
                    missing.append((f"Triton template {template} key ${{{key}}}", "use the Triton backend tree "
                                                                                 "of the installed release"))
    if missing:
        (item, fix), rest = missing[0], [m[0] for m in missing[1:]]
        raise UnsupportedByRelease(item, release, fix, rest)
