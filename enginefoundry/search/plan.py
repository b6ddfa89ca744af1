"""Decide what to build from a spec's `search` section: predict per target, rank by the objective, keep the top-k
that pass preflight, and write them into the spec as ordinary units (`BuildSpec.searched`). A target the predictor
does not cover gets a measured search instead (units of the allowed precisions; the benchmark finds their goodput),
with the reason stated."""

from __future__ import annotations

import time
from collections.abc import Callable

from pydantic import BaseModel, Field
from typing_extensions import TypedDict

from enginefoundry.bench.costs import cost_per_mtok
from enginefoundry.inputs.model_config import expert_count, lookup
from enginefoundry.lanes import get_lane
from enginefoundry.schemas.loose import HfModelConfig, TrtllmConfig
from enginefoundry.search.predictor import (
    AIConfigurator,
    Coverage,
    Predicted,
    Prediction,
    Predictor,
    config_digest,
    requests_for,
)
from enginefoundry.spec import BuildSpec, Objective, Precision, Profile, SearchedUnit, Target, Variant
from enginefoundry.spec.search import SearchSpec

DisaggServingFiles = TypedDict("DisaggServingFiles", {
    "release": str,
    "disagg_config.yaml": TrtllmConfig,  # the router's `trtllm-serve disaggregated -c`
    "context.yaml": TrtllmConfig,  # every context (prefill) worker's LLM-API YAML
    "generation.yaml": TrtllmConfig,  # every generation (decode) worker's
    "commands": list[list[str]],  # one trtllm-serve per worker, then the router
    "to_be_probed": list[str],  # keys past their evidence: the worker's probe decides
})
"""The files that serve one disaggregated configuration on lane trtllm, by file name (`disagg_serving`)."""


class Candidate(BaseModel):
    rank: int
    predicted: Predicted
    objective_value: float | None
    usd_per_mtok: float | None
    unit: str
    chosen: bool = False
    verdict: str = ""  # "unit", "refused by preflight: …", "below top_k"
    # A disaggregated configuration on lane trtllm: the files that would serve it (router config, per-role LLM-API
    # YAMLs, worker commands; enginefoundry.lanes.trtllm_disagg), for the toolchain's release.
    serving: DisaggServingFiles | None = None


class TargetSearch(BaseModel):
    target: str
    covered: bool
    reason: str = ""
    predictor: str = ""
    note: str = ""
    candidates: list[Candidate] = Field(default_factory=list)
    problems: dict[str, str] = Field(default_factory=dict)  # precision → why the predictor has no answer
    pareto: dict[str, list[tuple[float, float]]] = Field(default_factory=dict)
    units: list[str] = Field(default_factory=list)
    seconds: float = 0.0
    cached: int = 0


class SearchReport(BaseModel):
    objective: Objective
    targets: list[TargetSearch]
    seconds: float
    config_source: str = ""  # where the model's config.json came from
    experts: int = 0  # routed experts of a mixture-of-experts model (0: dense): the table shows the MoE columns


def objective_value(objective: Objective, spec: BuildSpec, target: Target, p: Predicted) -> float | None:
    """Larger is better for every objective (cost is negated), None when it cannot be computed."""
    if objective is Objective.TOKENS_PER_GPU:
        return p.tokens_per_s_gpu
    if objective is Objective.COST_PER_MTOK:
        cost = cost_per_mtok(spec, target, p.tokens_per_s_gpu)
        return -cost if cost is not None else None
    return p.tokens_per_s_gpu / p.power_w if p.power_w else None


def profile_for(search: SearchSpec, batch_size: int, name: str) -> Profile:
    w = search.workload
    max_in = w.mean_isl + 3 * w.isl_stddev
    return Profile(name=name, max_batch_size=min(batch_size, 4096), max_input_len=max_in,
                   max_seq_len=max_in + w.osl + 3 * w.osl_stddev, max_num_tokens=max(8192, max_in))


