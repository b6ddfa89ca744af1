"""A fleet's MLflow record: one run for the fleet, each member spec's build run nested under it (where both live in
one experiment of one tracking server) or at least tagged with it, and the fleet summary as the run's artifact."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel

from enginefoundry import tracking_tags as mltags
from enginefoundry.records.tracking import Tracker, redact
from enginefoundry.rollout.fleet import FleetSummary
from enginefoundry.tasks._log import progress_logger
from enginefoundry.tasks.track import prefect_context


class FleetRun(BaseModel):
    """Where the fleet's run lives: a tracking URI and an experiment (the first member spec's)."""

    tracking_uri: str
    experiment: str
    run_id: str


@task(name="start fleet MLflow run", cache_policy=NO_CACHE)
def start_fleet_run(name: str, tracking_uri: str, experiment: str, spec_paths: list[str],
                    pool_limits: dict[str, int]) -> FleetRun:
    tracker = Tracker(tracking_uri, experiment)
    run_id = tracker.start_run(f"fleet {name}", {mltags.FLEET: name, **prefect_context()})
    tracker.log_params(run_id, {"fleet": {"specs": len(spec_paths), **{f"pool_limit.{p}": n
                                                                         for p, n in pool_limits.items()}}})
    progress_logger()(f"MLflow fleet run {run_id} in {redact(tracking_uri)} (experiment {experiment})")
    return FleetRun(tracking_uri=tracking_uri, experiment=experiment, run_id=run_id)


@task(name="link build run to the fleet", cache_policy=NO_CACHE)
def link_to_fleet(fleet: FleetRun, tracking_uri: str, experiment: str, build_run_id: str) -> None:
    """The member's build run names the fleet's run; it is nested under it when both are in one experiment."""
    tracker = Tracker(tracking_uri, experiment)
    tags = {mltags.FLEET_RUN_ID: fleet.run_id}
    if (tracking_uri, experiment) == (fleet.tracking_uri, fleet.experiment):
        tags[mltags.MLFLOW_PARENT_RUN_ID] = fleet.run_id
    tracker.set_tags(build_run_id, tags)


@task(name="finish fleet MLflow run", cache_policy=NO_CACHE)
def finish_fleet_run(fleet: FleetRun, summary: FleetSummary) -> None:
    tracker = Tracker(fleet.tracking_uri, fleet.experiment)
    counts = summary.counts()
    tracker.log_metrics(fleet.run_id, {"fleet_specs": len(summary.members), "fleet_duration_s": summary.duration_s,
                                       **{f"fleet_{status}": counts.get(status, 0)
                                          for status in ("promoted", "held", "built", "unchanged", "failed")}})
    with tempfile.TemporaryDirectory() as tmp:
        for file, text in (("fleet.json", json.dumps(summary.model_dump(mode="json"), indent=2)),
                           ("fleet.md", summary.markdown())):
            path = Path(tmp) / file
            path.write_text(text)
            tracker.log_artifact(fleet.run_id, path, "fleet")
    tracker.end_run(fleet.run_id, summary.ok)
