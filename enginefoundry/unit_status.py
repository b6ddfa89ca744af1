"""What became of a unit, as its manifest, its MLflow tags, its Prefect event and the summary table say it.

A `StrEnum`: each member is the string itself, so manifests and MLflow tags written before the enum read back
unchanged (`UnitStatus("candidate")`), and a comparison with a tag's plain string value holds."""

from __future__ import annotations

from enum import StrEnum


class UnitStatus(StrEnum):
    CANDIDATE = "candidate"  # published; its smoke gate passed and its benchmark is valid: promotable
    REJECTED = "rejected"  # published with the reason; a gate (smoke, benchmark validity) said no: never promoted
    FAILED = "failed"  # not published: a stage failed, or the unit was refused before it ran
