"""GPU power, utilization and memory while a benchmark point runs, for tokens per second per watt.

A background thread samples through NVML when it can (no subprocess, exact milliwatts) and through
`nvidia-smi --query-gpu=… -lms …` otherwise. A host without a GPU gets an explicit "no GPU" summary,
never a silent zero, so a CPU run and a broken sampler cannot be confused.
"""

from __future__ import annotations

import contextlib
import csv
import io
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from enginefoundry.runner import forget_reaped, reap_with_this_process

# The query the nvidia-smi sampler runs, in this column order (noheader output has no names).
QUERY_FIELDS = ("index", "power.draw", "utilization.gpu", "memory.used")
_MISSING = {"", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]", "[gpu is lost]"}

Source = Literal["nvml", "nvidia-smi", "none"]


class GpuSample(BaseModel):
    t: float  # unix time of the reading, seconds
    round: int  # one round reads every sampled GPU once; power is summed within a round
    index: int
    power_w: float | None = None
    util_pct: float | None = None
    memory_used_mib: float | None = None


class TelemetrySummary(BaseModel):
    available: bool
    source: Source
    detail: str
    gpus: list[int] = Field(default_factory=list)
    samples: int = 0
    window_s: float | None = None
    avg_power_w: float | None = None  # mean over rounds of the power summed over the sampled GPUs
    max_power_w: float | None = None
    avg_util_pct: float | None = None  # mean over GPUs and rounds
    max_memory_used_mib: float | None = None  # the fullest GPU at its fullest

    def metrics(self) -> dict[str, float]:
        """Flat numbers for MLflow; nothing when no GPU was sampled."""
        out: dict[str, float] = {}
        for name in ("avg_power_w", "max_power_w", "avg_util_pct", "max_memory_used_mib"):
            value = getattr(self, name)
            if value is not None:
                out[f"gpu_{name}"] = value
        return out


def no_gpu(detail: str) -> TelemetrySummary:
    return TelemetrySummary(available=False, source="none", detail=f"no GPU: {detail}")


# ---------------------------------------------------------------------------------------------- parsing


def _number(text: str) -> float | None:
    """'127.08', '127.08 W', '0 %', '80 MiB' → float; N/A and 'not supported' → None."""
    value = text.strip()
    if value.lower() in _MISSING:
        return None
    value = value.split()[0] if value else value
    try:
        return float(value)
    except ValueError:
        return None


def _field_name(header: str) -> str:
    """'power.draw [W]' → 'power.draw' (nvidia-smi puts units in the header unless nounits)."""
    return header.split("[")[0].strip()


def parse_query_gpu(text: str, *, fields: tuple[str, ...] = QUERY_FIELDS, t0: float = 0.0,
                    dt: float = 0.0) -> list[GpuSample]:
    """Parse `nvidia-smi --query-gpu` CSV, with or without header and units.

    With a header, columns are found by name (any query order, extra columns ignored); without one they
    are taken in `fields` order. Rows get rounds by index repetition, and synthetic times t0 + round·dt
    (a file has no clock; the live sampler stamps real times instead).
    """
    rows = [r for r in csv.reader(io.StringIO(text), skipinitialspace=True) if r and any(c.strip() for c in r)]
    if not rows:
        return []
    names = list(fields)
    if _field_name(rows[0][0]) == "index" and _number(rows[0][0]) is None:
        names = [_field_name(c) for c in rows[0]]
        rows = rows[1:]
    col = {name: i for i, name in enumerate(names)}
    if "index" not in col:
        raise ValueError(f"nvidia-smi CSV without an index column (columns: {names})")

    def get(row: list[str], name: str) -> float | None:
        i = col.get(name)
        return _number(row[i]) if i is not None and i < len(row) else None

    out: list[GpuSample] = []
    seen: set[int] = set()
    round_no = 0
    for row in rows:
        idx = get(row, "index")
        if idx is None:
            continue
        if int(idx) in seen:  # every GPU was read once: the next line starts a new round
            round_no += 1
            seen.clear()
        seen.add(int(idx))
        out.append(GpuSample(t=t0 + round_no * dt, round=round_no, index=int(idx), power_w=get(row, "power.draw"),
                             util_pct=get(row, "utilization.gpu"), memory_used_mib=get(row, "memory.used")))
    return out


