"""Domain pieces the flow composes: unit outcomes, the run summary."""

from __future__ import annotations

from pydantic import BaseModel, Field

from enginefoundry.errors import PipelineError
from enginefoundry.inputs.units import Unit
from enginefoundry.schemas.manifest import SearchPart
from enginefoundry.schemas.outcome import UnitOutcome as UnitOutcome  # its home is schemas (issue 35)
from enginefoundry.smoke.sibling import SiblingRef, refusal_text
from enginefoundry.store.unit_status import UnitStatus


class RunSummary(BaseModel):
    spec: str
    source_uri: str
    source_revision: str | None
    parent_run_id: str | None
    outcomes: list[UnitOutcome]
    stage_seconds: dict[str, float] = Field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outcomes)

    def not_passed(self) -> str:
        """'1 of 2 unit(s) did not pass: fp32-tp1.chat.cpu rejected (smoke agreement …)': the units that were
        rejected or failed, each with its reason; empty when every unit passed."""
        bad = [o for o in self.outcomes if not o.ok]
        if not bad:
            return ""
        return (f"{len(bad)} of {len(self.outcomes)} unit(s) did not pass: "
                + "; ".join(f"{o.unit} {o.status}" + (f" ({o.reason})" if o.reason else "") for o in bad))

    def rows(self) -> list[dict[str, str]]:
        rows = []
        for o in self.outcomes:
            sm = o.smoke
            rows.append({
                "unit": o.unit,
                "status": o.status + (" (cache hit)" if o.cache_hit else ""),
                "smoke": (f"{sm.smoke_agreement or 0:.3f} (lb {sm.smoke_agreement_lower_bound or 0:.3f})"
                          if sm else "-"),
                "best tok/s": (f"{o.bench.bench_best_output_tokens_per_s or 0:.1f}" if o.bench else "-"),
                "time (s)": f"{sum(o.stage_seconds.values()):.1f}",
                "key": (o.key or "-")[:12],
                "reason": o.reason,
            })
        return rows


def best_profiles(outcomes: list[UnitOutcome]) -> list[dict[str, str]]:
    """Per variant and target: the candidate profile with the highest headline throughput (best_throughput:
    the same figure the summary table, MLflow and the model version show)."""
    from enginefoundry.bench.report import best_throughput

    groups: dict[tuple[str, str], list[tuple[str, float, int | None]]] = {}
    for o in outcomes:
        variant, profile, target = o.unit.split(".")
        groups.setdefault((variant, target), [])
        best = best_throughput(o.bench.model_dump(mode="json")) if o.ok else None
        if best is not None and best.within_slo:
            groups[(variant, target)].append((profile, best.output_tokens_per_s, best.concurrency))
    rows = []
    for (variant, target), scored in sorted(groups.items()):
        if scored:
            profile, tput, conc = max(scored, key=lambda x: x[1])
            rows.append({"variant": variant, "target": target, "best profile": profile,
                         "output tok/s": f"{tput:.1f}", "at concurrency": str(conc)})
        else:
            rows.append({"variant": variant, "target": target, "best profile": "none",
                         "output tok/s": "-", "at concurrency": "no candidate profile meets the SLOs"})
    return rows


class UnitNotPassed(PipelineError):
    """One unit rejected or failed: its run (a unit subflow, a `build-unit` deployment run) ends Failed with this
    as the state's data; `outcome` is what the parent reads (embedded) or finds in the store (cluster)."""

    def __init__(self, outcome: UnitOutcome) -> None:
        self.outcome = outcome
        super().__init__(f"unit {outcome.unit} {outcome.status}: {outcome.reason}")


class UnitsNotPassed(PipelineError):
    """A build that ran to its end with a rejected or failed unit: the run ends Failed (Prefect state, MLflow
    parent run, exit code 1) with the units and their reasons; `summary` keeps the whole outcome for the CLI."""

    def __init__(self, summary: RunSummary) -> None:
        self.summary = summary
        super().__init__(summary.not_passed())


def search_rows(outcomes: list[UnitOutcome], objective: str = "tokens_per_gpu") -> list[dict[str, str]]:
    """Per searched unit: goodput at the SLO, predicted beside measured, cost and energy; the winner per target by
    the search's objective is marked (among candidates that met the SLO)."""
    found = [(o, o.bench.search) for o in outcomes if o.bench.search is not None]
    winners: dict[str, tuple[float, str]] = {}
    for o, s in found:
        value = _objective_value(objective, s)
        if o.ok and value is not None and value > winners.get(o.target, (float("-inf"), ""))[0]:
            winners[o.target] = (value, o.unit)
    rows = []
    # A cpu target's figure is per host, not per GPU (SearchVerdict.per): the column says which.
    pers = {s.per or "GPU" for _, s in found}
    per = pers.pop() if len(pers) == 1 else "GPU (host for CPU)"
    for o, s in found:
        cost, err = s.cost, s.prediction_error
        rows.append({
            "unit": o.unit, "goodput c": str(s.goodput_concurrency or "none"),
            f"tok/s/{per} pred": _num(s.predicted.get("tokens_per_s_gpu")),
            f"tok/s/{per} meas": _num(s.measured.get("tokens_per_s_gpu")),
            "error": "-" if err is None else f"{err:+.0%}" + (" FLAGGED" if s.flagged else ""),
            "$/1M tok": _num(cost.usd_per_mtok, 4), "tok/J": _num(cost.tokens_per_joule, 3)
            if isinstance(cost.tokens_per_joule, int | float) else "unavailable",
            f"avg W/{per}": _num(cost.avg_watts_per_gpu if isinstance(cost.avg_watts_per_gpu, int | float)
                                 else None),
            "winner": f"best {objective}" if winners.get(o.target, (0, ""))[1] == o.unit else "",
        })
    return rows


def _objective_value(objective: str, s: SearchPart) -> float | None:
    cost = s.cost
    if objective == "cost_per_mtok":
        return -float(cost.usd_per_mtok) if cost.usd_per_mtok else None
    if objective == "tokens_per_joule":
        return float(cost.tokens_per_joule) if isinstance(cost.tokens_per_joule, int | float) else None
    value = s.measured.get("tokens_per_s_gpu")
    return None if value is None else float(value)


def _num(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{float(x):.{digits}f}"


def refused_by_sibling(units: list[Unit], siblings: dict[str, SiblingRef],
                       outcomes: dict[str, UnitOutcome]) -> dict[str, UnitOutcome]:
    """Units of a later wave whose sibling this run built, or failed to build, without passing its gate: refused
    before anything of theirs runs (no fetch, conversion or build on a worker)."""
    refused = {}
    for unit in units:
        ref = siblings.get(unit.name)
        sib = outcomes.get(ref.unit) if ref is not None else None
        if ref is None or sib is None or sib.ok:
            continue
        label = f"sibling unit {ref.unit} (key {ref.key[:12]})"
        refused[unit.name] = UnitOutcome(unit=unit.name, target=unit.target.name, status=UnitStatus.FAILED,
                                         reason=refusal_text(label, sib.status, sib.reason)[:300])
    return refused
