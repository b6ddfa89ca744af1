"""A fleet: many specs rolled out by one parent run (flows/fleet.py), each spec's champions as its own rollout
decides them, one summary for all, and a failed spec that stops nobody else.

Which specs (files, or the `*.yaml` of folders), the per-pool limits (`POOL=N`) and the summary are decided here,
without Prefect: the flow composes them, the CLI and the UI show them.

Per-pool limits are Prefect's global concurrency limits, one per work pool, named `enginefoundry-pool-<pool>`:
every unit's build holds one slot of its pool's limit while it runs, in embedded and cluster mode alike
(tasks/pool_limits.py), so a fleet's many models cannot put more builds on a pool at once than the limit says. A
pool without such a limit is not limited (Prefect's non-strict acquisition). The limits live on the Prefect
server, not in this process: a fleet sets them, any build honours them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from enginefoundry.errors import InputError, PipelineError
from enginefoundry.rollout.source_change import RolloutReport

MAX_FLEET_SPECS = 200  # a fleet is a catalogue, not a crawl: more is a mistake in the folder named
MAX_POOL_LIMIT = 1000
POOL_LIMIT_PREFIX = "enginefoundry-pool-"
_POOL_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")  # the work pool names gpu_targets.py and targets[].work_pool use
SPEC_SUFFIXES = (".yaml", ".yml")

FleetStatus = Literal["promoted", "held", "built", "unchanged", "failed"]


def pool_limit_name(pool: str) -> str:
    """The global concurrency limit of a work pool (`enginefoundry-pool-gpu-sm90`)."""
    return f"{POOL_LIMIT_PREFIX}{pool}"


def fleet_spec_paths(items: Sequence[str]) -> list[Path]:
    """The fleet's spec files, in order: each item is a spec file or a folder (its `*.yaml`/`*.yml`, sorted, not
    recursive). A spec named twice runs once. InputError names the item and the fix before anything runs."""
    if not items:
        raise InputError("fleet: no specs; name spec files or a folder of them (e.g. configs/fleet/)")
    found: list[Path] = []
    seen: set[Path] = set()
    for item in items:
        path = Path(item)
        if path.is_dir():
            members = sorted(p for p in path.iterdir() if p.suffix in SPEC_SUFFIXES and p.is_file()
                             and not p.is_symlink())
            if not members:
                raise InputError(f"fleet: folder {item} holds no *.yaml spec; name a folder of specs or spec files")
        elif path.is_file():
            if path.suffix not in SPEC_SUFFIXES:
                raise InputError(f"fleet: {item} is not a spec (*.yaml or *.yml)")
            members = [path]
        else:
            raise InputError(f"fleet: {item} does not exist; name spec files or a folder of them")
        for member in members:
            resolved = member.resolve()
            if resolved not in seen:
                seen.add(resolved)
                found.append(member)
    if len(found) > MAX_FLEET_SPECS:
        raise InputError(f"fleet: {len(found)} specs, more than {MAX_FLEET_SPECS}; split the fleet")
    return found


def parse_pool_limits(items: Sequence[str]) -> dict[str, int]:
    """`POOL=N` items (`--pool-limit cpu=2 gpu-sm90=4`) → {pool: N}; the last one of a pool wins."""
    limits: dict[str, int] = {}
    for item in items:
        pool, sep, value = item.partition("=")
        pool = pool.strip()
        if not sep or not _POOL_NAME.match(pool):
            raise InputError(f"--pool-limit {item!r}: write POOL=N with a work pool name (lowercase letters, digits, "
                             "dashes), e.g. gpu-sm90=2")
        limits[pool] = check_pool_limit(pool, value.strip(), f"--pool-limit {item!r}")
    return limits


def check_pool_limit(pool: str, value: object, where: str) -> int:
    """One pool's limit, bounded: a whole number of concurrent unit builds from 1 to MAX_POOL_LIMIT."""
    if not _POOL_NAME.match(pool):
        raise InputError(f"{where}: {pool!r} is not a work pool name (lowercase letters, digits, dashes)")
    try:
        number = int(str(value), 10)
    except ValueError:
        number = 0
    if not 1 <= number <= MAX_POOL_LIMIT:
        raise InputError(f"{where}: the limit must be a whole number from 1 to {MAX_POOL_LIMIT} (concurrent unit "
                         f"builds on pool {pool}), not {value!r}")
    return number


