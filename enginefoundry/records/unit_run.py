"""One unit's run as the flows sequence it: what it is given (`UnitWork`, its converted checkpoint), its work folder,
its stage timings and the commands it ran, and what the stages before the publish produced (`Staged`).

The flow (flows/unit.py) only orders the stages; what a stage's time, command or file becomes on the unit's
records is decided here, beside the manifest and the outcome (records/outcomes.py).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel

from enginefoundry.bench import SweepReport
from enginefoundry.inputs.sources import SourceSnapshot
from enginefoundry.inputs.units import KeyComponents, Unit
from enginefoundry.lanes import BuildResult, ConvertResult
from enginefoundry.records.outcomes import UnitCommands
from enginefoundry.settings import work_root
from enginefoundry.smoke import SmokeReport
from enginefoundry.smoke.reference import ReferenceOutcome, ReferenceSet
from enginefoundry.smoke.sibling import SiblingRef
from enginefoundry.spec import BuildSpec
from enginefoundry.store.manifest import BuildInput


@dataclass
class UnitRun:
    """The unit `key`'s run (MLflow run `run_id`): its work folder `unit_dir`, the seconds each stage took (a stage
    that raised has none), and the commands each stage ran."""

    key: str
    run_id: str
    unit_dir: Path
    commands: UnitCommands
    stages: dict[str, float] = field(default_factory=dict)

    @classmethod
    def start(cls, key: str, run_id: str, commands: UnitCommands) -> UnitRun:
        """A clean work folder under the work root: nothing from an earlier run of the key gets published."""
        unit_dir = work_root() / "units" / key[:16]
        shutil.rmtree(unit_dir, ignore_errors=True)
        return cls(key=key, run_id=run_id, unit_dir=unit_dir, commands=commands)

    @property
    def report_dir(self) -> Path:
        return self.unit_dir / "reports"

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        """The block's seconds added to `stage` when it ends without raising."""
        t = time.monotonic()
        yield
        self.stages[stage] = self.stages.get(stage, 0.0) + time.monotonic() - t

    def stage_metrics(self) -> dict[str, float]:
        return {f"{k}_s": v for k, v in self.stages.items()}

    def serving_dir(self) -> Path:
        """The serving files' folder, emptied (a rejected unit gets none a serving team could deploy by mistake)."""
        path = self.unit_dir / "serving"
        shutil.rmtree(path, ignore_errors=True)
        return path

    def write_commands(self) -> str:
        """`commands.json` beside the unit's reports, for its MLflow run."""
        path = self.unit_dir / "commands.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.commands.model_dump_json(indent=2))
        return str(path)

    def artifacts(self, manifest_json: bytes) -> list[str]:
        """The files the unit's MLflow run keeps: the manifest's copy, the commands, the reports (not the
        per-phase logs nor the inputs record)."""
        manifest_copy = self.unit_dir / "manifest.json"
        manifest_copy.write_bytes(manifest_json)
        return [str(manifest_copy), self.write_commands()] + [
            str(p) for p in self.report_dir.rglob("*")
            if p.suffix in (".json", ".md", ".png") and "phases" not in p.parts and p.name != "inputs.json"
        ]


class ConvertedCheckpoint(BaseModel):
    variant: str
    key: str
    result: ConvertResult
    reused: bool
    uri: str  # where the converted checkpoint is published
    input: BuildInput | None = None  # the published build the unit uses, by digest (None: the source itself)


class UnitWork(BaseModel):
    """What one unit's run is given: the unit and its key's components, the fetched source and converted
    checkpoint, the parent's MLflow run. `replace`: a --force rebuild. `sibling`: the unit whose served answers judge
    this one (run before it). `spec_draft`: the fetched `speculative.draft`. `spec_adapters`: the fetched
    model.adapters of a unit that serves them all (adapter_mode serve): bundled with the unit, each asked by its
    name and gated against its own merged reference (smoke_served_adapters)."""

    spec: BuildSpec
    unit: Unit
    key_components: KeyComponents
    snapshot: SourceSnapshot
    ckpt: ConvertedCheckpoint
    parent_run_id: str
    replace: bool = False
    sibling: SiblingRef | None = None
    spec_draft: SourceSnapshot | None = None
    spec_adapters: dict[str, SourceSnapshot] | None = None

    @property
    def key(self) -> str:
        return self.key_components.key

    @property
    def precision(self) -> str:
        return self.unit.variant.precision.value


@dataclass(frozen=True)
class Staged:
    """What the stages before the publish produced: the reference, the build, the smoke report and the sweep."""

    reference: tuple[ReferenceSet, ReferenceOutcome]
    build: BuildResult
    smoke: SmokeReport | None
    sweep: SweepReport | None
