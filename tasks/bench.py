"""Stage: benchmark sweep against the served unit (and any baselines), with plots and Prefect artifacts."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Callable
from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from pydantic import JsonValue

from enginefoundry.bench import SweepReport, compare_with_baselines, run_sweep
from enginefoundry.bench.goodput import verify_unit
from enginefoundry.bench.mix import plan_mix, served_figures, served_from_records
from enginefoundry.bench.report import ServedFigures
from enginefoundry.inputs.units import Unit
from enginefoundry.lanes import get_lane
from enginefoundry.model_server import Endpoint, is_alive
from enginefoundry.smoke.serve import ADAPTERS_PATH, SPECULATIVE_PATH
from enginefoundry.spec import BuildSpec
from enginefoundry.tasks._log import progress_logger


def draft_counters(base_url: str) -> Callable[[], tuple[int, int] | None]:
    """(drafted, accepted) draft tokens the unit's server reports (the scoring server's GET /v1/speculative);
    None where it reports none."""
    def read() -> tuple[int, int] | None:
        try:
            with urllib.request.urlopen(base_url.rstrip("/") + SPECULATIVE_PATH, timeout=30) as r:
                data = json.loads(r.read())
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or not data.get("speculative"):
            return None
        drafted, accepted = data.get("drafted"), data.get("accepted")
        return (drafted, accepted) if isinstance(drafted, int) and isinstance(accepted, int) else None
    return read


def served_counts(base_url: str) -> dict[str, tuple[int, int, float]] | None:
    """(requests, completion tokens, seconds) so far per served model name (the scoring server's GET /v1/adapters);
    None where the server reports none."""
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + ADAPTERS_PATH, timeout=30) as r:
            data = json.loads(r.read())
    except (OSError, ValueError):
        return None
    served = data.get("served") if isinstance(data, dict) else None
    if not isinstance(served, dict):
        return None
    out = {}
    for name, c in served.items():
        if isinstance(c, dict) and all(isinstance(c.get(k), int | float) for k in ("requests", "completion_tokens",
                                                                                     "seconds")):
            out[str(name)] = (int(c["requests"]), int(c["completion_tokens"]), float(c["seconds"]))
    return out


def served_between(before: dict[str, tuple[int, int, float]], after: dict[str, tuple[int, int, float]],
                   asked: dict[str, float] | None = None) -> dict[str, ServedFigures]:
    """Each served name's figures (bench/mix.py served_figures) between two readings of served_counts, beside the
    share the spec `asked` for it."""
    totals: dict[str, tuple[int, int, float]] = {}
    for n, (requests, tokens, seconds) in after.items():
        r0, t0, s0 = before.get(n, (0, 0, 0.0))
        totals[n] = (requests - r0, tokens - t0, 1000 * (seconds - s0))  # the latency summed in milliseconds
    return served_figures(totals, asked)


def served_models(spec: BuildSpec, endpoint: Endpoint) -> list[str]:
    """The model names a unit serving adapters answers to (the base's, then each adapter's); [] for any other."""
    if not spec.model.serves_adapters:
        return []
    return [endpoint.model_name, *(a.name for a in spec.model.adapters)]


def adapter_fields(spec: BuildSpec, base_name: str) -> dict[str, dict[str, JsonValue] | None] | None:
    """Where the lane's server selects an adapter by a request field rather than the `model` name (lane trtllm's
    lora_request: `Lane.adapter_request`): each served name's fields (the base: None); None where `model` does."""
    if not spec.model.serves_adapters:
        return None
    lane = get_lane(spec.lane)
    fields = {a.name: lane.adapter_request(spec, a.name) for a in spec.model.adapters}
    if all(f is None for f in fields.values()):
        return None
    return {base_name: None, **fields}


def speculative_twin_sweep(spec: BuildSpec, endpoint: Endpoint, report: SweepReport, out: Path,
                           log: Callable[[str], None], unit: Unit | None) -> SweepReport:
    """The same sweep against the unit without speculation (its twin: the same server asked with the lane's
    non-speculative fields), so that every point has its speed-up; a lane without a twin says so."""
    twin = get_lane(spec.lane).speculative_twin(spec)
    if twin is None:
        why = f"speculation: lane {spec.lane} has no non-speculative twin to measure the speed-up against"
        log(f"bench: {why}")
        return report.model_copy(update={"warnings": [*report.warnings, why]})
    log("bench: the non-speculative twin, for the speed-up: the same points with " + json.dumps(twin))
    fields = {k: json.dumps(v) for k, v in twin.items()}  # --extra-inputs key:value (false, not "false")
    return twin_sweep(spec, endpoint, report, out, log, unit, fields)


def twin_sweep(spec: BuildSpec, endpoint: Endpoint, report: SweepReport, out: Path, log: Callable[[str], None],
               unit: Unit | None, extra_inputs: dict[str, str] | None = None) -> SweepReport:
    """The spec's sweep against the twin `endpoint` (with `extra_inputs`: the unit's own server asked without
    speculation; without: a twin server of its own), under out/twin; `report` gets each point's speed-up."""
    twin_report = run_sweep(spec.benchmark, url=endpoint.base_url, model=endpoint.model_name,
                            tokenizer=endpoint.tokenizer_dir, out=out / "twin", progress=log,
                            server_alive=lambda: is_alive(endpoint.pid), plot_title=None,
                            telemetry=unit is None or unit.target.gpu_count > 0, extra_inputs=extra_inputs)
    report = report.with_twin(twin_report)
    summary = report.speculation_summary()
    log(f"bench: speculation: {', '.join(f'{k} {v}' for k, v in summary.items()) or 'nothing measured'}")
    (out / "sweep.json").write_text(report.model_dump_json(indent=2))
    return report


