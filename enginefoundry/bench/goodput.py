"""Verify a searched unit: its goodput at the SLO, i.e. the highest concurrency at which the SLO percentiles hold
(doubling from `min_concurrency`, then bisecting, bounded by `max_points` and `time_budget_s`), measured beside what
the predictor said, with cost and energy at that point (docs/search.md)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from enginefoundry.bench.costs import energy_mj, unit_cost
from enginefoundry.bench.result import BenchPoint
from enginefoundry.spec import Scenario, SearchSpec

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from enginefoundry.inputs.units import Unit
    from enginefoundry.spec import BuildSpec


class Probe(BaseModel):
    concurrency: int
    met: bool
    output_tokens_per_s: float | None
    tokens_per_s_gpu: float | None
    tokens_per_s_user: float | None
    ttft_p95_ms: float | None
    itl_p95_ms: float | None
    seconds: float
    energy_j: float | None = None


class SearchVerdict(BaseModel):
    """Goodput at the SLO, predicted beside measured, cost and energy; recorded per unit."""

    goodput_concurrency: int | None
    slo: dict[str, float | None] = Field(default_factory=dict)  # the SLO it was measured at (cost compares only here)
    bounded_by: str  # "range", "points", "time": why the search stopped
    probes: list[Probe] = Field(default_factory=list)
    predicted: dict[str, float] = Field(default_factory=dict)
    measured: dict[str, float] = Field(default_factory=dict)
    prediction_error: float | None = None  # (measured − predicted) / predicted tokens/s/GPU
    error_bound: float
    flagged: bool = False
    cost: dict[str, object] = Field(default_factory=dict)
    note: str = ""
    per: str = Field(default="GPU", description="what `tokens_per_s_gpu` is per: GPU, or host for a cpu target "
                                                "(its figure is the whole host's)")

    def metrics(self) -> dict[str, float]:
        out = {f"predicted_{k}": v for k, v in self.predicted.items()}
        out.update({f"measured_{k}": v for k, v in self.measured.items()})
        if self.goodput_concurrency is not None:
            out["goodput_concurrency"] = float(self.goodput_concurrency)
        if self.prediction_error is not None:
            out["prediction_error"] = self.prediction_error
        out.update({k: float(v) for k, v in self.cost.items() if isinstance(v, int | float)})
        return out

    def markdown(self, unit: str) -> str:
        lines = [f"**{unit}**: goodput at the SLO = concurrency {self.goodput_concurrency or 'none'} "
                 f"(stopped by {self.bounded_by})", "",
                 "| figure | predicted | measured |", "|---|---|---|"]
        for k in ("tokens_per_s_gpu", "tokens_per_s_user", "ttft_ms", "concurrency"):
            lines.append(f"| {k} | {_f(self.predicted.get(k))} | {_f(self.measured.get(k))} |")
        if self.prediction_error is not None:
            flag = " **beyond the bound**" if self.flagged else ""
            lines += ["", f"prediction error (tokens/s/{self.per}): {self.prediction_error:+.1%} "
                          f"(bound ±{self.error_bound:.0%}){flag}"]
        cost = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k}: {v}" for k, v in self.cost.items() if v)
        lines += ["", f"cost and energy: {cost}"] + (["", f"note: {self.note}"] if self.note else [])
        lines += ["", f"| c | SLO met | out tok/s | tok/s/{self.per} | tok/s/user | TTFT p95 | ITL p95 |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {p.concurrency} | {'yes' if p.met else 'no'} | {_f(p.output_tokens_per_s)} | "
                  f"{_f(p.tokens_per_s_gpu)} | {_f(p.tokens_per_s_user)} | {_f(p.ttft_p95_ms)} | "
                  f"{_f(p.itl_p95_ms)} |" for p in self.probes]
        return "\n".join(lines) + "\n"


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def meets(point: BenchPoint, search: SearchSpec) -> bool:
    slo = search.slo
    if not point.valid:
        return False
    checks = [(point.ttft_ms.p95, slo.ttft_p95_ms), (point.itl_ms.p95, slo.itl_p95_ms),
              (point.latency_ms.p95, slo.e2e_p95_ms)]
    return all(limit is None or (value is not None and value <= limit) for value, limit in checks)


def probe_of(point: BenchPoint, met: bool, gpus: int, seconds: float, energy_j: float | None) -> Probe:
    out = point.output_tokens_per_s
    per_user = out / point.concurrency if out else None
    return Probe(concurrency=point.concurrency, met=met, output_tokens_per_s=out,
                 tokens_per_s_gpu=out / max(gpus, 1) if out else None, tokens_per_s_user=per_user,
                 ttft_p95_ms=point.ttft_ms.p95, itl_p95_ms=point.itl_ms.p95, seconds=round(seconds, 2),
                 energy_j=energy_j)


def find_goodput(search: SearchSpec, run_at: Callable[[int], tuple[BenchPoint, float | None]], gpus: int,
                 progress: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic,
                 ) -> tuple[Probe | None, list[Probe], str]:
    """The highest concurrency in [min, max] whose point meets the SLO. `run_at(c)` measures one point and returns
    it with the joules the GPUs used over it (None where no counter exists). Returns (best probe, all probes,
    what bounded the search)."""
    g = search.goodput
    t0 = clock()
    probes: dict[int, Probe] = {}

    def measure(c: int) -> bool:
        t = clock()
        point, joules = run_at(c)
        met = meets(point, search)
        probes[c] = probe_of(point, met, gpus, clock() - t, joules)
        progress(f"goodput: c={c} {'meets' if met else 'misses'} the SLO "
                 f"(TTFT p95 {point.ttft_ms.p95 or 0:.0f} ms, ITL p95 {point.itl_ms.p95 or 0:.1f} ms)")
        return met

    def spent() -> str | None:
        """What ends the search before the next point: the points, or the time budget, which a point that would
        not fit also ends (judged by the slowest point so far: the budget is checked between points, and on the
        lent H100 one point of the reference lane took 100 s of a 120 s budget, so the next ran to 250 s)."""
        if len(probes) >= g.max_points:
            return "points"
        slowest = max((p.seconds for p in probes.values()), default=0.0)
        return "time" if clock() - t0 + slowest > g.time_budget_s else None

    lo, hi = None, None  # highest met, lowest missed
    c = g.min_concurrency
    while True:  # doubling until a miss or the range's end
        if measure(c):
            lo = c
        else:
            hi = c
            break
        if c >= g.max_concurrency or spent():
            break
        c = min(2 * c, g.max_concurrency)
    bounded = spent() or "range"
    while lo is not None and hi is not None and hi - lo > 1 and not spent():  # bisect between met and missed
        mid = (lo + hi) // 2
        if measure(mid):
            lo = mid
        else:
            hi = mid
    bounded = spent() or "range"
    return (probes[lo] if lo is not None else None), [probes[k] for k in sorted(probes)], bounded


def relative_error(predicted: float | None, measured: float | None) -> float | None:
    if not predicted or measured is None:
        return None
    return round((measured - predicted) / predicted, 4)


def write(verdict: SearchVerdict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "search.json"
    path.write_text(verdict.model_dump_json(indent=2))
    return path


def verify_unit(spec: BuildSpec, unit: Unit, *, url: str, model: str, tokenizer: str, out: Path,
                progress: Callable[[str], None] = print, gpus: list[int] | None = None) -> SearchVerdict:
    """Goodput at the SLO for a searched unit, predicted beside measured, $/1M output tokens and tokens/joule."""
    from enginefoundry.bench.aiperf import run_point

    search = spec.search
    assert search is not None, "verify_unit is for specs with a search section"
    w = search.workload
    scenario = Scenario(name="search", input_tokens_mean=w.mean_isl, input_tokens_stddev=w.isl_stddev,
                        output_tokens_mean=w.osl, output_tokens_stddev=w.osl_stddev)
    bench = spec.benchmark.model_copy(update={"request_count": search.goodput.request_count
                                              or spec.benchmark.request_count})
    n_gpus = unit.target.gpu_count if unit.target.arch.value != "cpu" else 1
    gpu_ids = gpus if gpus is not None else unit_gpus(unit.target.gpu_count)

    def run_at(c: int) -> tuple[BenchPoint, float | None]:
        before = energy_mj(gpu_ids) if gpu_ids else None
        point, _ = run_point(bench, scenario, c, url=url, model=model, tokenizer=tokenizer, out=out / f"c{c}",
                             progress=progress, extra_inputs=spec.benchmark.extra_inputs)
        after = energy_mj(gpu_ids) if before is not None else None
        return point, ((after - before) / 1000.0 if after is not None and before is not None else None)

    best, probes, bounded = find_goodput(search, run_at, n_gpus, progress)
    predicted = dict(unit.searched.predicted or {}) if unit.searched else {}
    measured: dict[str, float] = {}
    if best is not None:
        measured = {k: v for k, v in (("tokens_per_s_gpu", best.tokens_per_s_gpu),
                                      ("tokens_per_s_user", best.tokens_per_s_user), ("ttft_ms", best.ttft_p95_ms),
                                      ("tpot_ms", best.itl_p95_ms), ("concurrency", float(best.concurrency)),
                                      ("output_tokens_per_s", best.output_tokens_per_s)) if v is not None}
    energy = best.energy_j if best else None
    out_tokens = (best.output_tokens_per_s or 0) * best.seconds if best and energy else None
    cost = unit_cost(spec, unit.target, best.output_tokens_per_s if best else None, energy_j=energy,
                     window_s=best.seconds if best else None, output_tokens=out_tokens)
    error = relative_error(predicted.get("tokens_per_s_gpu"), measured.get("tokens_per_s_gpu"))
    verdict = SearchVerdict(
        goodput_concurrency=best.concurrency if best else None, bounded_by=bounded, probes=probes,
        slo={**search.slo.model_dump(), "isl": w.isl, "osl": w.osl},
        predicted=predicted, measured=measured, prediction_error=error, error_bound=search.max_prediction_error,
        flagged=error is not None and abs(error) > search.max_prediction_error, cost=cost.summary(),
        note=(unit.searched.note if unit.searched else "") + ("" if best else "; no load met the SLO"),
        per="GPU" if unit.target.arch.value != "cpu" else "host")
    write(verdict, out)
    plot(verdict, unit.searched.predictor if unit.searched else None, out / "search.png", unit.name,
         predicted_front=unit.searched.pareto if unit.searched else None)
    return verdict


def unit_gpus(count: int) -> list[int]:
    """The NVML indices the unit's server uses: CUDA_VISIBLE_DEVICES when it lists indices, else 0 … count-1."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible and all(v.isdigit() for v in visible):
        return [int(v) for v in visible][:count]
    return list(range(count))