def summarize(samples: list[GpuSample], *, source: Source, start: float | None = None,
              end: float | None = None) -> TelemetrySummary:
    """Summary of the samples inside [start, end] (the benchmark's measured window) when given.

    A window too short to hold a sample falls back to every sample, and the detail says so: a summary
    of the tool's start-up idle is still better evidence than none, as long as it is labelled.
    """
    if not samples:
        return TelemetrySummary(available=False, source=source, detail=f"{source}: no samples were read")
    chosen = samples
    detail = f"{source}: all samples"
    if start is not None and end is not None:
        inside = [s for s in samples if start <= s.t <= end]
        if inside:
            chosen, detail = inside, f"{source}: samples inside the measured window"
        else:
            detail = f"{source}: no sample inside the {end - start:.2f}s measured window; all samples used"
    rounds: dict[int, list[GpuSample]] = {}
    for s in chosen:
        rounds.setdefault(s.round, []).append(s)
    power = [w for w in map(_round_power_w, rounds.values()) if w is not None]
    util = [s.util_pct for s in chosen if s.util_pct is not None]
    mem = [s.memory_used_mib for s in chosen if s.memory_used_mib is not None]
    times = [s.t for s in chosen]
    return TelemetrySummary(
        available=True, source=source, detail=detail, gpus=sorted({s.index for s in chosen}), samples=len(chosen),
        window_s=round(max(times) - min(times), 3),
        avg_power_w=round(sum(power) / len(power), 2) if power else None,
        max_power_w=round(max(power), 2) if power else None,
        avg_util_pct=round(sum(util) / len(util), 2) if util else None,
        max_memory_used_mib=max(mem) if mem else None,
    )


def aiperf_window(export: dict[str, object]) -> tuple[float, float] | None:
    """AIPerf's measured window (start_time/end_time: naive local ISO times) as unix seconds."""
    try:
        start = datetime.fromisoformat(str(export["start_time"])).timestamp()
        end = datetime.fromisoformat(str(export["end_time"])).timestamp()
    except (KeyError, ValueError, TypeError):
        return None
    return (start, end) if end > start else None


# ---------------------------------------------------------------------------------------------- sampling


class Backend(BaseModel):
    """What this host can sample with; `source` none means no GPU (the detail says why)."""

    source: Source
    detail: str
    gpus: list[int] = Field(default_factory=list)


