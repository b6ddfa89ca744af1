"""GPU detection and target matching.

NVML (through `pynvml`, from nvidia-ml-py) when it is importable and a driver answers, else `nvidia-smi`. A worker
refuses a unit whose target does not match its GPUs: TensorRT engines are specific to the SM version and, per
NVIDIA, to the exact GPU model (#222, #1807), so the SKU list of a target matters as much as its architecture.
"""

from __future__ import annotations

import csv
import io
import shlex
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NotRequired

from pydantic import BaseModel, ConfigDict, Field, model_validator
from typing_extensions import TypedDict

from enginefoundry.errors import PreflightError, ToolError
from enginefoundry.runner import run_tool
from enginefoundry.schemas.bundle_info import GpuFacts
from enginefoundry.spec import Arch, Target

# The columns enginefoundry asks nvidia-smi for, in this order.
QUERY_FIELDS = ("index", "name", "uuid", "compute_cap", "memory.total", "driver_version")
NVIDIA_SMI_ARGV = ["nvidia-smi", f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv,noheader,nounits"]
MIB = 1024 * 1024


class NvmlGpu(TypedDict):
    """One GPU of an NVML snapshot."""

    index: int
    name: str
    compute_capability: list[int] | str
    memory_total: int  # bytes
    uuid: NotRequired[str | None]


class NvmlSnapshot(TypedDict):
    """The NVML snapshot (`nvml_snapshot`, and the fixtures tests/fixtures/gpu/*/nvml.json)."""

    driver: NotRequired[str | None]
    cuda_driver: NotRequired[int | None]
    gpus: list[NvmlGpu]


class GPUInfo(BaseModel):
    """One visible GPU, as recorded next to every artifact built on it (TensorRT-LLM records none of this)."""

    model_config = ConfigDict(frozen=True)

    index: int = Field(ge=0)
    name: str
    uuid: str | None = None
    compute_capability: str = Field(description='"major.minor", e.g. "9.0"')
    arch: str = Field(default="", description='"sm" + major + minor, e.g. "sm90"; derived from compute_capability')
    memory_total_mib: int = Field(ge=0)
    driver_version: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _arch_from_cc(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "compute_capability" not in data:
            return data
        major, _, minor = str(data["compute_capability"]).strip().partition(".")
        if not (major.isdigit() and minor.isdigit()):
            raise ValueError(f"compute capability '{data['compute_capability']}' is not major.minor, e.g. 9.0")
        cc = f"{int(major)}.{int(minor)}"
        derived = arch_of(cc)
        if data.get("arch") and data["arch"] != derived:
            raise ValueError(f"arch {data['arch']} does not match compute capability {cc}")
        return {**data, "compute_capability": cc, "arch": derived}

    @property
    def memory_gib(self) -> float:
        return self.memory_total_mib / 1024

    def facts(self) -> GpuFacts:
        """What a manifest records about the build GPU."""
        return {"name": self.name, "compute_capability": self.compute_capability, "arch": self.arch,
                "memory_total_mib": self.memory_total_mib, "driver_version": self.driver_version}


def arch_of(compute_capability: str) -> str:
    """ "9.0" → "sm90", "8.9" → "sm89", "10.0" → "sm100", "12.0" → "sm120"."""
    major, _, minor = compute_capability.partition(".")
    return f"sm{int(major)}{int(minor or 0)}"


def _clean(value: str) -> str | None:
    v = value.strip()
    for unit in (" MiB", " W", " MHz", " %"):
        v = v.removesuffix(unit)
    return None if v in ("", "N/A", "[N/A]", "[Not Supported]") else v


def _header_field(cell: str) -> str:
    # "memory.total [MiB]" → "memory.total"
    return cell.strip().split(" [", 1)[0].strip()


def parse_smi_csv(text: str, fields: Sequence[str] = QUERY_FIELDS) -> list[GPUInfo]:
    """Rows of `nvidia-smi --query-gpu=… --format=csv[,noheader][,nounits]`.

    A header line (format=csv) names the columns; without one, `fields` says what was queried. Units
    ("143771 MiB") are stripped. A missing index column numbers the rows in order.
    """
    rows = [r for r in csv.reader(io.StringIO(text), skipinitialspace=True) if any(c.strip() for c in r)]
    if not rows:
        return []
    names = list(fields)
    if _header_field(rows[0][0]) in {"index", "name", "uuid", "compute_cap", "pci.bus_id", "gpu_name"}:
        names = [_header_field(c) for c in rows[0]]
        rows = rows[1:]
    missing = [f for f in ("name", "compute_cap", "memory.total") if f not in names]
    if missing:
        raise ToolError(f"nvidia-smi output lacks the columns {missing}; query them with {shlex.join(NVIDIA_SMI_ARGV)}")
    gpus = []
    for pos, row in enumerate(rows):
        if len(row) != len(names):
            raise ToolError(f"nvidia-smi row {pos + 1} has {len(row)} columns, expected {len(names)}: {row}")
        cell = {n: _clean(v) for n, v in zip(names, row, strict=True)}
        index, compute_cap = cell.get("index"), cell.get("compute_cap")
        if not compute_cap:
            raise ToolError(f"nvidia-smi row {pos + 1} has no compute capability; the driver may be too old "
                            "(compute_cap needs driver 510+)")
        try:
            gpus.append(GPUInfo(
                index=int(index) if index else pos,
                name=cell["name"] or "unknown",
                uuid=cell.get("uuid"),
                compute_capability=compute_cap,
                memory_total_mib=int(float(cell["memory.total"] or 0)),
                driver_version=cell.get("driver_version"),
            ))
        except ValueError as err:
            raise ToolError(f"nvidia-smi row {pos + 1} is not understood ({err}): {row}") from None
    return gpus


def parse_nvml_json(data: NvmlSnapshot) -> list[GPUInfo]:
    """The NVML snapshot shape (tests/fixtures/gpu/*/nvml.json, also what `nvml_snapshot` returns)."""
    driver = data.get("driver")
    gpus = []
    for g in data.get("gpus", []):
        cc = g["compute_capability"]
        cc_text = f"{cc[0]}.{cc[1]}" if isinstance(cc, list) else str(cc)
        gpus.append(GPUInfo(index=int(g["index"]), name=str(g["name"]), uuid=g.get("uuid"),
                            compute_capability=cc_text, memory_total_mib=int(g["memory_total"]) // MIB,
                            driver_version=driver))
    return gpus


def cuda_driver_text(value: int | None) -> str | None:
    """NVML's CUDA driver version integer, 13000 → "13.0"."""
    if not value:
        return None
    return f"{value // 1000}.{(value % 1000) // 10}"


def nvml_snapshot() -> NvmlSnapshot:
    """Driver and per-GPU facts through NVML. Raises ToolError when pynvml or the driver is missing."""
    try:
        import pynvml
    except ImportError:
        raise ToolError("pynvml is not importable (pip install nvidia-ml-py)") from None
    try:
        pynvml.nvmlInit()
    except Exception as err:  # pynvml.NVMLError_LibraryNotFound, _DriverNotLoaded, …
        raise ToolError(f"NVML did not initialise ({err}); no NVIDIA driver on this host?") from None
    try:
        def text(v: bytes | str) -> str:
            return v.decode() if isinstance(v, bytes) else str(v)

        snap: NvmlSnapshot = {"driver": text(pynvml.nvmlSystemGetDriverVersion()),
                              "cuda_driver": pynvml.nvmlSystemGetCudaDriverVersion(), "gpus": []}
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            snap["gpus"].append({
                "index": i,
                "name": text(pynvml.nvmlDeviceGetName(h)),
                "compute_capability": list(pynvml.nvmlDeviceGetCudaComputeCapability(h)),
                "memory_total": int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                "uuid": text(pynvml.nvmlDeviceGetUUID(h)),
            })
        return snap
    finally:
        pynvml.nvmlShutdown()


def _smi(log_dir: Path | None) -> list[GPUInfo]:
    with tempfile.TemporaryDirectory(prefix="ef-smi-") as tmp:
        log = (log_dir or Path(tmp)) / "nvidia-smi.log"
        run_tool(NVIDIA_SMI_ARGV, log, timeout_s=60, what="nvidia-smi")
        return parse_smi_csv(log.read_text(errors="replace"))


def detect_gpus(log_dir: Path | None = None) -> list[GPUInfo]:
    """Visible GPUs (NVML first, nvidia-smi second). Raises ToolError saying why neither worked."""
    try:
        return parse_nvml_json(nvml_snapshot())
    except ToolError as err:
        nvml_why = str(err)
    try:
        return _smi(log_dir)
    except ToolError as err:
        smi_why = str(err).splitlines()[0]
    raise ToolError(f"no NVIDIA GPU detected: NVML: {nvml_why}; nvidia-smi: {smi_why}")


def detect_driver() -> tuple[str | None, str | None]:
    """(driver version, newest CUDA the driver supports), or Nones when there is no driver."""
    try:
        snap = nvml_snapshot()
        return snap.get("driver"), cuda_driver_text(snap.get("cuda_driver"))
    except ToolError:
        pass
    try:
        gpus = _smi(None)
    except ToolError:
        return None, None
    return (gpus[0].driver_version if gpus else None), None


def gpu_unavailable_reason() -> str | None:
    """None when a GPU is visible, else why not (for pytest skip reasons and plan notes)."""
    try:
        return None if detect_gpus() else "no NVIDIA GPU is visible"
    except ToolError as err:
        return str(err)


def describe_gpus(gpus: Sequence[GPUInfo]) -> str:
    if not gpus:
        return "no GPU"
    counts: dict[str, int] = {}
    for g in gpus:
        key = f"{g.name} ({g.arch}, {g.memory_gib:.0f} GiB)"
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{n}× {k}" for k, n in counts.items())


def match_target(target: Target, gpus: Sequence[GPUInfo], count: int | None = None) -> list[GPUInfo]:
    """The GPUs of this host that a unit for `target` runs on; PreflightError saying what differs otherwise.

    `count` is how many the unit uses (its tp × pp, which is what its cluster job asks for); by default the
    target's `gpu_count`. The GPUs returned are all one model: an engine built on one SKU is not meant for
    another of the same SM (facts §2), so a mixed host must have that many GPUs of a single matching model.
    """
    if target.arch is Arch.CPU:
        return []
    needed = count if count is not None else target.gpu_count
    where = f"run this unit on a worker of pool {target.pool}"
    wanted = f"{needed}× {target.arch.value}" + (f" ({'/'.join(target.sku)})" if target.sku else "")
    if not gpus:
        raise PreflightError(f"target {target.name} needs {wanted} and this host has no visible GPU; {where}")
    same_arch = [g for g in gpus if g.arch == target.arch.value]
    if not same_arch:
        raise PreflightError(f"target {target.name} needs {wanted}; this host has {describe_gpus(gpus)}: "
                             f"the GPU architecture does not match; {where}")
    if target.sku:
        skus = [s.lower() for s in target.sku]
        matching = [g for g in same_arch if any(s in g.name.lower() for s in skus)]
        if not matching:
            raise PreflightError(f"target {target.name} needs {wanted}; this host has {describe_gpus(gpus)}: "
                                 f"same architecture, but the SKU is not one of {target.sku}; {where}")
    else:
        matching = same_arch
    by_model: dict[str, list[GPUInfo]] = {}
    for g in matching:
        by_model.setdefault(g.name, []).append(g)
    for group in sorted(by_model.values(), key=len, reverse=True):
        if len(group) >= needed:
            return sorted(group, key=lambda g: g.index)[:needed]
    if len(matching) >= needed:
        raise PreflightError(f"target {target.name} needs {wanted} of one GPU model; this host mixes "
                             f"{describe_gpus(matching)}; build and serve on one GPU model (TensorRT-LLM #1807)")
    raise PreflightError(f"target {target.name} needs {wanted}; this host has {len(matching)} matching "
                         f"({describe_gpus(matching)}); {where} or lower the variant's tp × pp")

