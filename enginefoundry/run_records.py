"""What a build run records in MLflow beside its units: the parent run (spec, source identity), the cache
hits (a unit run naming the run that built the unit, and a repaired registration), and the end of the run
(metrics and summary.json). Shared by the Prefect tasks (tasks/track.py) and the all-hits fast path
(enginefoundry/noop_run.py), so both record the same. No Prefect here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from enginefoundry.outcomes import hit_outcome, hit_run_tags, unit_params
from enginefoundry.pipeline import RunSummary, UnitOutcome
from enginefoundry.plan import Unit
from enginefoundry.publish import PublishedBuild
from enginefoundry.registration import ensure_registered
from enginefoundry.spec import BuildSpec
from enginefoundry.tracking import Tracker, project_git_commit


def tracker_for(spec: BuildSpec) -> Tracker:
    return Tracker(spec.tracking.mlflow_uri, spec.tracking.experiment)


def start_parent(tracker: Tracker, spec: BuildSpec, source: dict[str, Any], extra_tags: dict[str, str]) -> str:
    # Runs a kill -9-ed run of this host left RUNNING end KILLED now: no run stays RUNNING for ever.
    tracker.end_dead_runs()
    tags = {"enginefoundry.spec": spec.name, "enginefoundry.lane": spec.lane,
            "enginefoundry.git_commit": project_git_commit(), "source.uri": source["uri"],
            "source.revision": source.get("revision") or "", **extra_tags}
    run_id = tracker.start_run(f"{spec.name}", tags)
    tracker.log_params(run_id, {"spec": spec.model_dump(mode="json", exclude={"base_dir"}),
                                "source.weights_digest": source["weights_digest"],
                                "source.tokenizer_digest": source["tokenizer_digest"]})
    return run_id


def record_hit(
    tracker: Tracker, spec: BuildSpec, unit: Unit, key: str, hit: PublishedBuild, parent_run_id: str | None,
    extra_tags: dict[str, str] | None = None,
) -> UnitOutcome:
    """A unit run for a cache hit (which run built it, where it lies), and a repaired registration."""
    run_id = tracker.start_run(unit.name, {**hit_run_tags(key, hit), **(extra_tags or {}),
                                           "enginefoundry.git_commit": project_git_commit()}, parent_run_id)
    tracker.log_params(run_id, unit_params(spec, unit))
    tracker.log_metrics(run_id, {"cache_hit": 1.0})
    reg = ensure_registered(tracker, registered_model=spec.registered_model_name, unit=unit, manifest=hit.manifest,
                            manifest_uri=hit.uri, run_id=run_id, move_alias=False)
    if reg.created or reg.alias_set:
        tracker.set_tags(run_id, {"enginefoundry.registry_repaired": f"version {reg.version}"
                                  + (f", alias {reg.alias}" if reg.alias_set else "")})
    tracker.end_run(run_id, hit.manifest.status == "candidate")
    return hit_outcome(unit, key, hit, run_id)


def finish_parent(tracker: Tracker, run_id: str, ok: bool, summary: dict[str, Any], metrics: dict[str, float],
                  report_dir: Path) -> None:
    tracker.log_metrics(run_id, metrics)
    out = report_dir / "summary.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2))
    tracker.log_artifact(run_id, out)
    tracker.end_run(run_id, ok)


def run_metrics(summary: RunSummary, duration_s: float, fetch_s: float, convert_s: float) -> dict[str, float]:
    return {"units": len(summary.outcomes), "units_ok": sum(o.ok for o in summary.outcomes),
            "duration_s": duration_s, "fetch_s": fetch_s, "convert_s": convert_s}