def run_search(spec: BuildSpec, only_targets: list[str] | None = None, predictor: Predictor | None = None,
               progress: Callable[[str], None] = print) -> SearchReport:
    """Predict for every searched target (one predictor call for all misses) and choose the units."""
    assert spec.search is not None
    t0 = time.monotonic()
    search = spec.search
    predictor = predictor or AIConfigurator()
    found = lookup(spec, fetch=True)  # a Hub source: its config.json alone, at the pinned revision
    config = found.config
    digest = config_digest(config) if config else ""
    targets = [t for t in spec.targets if (search.targets is None or t.name in search.targets)
               and (not only_targets or t.name in only_targets)]
    coverage = {t.name: predictor.coverage(spec, t, config) for t in targets}
    if config is None:  # say where it looked and why it has none (the predictor knows only "no config")
        coverage = {n: Coverage(False, found.why) if c.reason.startswith("no config.json") else c
                    for n, c in coverage.items()}
    requests = [r for t in targets if coverage[t.name].covered
                for r in requests_for(search, t, coverage[t.name], digest)]
    predictions = predictor.predict(config, requests, progress) if requests and config else []
    by_target: dict[str, list[Prediction]] = {}
    for r, p in zip(requests, predictions, strict=True):
        by_target.setdefault(r.target, []).append(p)
    out = []
    for t in targets:
        cov = coverage[t.name]
        if not cov.covered:
            out.append(_fallback(spec, t, cov, config))
            continue
        out.append(_choose(spec, t, cov, by_target.get(t.name, []), getattr(predictor, "name", "predictor"),
                           config))
    return SearchReport(objective=search.objective, targets=out, seconds=round(time.monotonic() - t0, 2),
                        config_source=found.source, experts=expert_count(config))


def _choose(spec: BuildSpec, target: Target, cov: Coverage, predictions: list[Prediction], tool: str,
            config: HfModelConfig | None = None) -> TargetSearch:
    from enginefoundry.inputs.units import Unit
    from enginefoundry.planning.preflight import preflight

    search = spec.search
    assert search is not None
    ts = TargetSearch(target=target.name, covered=True, predictor=cov.label(tool), note=cov.note,
                      seconds=max((p.seconds for p in predictions), default=0.0),
                      cached=sum(p.cached for p in predictions))
    pool: list[Predicted] = []
    for prediction in predictions:
        # A disaggregated search's answers sit beside the aggregated ones of its precision, under their own key.
        kind = prediction.precision.value + (" disagg" if prediction.disagg else "")
        if prediction.problem:
            ts.problems[kind] = prediction.problem
        pool += prediction.ranked
        if prediction.pareto:
            ts.pareto[kind] = prediction.pareto
    objective = search.objective
    if objective is not Objective.TOKENS_PER_GPU and all(objective_value(objective, spec, target, p) is None
                                                          for p in pool) and pool:
        # tokens_per_joule without a predicted power (AIConfigurator 0.12.0 writes power_w 0.0 for these systems), or
        # cost_per_mtok without a price: rank by tokens/s/GPU, and say so.
        ts.note = "; ".join(filter(None, [ts.note, f"no predicted figure for {objective.value}: ranked by "
                                                   "tokens_per_gpu (the measured verify step gives the real one)"]))
        objective = Objective.TOKENS_PER_GPU
    scored = sorted(pool, key=lambda p: -(objective_value(objective, spec, target, p) or float("-inf")))
    seen: set[str] = set()
    config = config if config is not None else lookup(spec).config
    moe_lane = get_lane(spec.lane).moe_parallel
    for p in scored:
        variant, not_a_unit = searched_variant(p, spec.lane, moe_lane)
        unit = Unit(variant=variant, profile=profile_for(search, p.batch_size, f"search-b{p.batch_size}"),
                    target=target)
        name = p.label() if p.disagg else unit.name if not not_a_unit else f"{unit.name} {p.moe_label()}"
        if name in seen:
            continue
        seen.add(name)
        value = objective_value(objective, spec, target, p)
        cand = Candidate(rank=len(ts.candidates) + 1, predicted=p, objective_value=value, unit=unit.name,
                         usd_per_mtok=cost_per_mtok(spec, target, p.tokens_per_s_gpu))
        if p.disagg:
            cand.serving, refused = disagg_serving(spec, p, expert_count(config) > 0)
            not_a_unit = refused or not_a_unit
        if not_a_unit:
            # Building it as another shape would measure another configuration than the one predicted.
            cand.unit = "-"
            cand.verdict = (f"not a unit: {not_a_unit}" if p.disagg else
                            f"not a unit: {p.moe_label()}: {not_a_unit}")
        elif len(ts.units) >= search.top_k:
            cand.verdict = "below top_k"
        else:
            report = preflight(spec, unit, config, None)
            if report.ok:
                cand.chosen, cand.verdict = True, "unit"
                ts.units.append(unit.name)
            else:
                cand.verdict = "refused by preflight: " + "; ".join(c.message for c in report.problems)
        ts.candidates.append(cand)
    if not ts.units:
        ts.reason = "no predicted configuration became a unit: " + (
            "; ".join(f"{k}: {v}" for k, v in ts.problems.items()) or "every one was refused by preflight")
    return ts


