"""A unit's outcome in one run (`runs/<model>/<parent-run>/<unit>.json` in cluster mode): what became of it, its
key and manifest, and its smoke and benchmark summaries as its manifest has them (records/outcomes.py writes it;
the parent run reads it for its summary)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from enginefoundry.schemas.base import Document
from enginefoundry.schemas.manifest import BenchPart, SmokePart
from enginefoundry.schemas.unit_status import UnitStatus


class UnitOutcome(Document):
    """What became of one unit in a run: its status and reason, cache hit or built, the runs involved, stage
    times and the smoke and benchmark summaries."""

    SCHEMA_NAME: ClassVar[str] = "unit-outcome"
    MAX_BYTES: ClassVar[int] = 16 << 20

    unit: str
    target: str
    status: UnitStatus
    cache_hit: bool = False
    reason: str = ""
    key: str | None = None
    manifest_uri: str | None = None
    built_by_run: str | None = None  # MLflow run that built a cache-hit unit
    mlflow_run_id: str | None = None
    stage_seconds: dict[str, float] = Field(default_factory=dict)
    smoke: SmokePart = Field(default_factory=SmokePart)
    bench: BenchPart = Field(default_factory=BenchPart)

    @property
    def ok(self) -> bool:
        return self.status == UnitStatus.CANDIDATE