class FleetRolloutOptions(BaseModel):
    """What every spec's rollout subflow in a fleet is given: the fleet's mode and the rollout flow's parameters
    the fleet flow passes through (each as the `rollout-fleet` deployment's parameter of the same name)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Literal["embedded", "cluster"]
    max_accuracy_drop: float
    min_throughput_ratio: float
    max_ttft_p95_factor: float
    comparison_rounds: int
    force_build: bool
    store: str | None
    mlflow_uri: str | None
    s3_endpoint_url: str | None


class FleetMember(BaseModel):
    """What the fleet's rollout of one spec did."""

    spec_path: str
    spec: str = Field(description="the spec's name, or its file's stem when it could not be read")
    status: FleetStatus
    reason: str = ""
    built: bool = False
    promoted: list[str] = Field(default_factory=list, description="alias stems promoted to champion")
    held: list[str] = Field(default_factory=list, description="alias stems held, each with its reason in `reason`")
    build_run_id: str | None = Field(default=None, description="the MLflow parent run of the spec's build")
    duration_s: float = 0.0

    @classmethod
    def of_report(cls, spec_path: str, report: RolloutReport, build_run_id: str | None) -> FleetMember:
        promoted = [d.stem for d in report.decisions if d.action == "promoted"]
        held = [d for d in report.decisions if d.action == "held"]
        status: FleetStatus
        reason = "; ".join(f"{d.stem}: {'; '.join(d.reasons) or 'held'}" for d in held)
        if report.built and report.build_ok is False:
            status, reason = "failed", "; ".join(x for x in ("build: some units did not pass the gates", reason) if x)
        elif promoted:
            status = "promoted"
        elif held:
            status = "held"
        else:
            status = "built" if report.built else "unchanged"
        return cls(spec_path=spec_path, spec=report.spec, status=status, reason=reason[:500], built=report.built,
                   promoted=promoted, held=[d.stem for d in held], build_run_id=build_run_id,
                   duration_s=report.duration_s)

    @classmethod
    def failure(cls, spec_path: str, spec: str, reason: str, duration_s: float = 0.0) -> FleetMember:
        first = reason.strip().splitlines()[0] if reason.strip() else "failed without a message"
        return cls(spec_path=spec_path, spec=spec, status="failed", reason=first[:500], duration_s=duration_s)

    def row(self) -> dict[str, str]:
        return {"spec": self.spec, "status": self.status, "promoted": ", ".join(self.promoted) or "-",
                "held": ", ".join(self.held) or "-", "reason": self.reason or "-",
                "MLflow build run": self.build_run_id or "-", "seconds": f"{self.duration_s:.1f}"}


class FleetSummary(BaseModel):
    """One fleet run: every spec's outcome, the pool limits it set, its MLflow run."""

    name: str
    members: list[FleetMember]
    pool_limits: dict[str, int] = Field(default_factory=dict)
    mlflow_run_id: str | None = None
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return all(m.status != "failed" for m in self.members)

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for member in self.members:
            counts[member.status] = counts.get(member.status, 0) + 1
        return counts

    def rows(self) -> list[dict[str, str]]:
        return [m.row() for m in self.members]

    def headline(self) -> str:
        counts = ", ".join(f"{n} {status}" for status, n in sorted(self.counts().items()))
        return f"fleet {self.name}: {len(self.members)} spec(s): {counts}"

    def markdown(self) -> str:
        """The Prefect artifact `fleet-<name>`: the headline, the limits, one row per spec."""
        limits = ", ".join(f"`{pool}` {n}" for pool, n in sorted(self.pool_limits.items())) or "none set by this fleet"
        lines = [f"## {self.headline()}", "", f"Per-pool limits (concurrent unit builds): {limits}", ""]
        if self.mlflow_run_id:
            lines += [f"MLflow fleet run `{self.mlflow_run_id}`", ""]
        lines += ["| spec | status | promoted | held | reason | MLflow build run |", "|---|---|---|---|---|---|"]
        for m in self.members:
            lines.append(f"| {_cell(m.spec)} | {m.status} | {_cell(', '.join(m.promoted)) or '-'} | "
                         f"{_cell(', '.join(m.held)) or '-'} | {_cell(m.reason) or '-'} | `{m.build_run_id or '-'}` |")
        return "\n".join(lines) + "\n"


class FleetNotOk(PipelineError):
    """A fleet whose every spec ran, some of them failed: the run ends Failed (Prefect state, MLflow fleet run, exit
    code 1) naming them; `summary` keeps every spec's outcome for the CLI's table."""

    def __init__(self, summary: FleetSummary) -> None:
        self.summary = summary
        failed = [f"{m.spec} ({m.reason or 'failed'})" for m in summary.members if m.status == "failed"]
        super().__init__(f"{summary.headline()}; failed: {'; '.join(failed)}"[:2000])


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:200]
