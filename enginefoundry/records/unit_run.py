"""One unit's run as the flows sequence it: its work folder, its stage timings and the commands it ran.

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

from enginefoundry.records.outcomes import UnitCommands
from enginefoundry.settings import work_root


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
