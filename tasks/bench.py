"""Stage: benchmark sweep against the served unit, with plots."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from enginefoundry.bench import SweepReport, run_sweep
from enginefoundry.bench.plots import plot_sweep, series_by_scenario
from enginefoundry.serving import Endpoint, is_alive
from enginefoundry.spec import BuildSpec
from tasks._log import progress_logger


@task(name="benchmark", cache_policy=NO_CACHE)
def benchmark(spec: BuildSpec, endpoint: Endpoint, report_dir: str, title: str) -> SweepReport:
    log = progress_logger()
    out = Path(report_dir)
    report = run_sweep(spec.benchmark, url=endpoint.base_url, model=endpoint.model_name,
                       tokenizer=endpoint.tokenizer_dir, out=out, progress=log,
                       server_alive=lambda: is_alive(endpoint.pid))
    if report.points:
        plot_sweep(series_by_scenario(report.points), out / "sweep.png", title)
    return report