def detect_backend(gpu_indices: list[int] | None = None) -> Backend:
    """NVML when pynvml imports and finds a GPU; else nvidia-smi when it lists one; else no GPU."""
    reasons = []
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
        if count:
            gpus = [i for i in range(count) if gpu_indices is None or i in gpu_indices]
            return Backend(source="nvml", detail=f"NVML, {count} GPU(s)", gpus=gpus)
        reasons.append("NVML sees 0 GPUs")
    except ImportError:
        reasons.append("pynvml is not installed")
    except Exception as err:  # NVMLError_LibraryNotFound, _DriverNotLoaded, …: all mean no usable GPU here
        reasons.append(f"NVML: {type(err).__name__}")
    smi = shutil.which("nvidia-smi")
    if smi is None:
        reasons.append("nvidia-smi is not on PATH")
        return Backend(source="none", detail="; ".join(reasons))
    try:
        listed = subprocess.run([smi, "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                                text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as err:
        reasons.append(f"nvidia-smi did not answer: {err}")
        return Backend(source="none", detail="; ".join(reasons))
    found = [int(x) for x in listed.stdout.split() if x.strip().isdigit()] if listed.returncode == 0 else []
    if not found:
        reasons.append(f"nvidia-smi lists no GPU (exit {listed.returncode}: {listed.stdout.strip()[:120]})")
        return Backend(source="none", detail="; ".join(reasons))
    gpus = [i for i in found if gpu_indices is None or i in gpu_indices]
    return Backend(source="nvidia-smi", detail=f"nvidia-smi, {len(found)} GPU(s)", gpus=gpus)


class GpuSampler:
    """Samples in a background thread between start() and stop(); stop() returns the samples."""

    def __init__(self, backend: Backend, interval_ms: int = 200) -> None:
        self.backend = backend
        self.interval_ms = interval_ms
        self.samples: list[GpuSample] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        if self.backend.source == "none":
            return
        target = self._run_nvml if self.backend.source == "nvml" else self._run_smi
        self._thread = threading.Thread(target=target, name="gpu-telemetry", daemon=True)
        self._thread.start()

    def stop(self) -> list[GpuSample]:
        self._stop.set()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=5)
        if self._proc is not None:
            forget_reaped(self._proc.pid, group=False)
        return self.samples

    def summary(self, window: tuple[float, float] | None = None) -> TelemetrySummary:
        if self.backend.source == "none":
            return no_gpu(self.backend.detail)
        result = summarize(self.samples, source=self.backend.source,
                           start=window[0] if window else None, end=window[1] if window else None)
        if self.error:
            result = result.model_copy(update={"detail": f"{result.detail}; sampler error: {self.error}"})
        return result

    def _run_nvml(self) -> None:
        import pynvml

        try:
            pynvml.nvmlInit()
        except Exception as err:
            self.error = f"NVML init failed: {type(err).__name__}"
            return
        try:
            handles = [(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in self.backend.gpus]
            round_no = 0
            while not self._stop.is_set():
                now = time.time()
                for idx, h in handles:
                    self.samples.append(GpuSample(
                        t=now, round=round_no, index=idx,
                        power_w=_nvml(lambda d: pynvml.nvmlDeviceGetPowerUsage(d) / 1000.0, h),
                        util_pct=_nvml(lambda d: float(pynvml.nvmlDeviceGetUtilizationRates(d).gpu), h),
                        memory_used_mib=_nvml(lambda d: pynvml.nvmlDeviceGetMemoryInfo(d).used / 2**20, h),
                    ))
                round_no += 1
                self._stop.wait(self.interval_ms / 1000)
        except Exception as err:  # a lost GPU mid-run must not kill the benchmark; the summary says so
            self.error = f"{type(err).__name__}: {err}"
        finally:
            with contextlib.suppress(Exception):
                pynvml.nvmlShutdown()

    def _run_smi(self) -> None:
        argv = ["nvidia-smi", f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv,noheader,nounits",
                f"-lms={self.interval_ms}"]
        if self.backend.gpus:
            argv.append(f"--id={','.join(str(i) for i in self.backend.gpus)}")
        try:
            self._proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                          bufsize=1)
        except OSError as err:
            self.error = f"nvidia-smi did not start: {err}"
            return
        # Started from a thread, so no parent-death signal (it fires when the thread ends): the reaper kills it
        # if this process dies before stop().
        reap_with_this_process(self._proc.pid, group=False)
        assert self._proc.stdout is not None
        seen: set[int] = set()
        round_no = 0
        for line in self._proc.stdout:
            parsed = parse_query_gpu(line)
            for s in parsed:
                if s.index in seen:
                    round_no += 1
                    seen.clear()
                seen.add(s.index)
                self.samples.append(s.model_copy(update={"t": time.time(), "round": round_no}))
            if self._stop.is_set():
                break


def _round_power_w(samples: list[GpuSample]) -> float | None:
    """The summed power of one sampling round over its GPUs; None when any GPU of the round lacks a reading."""
    watts = [s.power_w for s in samples if s.power_w is not None]
    return sum(watts) if len(watts) == len(samples) else None


def _nvml(read: Callable[[object], float], handle: object) -> float | None:
    """One NVML reading of a device handle, rounded; None where the device does not report it."""
    try:
        return round(float(read(handle)), 2)
    except Exception:  # NVMLError_NotSupported on some SKUs and MIG slices: a missing column, not a failure
        return None


@contextlib.contextmanager
def sampling(backend: Backend | None, interval_ms: int = 200) -> Iterator[GpuSampler | None]:
    """`with sampling(backend) as s:` runs the sampler around the block; None backend → no sampling."""
    if backend is None:
        yield None
        return
    sampler = GpuSampler(backend, interval_ms)
    sampler.start()
    try:
        yield sampler
    finally:
        sampler.stop()
