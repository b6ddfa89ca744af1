"""What `plan` shows: the unit matrix, each unit's commands and preflight verdicts; nothing runs."""

from __future__ import annotations

from pydantic import BaseModel

from enginefoundry.inputs.model_shape import Check
from enginefoundry.inputs.quantized_source import spec_quantization_problems
from enginefoundry.inputs.units import Unit, expand_units
from enginefoundry.lanes import get_lane
from enginefoundry.lanes.base import PROBE_CHECK
from enginefoundry.planning.preflight import (
    PreflightReport,
    format_estimates,
    preflight,
    reference_problems,
    reference_summary,
)
from enginefoundry.schemas.loose import HfModelConfig
from enginefoundry.spec import BuildSpec


class PlanReport(BaseModel):
    rows: list[dict[str, str]]
    commands: dict[str, list[str]]
    preflight: dict[str, PreflightReport]

    @property
    def refused(self) -> int:
        return sum(not r.ok for r in self.preflight.values())


def model_config_for(spec: BuildSpec) -> HfModelConfig | None:
    """The checkpoint's config.json without downloading (enginefoundry.inputs.model_config: a local source, the
    spec's model-configs/ folder, the package's, a Hub source's config.json already in the Hugging Face cache)."""
    from enginefoundry.inputs.model_config import model_config_for as lookup

    return lookup(spec)


# Check.name of a lane-option refusal (`Lane.validate_options`) copied into a unit's verdict; `validate` reports
# those by field already.
SPEC_CHECK = "spec"


def spec_checks(spec: BuildSpec, unit: Unit, problems: list[tuple[str, str]]) -> list[Check]:
    """The lane's refusals that concern this unit: its variant's (`variants.<i>…`), its target's (`targets.<i>…`),
    its profile's (`profiles.<i>…`) and the lane-wide ones (toolchain, lane_options)."""
    own = {"variants": next((i for i, v in enumerate(spec.variants) if v.name == unit.variant.name), None),
           "targets": next((i for i, t in enumerate(spec.targets) if t.name == unit.target.name), None),
           "profiles": next((i for i, p in enumerate(spec.profiles) if p.name == unit.profile.name), None)}
    out = []
    for field, message in problems:
        parts = field.split(".")
        if parts[0] in own and len(parts) > 1 and parts[1].isdigit() and parts[1] != str(own[parts[0]]):
            continue
        out.append(Check(name=SPEC_CHECK, ok=False, message=f"{field}: {message}"))
    return out


def _moe_shape(unit: Unit) -> str:
    """The variant's MoE parallelism for the plan's tp×pp cell ("" where it sets none)."""
    v = unit.variant
    parts = [f"ep{v.moe_ep}×moe_tp{v.moe_tp_size}"] if v.moe_ep > 1 or v.moe_tp is not None else []
    return "".join(f" {p}" for p in [*parts, *(["attention DP"] if v.attention_dp else [])])


def _shape(unit: Unit) -> str:
    """The plan's tp×pp cell: tp × pp and the MoE parallelism, or a disaggregated variant's roles."""
    d = unit.variant.disaggregated
    if d is not None:
        return f"disaggregated: P {d.prefill.label()} + D {d.decode.label()}"
    return f"{unit.variant.tp}×{unit.variant.pp}" + _moe_shape(unit)


def plan_report(spec: BuildSpec, only_targets: list[str] | None = None) -> PlanReport:
    lane = get_lane(spec.lane)
    config = model_config_for(spec)
    lane_problems = list(lane.validate_options(spec)) + spec_quantization_problems(spec)
    rows, commands, reports = [], {}, {}
    for unit in expand_units(spec, only_targets):
        report = preflight(spec, unit, config, None)
        refused_by_spec = spec_checks(spec, unit, lane_problems)
        index = next((i for i, v in enumerate(spec.variants) if v.name == unit.variant.name), None)
        refused_by_spec += [Check(name=SPEC_CHECK, ok=False, message=f"{field}: {message}")
                            for field, message, at in reference_problems(spec) if at is None or at == index]
        report.checks[:0] = refused_by_spec
        reports[unit.name] = report
        problems = report.problems
        rows.append({
            "unit": unit.name, "precision": unit.variant.precision.value,
            "tp×pp": _shape(unit), "target": unit.target.name,
            "arch": unit.target.arch.value, "pool": unit.target.pool,
            "batch/in/seq": f"{unit.profile.max_batch_size}/{unit.profile.max_input_len}/{unit.profile.max_seq_len}",
            "reference": reference_summary(spec, unit),
            "memory estimate": format_estimates(report).rsplit(" · ", 1)[0],
            "verdict": "ok" if not problems else "refused: " + "; ".join(
                f"{c.message}" + (f" (fix: {c.fix})" if c.fix else "") for c in problems),
        })
        if refused_by_spec:  # the lane cannot render what it refuses (e.g. a precision it has no route for)
            commands[unit.name] = ["(not rendered: the lane refuses this unit, see its verdict)"]
        else:
            commands[unit.name] = [f"[{c.description}] {c.shell()}" for c in lane.describe(spec, unit)]
            commands[unit.name] += [f"({c.message})" for c in report.checks if c.ok and c.name == PROBE_CHECK]
    return PlanReport(rows=rows, commands=commands, preflight=reports)


def refuse_on_preflight(spec: BuildSpec, only_targets: list[str] | None = None) -> None:
    """Raise PreflightError listing every refused unit, before any download or GPU time."""
    from enginefoundry.errors import PreflightError

    report = plan_report(spec, only_targets)
    if report.refused:
        lines = [f"  {row['unit']}: {row['verdict']}" for row in report.rows if row["verdict"] != "ok"]
        raise PreflightError(f"{report.refused} unit(s) cannot succeed:\n" + "\n".join(lines))
