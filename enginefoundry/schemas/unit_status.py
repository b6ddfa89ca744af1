"""What became of a unit, as its manifest, its MLflow tags, its Prefect event and the summary table say it.

A `StrEnum`: each member is the string itself, so manifests and MLflow tags written before the enum read back
unchanged (`UnitStatus("candidate")`), and a comparison with a tag's plain string value holds."""

from __future__ import annotations

from enum import StrEnum


class UnitStatus(StrEnum):
    CANDIDATE = "candidate"  # published; its smoke gate passed and its benchmark is valid: promotable
    REJECTED = "rejected"  # published with the reason; a gate (smoke, benchmark validity) said no: never promoted
    FAILED = "failed"  # not published: a stage failed, or the unit was refused before it ran


class RegistryStatus(StrEnum):
    """Where a candidate went afterwards: promotion and rollback move its MLflow `enginefoundry.status` tag (the
    version's and its run's) on from `candidate`; the published manifest keeps the gate's word."""

    CHAMPION = "champion"  # behind `<stem>-champion`
    PREVIOUS_CHAMPION = "previous-champion"  # behind `<stem>-previous-champion`
    SUPERSEDED = "superseded"  # was champion, then two promotions passed it by; or a candidate never promoted
    # whose `<stem>-candidate` moved on to a newer build
    ROLLED_BACK = "rolled-back"  # was champion until a rollback; `promote --version` may put it back


# Statuses of a version whose own gates passed: promotable by hand (a rejected or failed unit never is).
PASSED_GATES = frozenset({UnitStatus.CANDIDATE, *RegistryStatus})