def plot(verdict: SearchVerdict, predictor: str | None, path: Path, title: str,
         predicted_front: list[tuple[float, float]] | None = None) -> Path | None:
    """tokens/s/GPU against tokens/s/user: the predicted point and the predictor's Pareto front, the measured probes
    and their Pareto front."""
    import matplotlib.pyplot as plt

    fig = figure(verdict, predictor, title, predicted_front)
    if fig is None:
        return None
    fig.savefig(path)
    plt.close(fig)
    return path


def figure(verdict: SearchVerdict, predictor: str | None, title: str,
           predicted_front: list[tuple[float, float]] | None = None) -> Figure | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [(p.tokens_per_s_user, p.tokens_per_s_gpu, p.met) for p in verdict.probes
           if p.tokens_per_s_user is not None and p.tokens_per_s_gpu is not None]
    if not pts and not verdict.predicted and not predicted_front:
        return None
    who = predictor or "predictor"
    fig, ax = plt.subplots(figsize=(6, 4))
    if pts:
        ax.scatter([x for x, _, m in pts if m], [y for _, y, m in pts if m], label="measured, SLO met", marker="o")
        ax.scatter([x for x, _, m in pts if not m], [y for _, y, m in pts if not m], label="measured, SLO missed",
                   marker="x")
        front = pareto([(x, y) for x, y, _ in pts])
        ax.plot([x for x, _ in front], [y for _, y in front], linestyle="--", label="measured Pareto front")
    if predicted_front:
        front = sorted(predicted_front)
        ax.plot([x for x, _ in front], [y for _, y in front], linestyle=":", marker=".",
                label=f"predicted Pareto front ({who})")
    if "tokens_per_s_gpu" in verdict.predicted:
        ax.scatter([verdict.predicted.get("tokens_per_s_user", 0)], [verdict.predicted["tokens_per_s_gpu"]],
                   marker="*", s=150, label=f"predicted ({who})")
    ax.set_xlabel("output tokens/s per user")
    ax.set_ylabel(f"output tokens/s per {verdict.per}")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def pareto(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point beats on both axes (more per user and more per GPU), by tokens/s/user."""
    front = [p for p in points if not any(q != p and q[0] >= p[0] and q[1] >= p[1] for q in points)]
    return sorted(set(front))