def searched_variant(p: Predicted, lane: str, moe_lane: bool) -> tuple[Variant, str | None]:
    """The variant that runs a predicted configuration, or (its tp × pp shape, why none does).

    The predictor's columns are AIConfigurator's (tp, pp, dp = attention tp, pp, attention DP; moe_tp, moe_ep of the
    MoE layers; GPUs = tp × pp × dp). Its own TensorRT-LLM generator turns them into LLM API options as
    tensor_parallel_size = moe_tp × moe_ep and enable_attention_dp = dp > 1 for an MoE model (AIConfigurator 0.12.0
    generator/rule_plugin/trtllm.rule), and TensorRT-LLM's attention DP runs attention with tp 1 on each of the tp
    ranks (mapping.py dp_size = tp_size): a configuration with attention tp inside attention DP is not one TensorRT-LLM
    runs, and one whose MoE world is not its GPUs is not a shape at all.

    A disaggregated configuration (prefill and decode workers) is a variant with `disaggregated` on a lane that
    serves it (lane trtllm: its `trtllm-serve disaggregated` files also travel with the candidate, `disagg_serving`);
    each role's shape is checked by that lane (enginefoundry.lanes.trtllm_disagg)."""
    plain = Variant(precision=p.precision, tp=p.tp, pp=p.pp)
    if p.disagg:
        if not get_lane(lane).disaggregated:
            return plain, f"lane {lane} serves a unit as one server (lane trtllm serves disaggregated)"
        return Variant(precision=p.precision, disaggregated=p.disagg), None
    if p.tp_pp_only:
        return plain, None
    if not moe_lane:
        return plain, f"lane {lane} has no expert/attention-DP parallelism (lane trtllm has: moe_ep, attention_dp)"
    world = p.moe_tp * p.moe_ep
    if p.dp > 1 and p.tp > 1:
        return plain, (f"attention tp {p.tp} inside attention DP {p.dp}: TensorRT-LLM's attention DP runs attention "
                       "with tp 1 on every rank")
    if world != p.tp * p.dp:
        return plain, f"moe_tp × moe_ep = {world} is not its {p.tp * p.dp} attention ranks (tp × dp)"
    return Variant(precision=p.precision, tp=world, pp=p.pp, moe_ep=p.moe_ep, attention_dp=p.dp > 1), None


def disagg_serving(spec: BuildSpec, p: Predicted, moe: bool) -> tuple[DisaggServingFiles | None, str | None]:
    """On lane trtllm with a pinned release: the files that serve a disaggregated configuration, or why that release
    cannot (the first refusal, with its fix). Other lanes and an unpinned toolchain: neither."""
    from enginefoundry.errors import SpecError
    from enginefoundry.lanes.trtllm_disagg import disaggregated_serving

    release = spec.toolchain.trtllm_version
    if p.disagg is None or spec.lane != "trtllm" or not release or spec.search is None:
        return None, None
    try:
        s = disaggregated_serving(p.disagg, release, spec.model.name, isl=spec.search.workload.mean_isl,
                                  osl=spec.search.workload.osl, moe=moe)
    except SpecError as e:
        path, message = e.problems[0]
        return None, f"{path}: {message}"
    return {"release": release, "disagg_config.yaml": s.config, "context.yaml": s.roles["context"],
            "generation.yaml": s.roles["generation"], "commands": s.commands, "to_be_probed": s.to_be_probed}, None


def _fallback(spec: BuildSpec, target: Target, cov: Coverage, config: HfModelConfig | None) -> TargetSearch:
    """A measured search: one unit per allowed precision (up to top_k) that passes preflight, tp = 1."""
    from enginefoundry.inputs.units import Unit
    from enginefoundry.planning.preflight import preflight

    search = spec.search
    assert search is not None
    ts = TargetSearch(target=target.name, covered=False, reason=cov.reason)
    precisions = list(search.precisions)
    if target.arch.value == "cpu" and Precision.FP32 not in precisions:
        precisions.append(Precision.FP32)  # the reference lane's own precision on a cpu
    for precision in precisions:
        if len(ts.units) >= search.top_k:
            break
        unit = Unit(variant=Variant(precision=precision),
                    profile=profile_for(search, search.goodput.max_concurrency, "search-measured"), target=target)
        report = preflight(spec, unit, config, None)
        if report.ok:
            ts.units.append(unit.name)
        else:
            ts.problems[precision.value] = "refused by preflight: " + "; ".join(c.message for c in report.problems)
    return ts


