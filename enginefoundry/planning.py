"""What `plan` shows: the unit matrix, each unit's commands and preflight verdicts; nothing runs."""

from __future__ import annotations

from pydantic import BaseModel

from enginefoundry.lanes import get_lane
from enginefoundry.plan import expand_units
from enginefoundry.spec import BuildSpec


class PlanReport(BaseModel):
    rows: list[dict[str, str]]
    commands: dict[str, list[str]]
    refused: int


def plan_report(spec: BuildSpec, only_targets: list[str] | None = None) -> PlanReport:
    lane = get_lane(spec.lane)
    rows, commands, refused = [], {}, 0
    for unit in expand_units(spec, only_targets):
        verdict = "ok"
        rows.append({
            "unit": unit.name, "precision": unit.variant.precision.value,
            "tp×pp": f"{unit.variant.tp}×{unit.variant.pp}", "target": unit.target.name,
            "arch": unit.target.arch.value, "pool": unit.target.pool,
            "batch/in/seq": f"{unit.profile.max_batch_size}/{unit.profile.max_input_len}/{unit.profile.max_seq_len}",
            "verdict": verdict,
        })
        commands[unit.name] = [f"[{c.description}] {c.shell()}" for c in lane.describe(spec, unit)]
    return PlanReport(rows=rows, commands=commands, refused=refused)