def twin_served_apart(spec: BuildSpec) -> bool:
    """A speculative spec whose lane has no request switch for its twin but serves it apart (the pipeline then
    measures the twin after the unit's server is stopped: `twin_benchmark`)."""
    lane = get_lane(spec.lane)
    return spec.speculative is not None and lane.speculative_twin(spec) is None and lane.serves_twin_apart


@task(name="benchmark twin", cache_policy=NO_CACHE)
def twin_benchmark(spec: BuildSpec, twin: Endpoint, report: SweepReport, report_dir: str,
                   unit: Unit | None = None) -> SweepReport:
    """The speculative unit's sweep again on its twin server (the lane's `twin_serve_command`), for each point's
    speed-up; sweep.json written again."""
    log = progress_logger()
    log("bench: the non-speculative twin server, for the speed-up: the same points")
    return twin_sweep(spec, twin, report, Path(report_dir), log, unit)


def _artifact_key(prefix: str, title: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return f"{prefix}-{re.sub(r'[^a-z0-9]+', '-', title.lower()).strip('-')}"[:100]


def _verify_searched(spec: BuildSpec, unit: Unit, endpoint: Endpoint, report: SweepReport, out: Path,
                     title: str) -> None:
    """A searched unit's prediction verified against its measured goodput at the SLO, written into `report`."""
    log = progress_logger()
    verdict = verify_unit(spec, unit, url=endpoint.base_url, model=endpoint.model_name,
                          tokenizer=endpoint.tokenizer_dir, out=out / "search", progress=log)
    report.search, report.search_metrics = verdict.model_dump(mode="json"), verdict.metrics()
    report.plots += [str(p) for p in (out / "search").glob("search.png")]
    (out / "sweep.json").write_text(report.model_dump_json(indent=2))
    create_markdown_artifact(key=_artifact_key("search", title), markdown=verdict.markdown(unit.name),
                             description=f"{title}: goodput at the SLO, predicted vs measured, cost and energy")
    if verdict.flagged:
        log(f"search: {unit.name}: prediction error {verdict.prediction_error:+.0%} is beyond the bound "
            f"±{verdict.error_bound:.0%}")


@task(name="benchmark", cache_policy=NO_CACHE)
def benchmark(spec: BuildSpec, endpoint: Endpoint, report_dir: str, title: str, unit: Unit | None = None,
              ) -> SweepReport:
    """`unit`: a searched unit is verified; a unit whose target has no GPU (a cpu target) gets no GPU telemetry
    line at all."""
    log = progress_logger()
    out = Path(report_dir)
    counters = draft_counters(endpoint.base_url) if spec.speculative is not None else None
    served = served_models(spec, endpoint)
    mix = plan_mix(spec, endpoint.model_name, endpoint.tokenizer_dir, served,
                   adapter_fields(spec, endpoint.model_name), out / "datasets")
    if mix.note:
        log(f"bench: {mix.note}")
    model, shares, datasets = mix.model, mix.shares, mix.datasets
    before = served_counts(endpoint.base_url) if served and datasets is None else None
    report = run_sweep(spec.benchmark, url=endpoint.base_url, model=model,
                       tokenizer=endpoint.tokenizer_dir, out=out, progress=log,
                       server_alive=lambda: is_alive(endpoint.pid), plot_title=title,
                       telemetry=unit is None or unit.target.gpu_count > 0, draft_counters=counters,
                       datasets=datasets)
    after = served_counts(endpoint.base_url) if before is not None else None
    if datasets is not None and shares:
        report.served = served_from_records([Path(e).parent for e in report.exports], list(shares), shares)
    if mix.warning is not None:
        log(f"bench: {mix.warning}")
        report = report.model_copy(update={"warnings": [*report.warnings, mix.warning]})
    if before is not None and after is not None:
        report.served = served_between(before, after, shares)
    if report.served:
        log("bench: served: " + ", ".join(f"{n} {f.requests} requests ({f.share:.0%}), mean {f.mean_latency_ms} ms"
                                          for n, f in report.served.items()))
        (out / "sweep.json").write_text(report.model_dump_json(indent=2))
    if spec.speculative is not None and not twin_served_apart(spec):
        report = speculative_twin_sweep(spec, endpoint, report, out, log, unit)
    if unit is not None and unit.searched is not None and spec.search is not None:
        _verify_searched(spec, unit, endpoint, report, out, title)
    if spec.benchmark.baseline_endpoints:
        report.comparison = compare_with_baselines(
            spec.benchmark, report, unit_label=title, unit_url=endpoint.base_url, unit_model=endpoint.model_name,
            tokenizer=endpoint.tokenizer_dir, out=out / "baselines", progress=log)
        if report.comparison.plot:
            report.plots.append(report.comparison.plot)
        (out / "sweep.json").write_text(report.model_dump_json(indent=2))  # now with the comparison
    create_table_artifact(key=_artifact_key("bench", title), table=report.table(),
                          description=f"{title}: benchmark points ({spec.benchmark.tool.value})")
    if report.comparison is not None:
        create_table_artifact(key=_artifact_key("bench-baselines", title), table=report.comparison.table(),
                              description=f"{title} against baselines (ratios are unit / baseline)")
    create_markdown_artifact(key=_artifact_key("slo", title), markdown=report.slo_markdown(),
                             description=f"{title}: SLO verdicts")
    for failure in report.failures:
        log(f"bench: {failure}")
    return report
