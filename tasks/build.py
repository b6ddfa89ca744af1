"""Stage: build the unit's bundle on a device of its target."""

from __future__ import annotations

import shutil
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from enginefoundry.inputs.units import Unit
from enginefoundry.lanes import BuildResult, get_lane
from enginefoundry.settings import work_root
from enginefoundry.spec import BuildSpec
from enginefoundry.tasks._log import progress_logger


@task(name="build bundle", task_run_name="build {unit.name}", cache_policy=NO_CACHE)
def build_bundle(spec: BuildSpec, unit: Unit, checkpoint_dir: str, key: str, draft_dir: str | None = None,
               adapter_dirs: dict[str, str] | None = None) -> BuildResult:
    """`adapter_dirs`: name → fetched adapter folder, for a unit serving them (model.adapter_mode serve)."""
    log = progress_logger()
    workdir = work_root() / "units" / key[:16]
    shutil.rmtree(workdir / "bundle", ignore_errors=True)
    workdir.mkdir(parents=True, exist_ok=True)
    log(f"build: {unit.name} on {unit.target.arch.value}")
    result = get_lane(spec.lane).build(spec, unit, Path(checkpoint_dir), workdir,
                                       Path(draft_dir) if draft_dir is not None else None,
                                       {n: Path(d) for n, d in adapter_dirs.items()} if adapter_dirs else None)
    log(f"build: {unit.name}: bundle ready ({', '.join(f'{k} {v}' for k, v in result.metrics.items())})")
    return result
