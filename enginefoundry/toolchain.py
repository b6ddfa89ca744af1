"""Which TensorRT-LLM, TensorRT, CUDA and driver a worker has.

`import tensorrt_llm` prints a banner on stdout (`[TensorRT-LLM] TensorRT LLM version: …`) and is slow, so the
versions are read in a child interpreter that prints one JSON line behind a marker; only that line is parsed.
The driver comes from the GPU detection (NVML or nvidia-smi), which needs no import of the toolkit.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field

from enginefoundry.errors import ToolError
from enginefoundry.runner import run_tool

PROBE_MARKER = "ENGINEFOUNDRY_TOOLCHAIN_JSON "

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
probe("torch", _torch)
probe("tensorrt", _tensorrt)
probe("modelopt", _modelopt)
probe("tensorrt_llm", _trtllm)
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
        return bool(re.match(r"^[.\-]?(rc|a|b|alpha|beta|dev|pre)", self.suffix, re.IGNORECASE))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}{self.suffix}"


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


def parse_probe_output(text: str) -> dict:
    """The JSON of the marker line; everything else (banners, warnings) is ignored."""
    for line in reversed(text.splitlines()):
        idx = line.find(PROBE_MARKER)
        if idx >= 0:
            try:
                return json.loads(line[idx + len(PROBE_MARKER):])
            except json.JSONDecodeError as err:
                raise ToolError(f"toolchain probe printed a malformed result line ({err}): {line[:200]}") from None
    raise ToolError("toolchain probe printed no result line; the interpreter may have crashed at import:\n"
                    + "\n".join(text.splitlines()[-15:]))


def toolchain_from_probe(data: dict, driver: str | None = None, cuda_driver: str | None = None) -> ToolchainInfo:
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
        from enginefoundry.gpu import detect_driver

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