def searched_units(spec: BuildSpec, report: SearchReport) -> list[SearchedUnit]:
    search = spec.search
    assert search is not None
    out = []
    moe_lane = get_lane(spec.lane).moe_parallel
    for ts in report.targets:
        if ts.covered:
            for c in ts.candidates:
                if c.chosen:
                    p = c.predicted
                    out.append(SearchedUnit(
                        target=ts.target, variant=searched_variant(p, spec.lane, moe_lane)[0],
                        profile=profile_for(search, p.batch_size, f"search-b{p.batch_size}"), rank=c.rank,
                        predicted=p.figures(), predictor=ts.predictor, note=ts.note,
                        pareto=ts.pareto.get(p.precision.value) or None))
            continue
        for i, name in enumerate(ts.units, start=1):
            precision = Precision(name.split("-", 1)[0])
            out.append(SearchedUnit(
                target=ts.target, variant=Variant(precision=precision),
                profile=profile_for(search, search.goodput.max_concurrency, "search-measured"), rank=i,
                note=f"measured search: {ts.reason}"))
    return out


def materialise(spec: BuildSpec, only_targets: list[str] | None = None, predictor: Predictor | None = None,
                progress: Callable[[str], None] = print) -> tuple[BuildSpec, SearchReport | None]:
    """The spec with the search's units written into `searched` (a spec that already carries them, e.g. a flow
    payload, is returned as it is: the decision is made once, where the predictor runs)."""
    if spec.search is None or spec.searched:
        return spec, None
    report = run_search(spec, only_targets, predictor, progress)
    return spec.model_copy(update={"searched": searched_units(spec, report)}), report


def disagg_lines(report: SearchReport) -> list[str]:
    """One line per target whose disaggregated search answered: how many configurations, the best one, and how many
    became units (each served by its workers and a router: its benchmark needs the GPUs of both roles)."""
    out = []
    for ts in report.targets:
        found = [c for c in ts.candidates if c.predicted.disagg]
        if found:
            best = found[0]
            chosen = sum(c.chosen for c in found)
            out.append(f"{ts.target}: {len(found)} disaggregated configuration(s) ranked, best rank {best.rank} "
                       f"{best.predicted.tokens_per_s_gpu:.0f} tok/s/GPU on {best.predicted.gpus} GPUs "
                       f"({best.predicted.label()}); {chosen} chosen as units (each needs the GPUs of both roles: "
                       "its workers and the router start on the target's worker)")
    return out


MOE_COLUMNS = ("dp", "moe_tp", "moe_ep")  # AIConfigurator's parallel columns besides tp, pp (ColumnsAgg, 0.12.0)


def rows(report: SearchReport) -> list[dict[str, str]]:
    """The ranked table per target, for the console. A mixture-of-experts model gets the predictor's MoE parallel
    columns (attention data parallelism dp, MoE tensor and expert parallelism moe_tp, moe_ep) and GPUs per replica
    (tp × pp × dp)."""
    moe = report.experts > 0
    blank = dict.fromkeys((*MOE_COLUMNS, "GPUs"), "-") if moe else {}
    out = []
    for ts in report.targets:
        if not ts.covered:
            out.append({"target": ts.target, "rank": "-", "config": "measured search", **blank,
                        "tok/s/GPU": "-", "tok/s/user": "-", "TTFT ms": "-", "$/1M tok": "-",
                        "unit": ", ".join(ts.units) or "none", "why": ts.reason})
            continue
        shown = [c for c in ts.candidates if c.chosen or c.rank <= max(5, 2 * len(ts.units))]
        for c in shown:
            p = c.predicted
            parallel = {"dp": str(p.dp), "moe_tp": str(p.moe_tp), "moe_ep": str(p.moe_ep),
                        "GPUs": str(p.gpus)} if moe else {}
            if moe and p.disagg:  # each role's dp / moe_tp / moe_ep are in its config label
                parallel.update(dp="-", moe_tp="-", moe_ep="-")
            out.append({"target": ts.target, "rank": str(c.rank), "config": p.label(), **parallel,
                        "tok/s/GPU": f"{p.tokens_per_s_gpu:.0f}", "tok/s/user": f"{p.tokens_per_s_user:.1f}",
                        "TTFT ms": f"{p.ttft_ms:.0f}",
                        "$/1M tok": f"{c.usd_per_mtok:.3f}" if c.usd_per_mtok is not None else "-",
                        "unit": c.unit if c.chosen else "-", "why": c.verdict})
        for precision, why in ts.problems.items():
            out.append({"target": ts.target, "rank": "-", "config": precision, **blank, "tok/s/GPU": "-",
                        "tok/s/user": "-", "TTFT ms": "-", "$/1M tok": "-", "unit": "-", "why": why})
    return out
