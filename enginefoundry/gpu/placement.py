"""Placement: may this machine build a unit of this target?

In cluster mode a unit deployment is picked up by whichever worker polls its pool; a mislabelled node or a
pool shared by two GPU models would otherwise build an engine for the wrong GPU, which TensorRT refuses to
load later (or loads and runs slowly). The worker checks before it fetches or converts anything.
"""

from __future__ import annotations

from enginefoundry.errors import PreflightError, ToolError
from enginefoundry.spec import Arch, Target


def check_placement(target: Target, work_pool: str | None, gpus_needed: int | None = None) -> str:
    """A one-line description of what this machine offers the target; PreflightError saying why not.
    `gpus_needed` is the unit's tp × pp: its cluster job asks for that many GPUs, not the target's count."""
    if work_pool and work_pool != target.pool:
        raise PreflightError(f"target {target.name} belongs to work pool {target.pool}, but this run came from "
                             f"pool {work_pool}: dispatch it to build-unit/{target.pool}")
    if target.arch is Arch.CPU:
        return f"target {target.name} is a cpu target: any machine builds it"
    try:
        from enginefoundry.gpu.detect import describe_gpus, detect_gpus, match_target
    except ImportError as err:  # the GPU module ships with the trtllm lanes; a bare install lacks it
        raise PreflightError(f"target {target.name} needs {target.arch.value} GPUs and GPU detection is not "
                             f"available here ({err}); run this unit on a worker of pool {target.pool}") from None
    try:
        gpus = detect_gpus()
    except ToolError as err:
        raise PreflightError(f"target {target.name} needs {gpus_needed or target.gpu_count}× {target.arch.value} "
                             f"and this machine "
                             f"has no usable GPU ({str(err).splitlines()[0]}); run this unit on a worker of pool "
                             f"{target.pool}") from None
    chosen = match_target(target, gpus, gpus_needed)
    return f"target {target.name} matches {describe_gpus(chosen)}"


def check_toolchain(unit: str, planned: dict[str, str], local: dict[str, str]) -> None:
    """The worker's toolchain (the lane's versions here) is the one the unit's key was computed with (`planned`,
    from its key components; empty: nothing to compare, the parent computed no key); PreflightError naming each
    version that differs."""
    if not planned or dict(sorted(local.items())) == planned:
        return
    diff = ", ".join(f"{k} {planned.get(k)} → {local.get(k)}" for k in sorted(set(planned) | set(local))
                     if planned.get(k) != local.get(k))
    raise PreflightError(f"unit {unit}: this worker's toolchain differs from the one its key was computed "
                         f"with ({diff}); run workers and the parent from the same image")
