"""A run with nothing to build finishes before it pays for anything: no Prefect (and no ephemeral Prefect
server), no model tooling, no server. The source's identity, the unit keys and the store decide first
(`decide_all_hits`); when every unit has a current, consistent build in the store, the hits are recorded in
MLflow as the flow records them (a parent run, a unit run per hit, a repaired registration:
`record_all_hits`) and the run is done.

Importing the MLflow client and opening its store costs more than everything else of an all-hits run
together (2–3 s idle, 7 s and more on a busy machine), so by default the CLI hands the recording to a
background process (`record_in_background`): the hits to record are first written to a pending file under
the work folder, and the recorder deletes it only once MLflow has them; a pending file that a failed or
killed recorder leaves behind is recorded by the next run (`flush_pending`).

Anything else (a miss, `--force`) returns None and the caller runs the flow, which plans again under
leases. The store is read only through `cache_plan.find_hit`, the same check the flow makes
(`publish.check_hit`): a build it refuses is not a hit here either, and the flow rebuilds it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from enginefoundry import tracking_tags as mltags
from enginefoundry.cache_plan import find_hit, unit_keys
from enginefoundry.publish import PublishedBuild
from enginefoundry.run_summary import RunSummary, work_root
from enginefoundry.sources import SourceSnapshot, fetch
from enginefoundry.spec import BuildSpec, parse_spec
from enginefoundry.store import open_store
from enginefoundry.units import Unit, expand_units


class AllHits(BaseModel):
    """Every unit of a run, each with its key and the published build it hits."""

    source: SourceSnapshot
    units: list[Unit]
    keys: dict[str, str]
    hits: dict[str, PublishedBuild]
    fetch_s: float


def decide_all_hits(spec: BuildSpec, targets: list[str] | None = None,
                    progress: Callable[[str], None] = lambda _: None, rehash: bool = False) -> AllHits | None:
    """The run's hits when every unit has a current build that `publish.check_hit` trusts (with `rehash`:
    every file re-hashed too), else None: the flow then plans again and rebuilds what is refused."""
    t0 = time.monotonic()
    units = expand_units(spec, targets or None)
    snapshot = fetch(spec.model.parsed_source(spec.base_path), progress=progress)
    fetch_s = time.monotonic() - t0
    keyed = unit_keys(spec, units, snapshot.weights_digest, snapshot.tokenizer_digest)
    store = open_store(spec.publish.store, spec.publish.s3_endpoint_url)
    hits: dict[str, PublishedBuild] = {}
    for unit in units:
        key = keyed.keys[unit.name]
        found = (next((hits[u] for u in hits if keyed.keys[u] == key), None)
                 or find_hit(store, spec.model.name, key, rehash, progress))
        if found is None:
            return None
        hits[unit.name] = found
    return AllHits(source=snapshot, units=units, keys=keyed.keys, hits=hits, fetch_s=fetch_s)


def summary_of(spec: BuildSpec, run: AllHits, parent_run_id: str | None = None,
               outcomes: list[Any] | None = None) -> RunSummary:
    from enginefoundry.outcomes import hit_outcome

    outcomes = outcomes or [hit_outcome(u, run.keys[u.name], run.hits[u.name], None) for u in run.units]
    return RunSummary(spec=spec.name, source_uri=run.source.uri, source_revision=run.source.revision,
                      parent_run_id=parent_run_id, outcomes=outcomes,
                      stage_seconds={"fetch": round(run.fetch_s, 2), "convert": 0.0})


def record_all_hits(spec: BuildSpec, run: AllHits) -> RunSummary:
    """A parent run with a unit run per hit (registrations repaired), as the flow records a hit."""
    from enginefoundry.run_records import finish_parent, record_hit, run_metrics, start_parent, tracker_for

    t0 = time.monotonic()
    tracker = tracker_for(spec)
    parent = start_parent(tracker, spec, run.source.model_dump(mode="json"), {mltags.FAST_PATH: "true"})
    try:
        outcomes = [record_hit(tracker, spec, unit, run.keys[unit.name], run.hits[unit.name], parent)
                    for unit in run.units]
        summary = summary_of(spec, run, parent, outcomes)
        finish_parent(tracker, parent, summary.ok, summary.model_dump(mode="json"),
                      run_metrics(summary, run.fetch_s + time.monotonic() - t0, run.fetch_s, 0.0),
                      work_root() / "runs" / parent)
    except BaseException:
        tracker.end_run(parent, False)
        raise
    return summary


# ------------------------------------------------------------------------------------ in the background


class PendingHits(BaseModel):
    spec: dict[str, Any]
    base_dir: str | None
    run: AllHits


def pending_dir() -> Path:
    return work_root() / "pending-hits"


def record_in_background(spec: BuildSpec, run: AllHits) -> tuple[int, Path]:
    """Write the hits to a pending file, start a detached recorder for it; its pid and log."""
    folder = pending_dir()
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
    pending = folder / f"{name}.json"
    tmp = folder / f".{name}.partial"
    tmp.write_text(PendingHits(spec=spec.model_dump(mode="json"), base_dir=spec.base_dir, run=run)
                   .model_dump_json())
    os.replace(tmp, pending)  # a pending file is whole or absent
    log = folder / f"{name}.log"  # kept: what the recorder said, if it failed
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "enginefoundry.noop_run", str(pending)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, "EF_WORK_DIR": str(work_root())})
    return proc.pid, log


def record_pending(path: Path) -> RunSummary | None:
    """Record one pending file; None when another recorder has claimed it. A claim is an atomic rename, so
    two recorders never record one file twice; a failed recording gives the file back for the next run."""
    claimed = path.with_name(f"{path.stem}.{os.getpid()}.recording")
    try:
        os.rename(path, claimed)
    except FileNotFoundError:
        return None
    try:
        pending = PendingHits.model_validate_json(claimed.read_text())
        spec = parse_spec(pending.spec, source=str(path),
                          base_dir=Path(pending.base_dir) if pending.base_dir else None)
        summary = record_all_hits(spec, pending.run)
    except BaseException:
        os.rename(claimed, path.with_name(f"{path.stem}.json"))
        raise
    claimed.unlink(missing_ok=True)
    return summary


def flush_pending(progress: Callable[[str], None] = lambda _: None, min_age_s: float = 60.0) -> int:
    """Record what earlier recorders left behind (failed, or killed mid-way), oldest first; how many were
    recorded. A file younger than `min_age_s` may still be in a live recorder's hands and is left to it."""
    folder = pending_dir()
    if not folder.is_dir():
        return 0
    for stuck in folder.glob("*.recording"):  # its recorder was killed: give it back
        if time.time() - stuck.stat().st_mtime > 600:
            os.replace(stuck, folder / f"{stuck.name.split('.')[0]}.json")
    done = 0
    for path in sorted(folder.glob("*.json")):
        if time.time() - path.stat().st_mtime < min_age_s:
            continue
        try:
            done += record_pending(path) is not None
        except Exception as err:
            progress(f"tracking: could not record {path.name} yet: {type(err).__name__}: {str(err)[:200]}")
    return done


def main(argv: list[str]) -> int:
    """The background recorder: this run's hits, then anything earlier recorders left behind."""
    pending = Path(argv[0])
    summary = record_pending(pending)
    if summary is not None:
        pending.with_suffix(".log").unlink(missing_ok=True)  # recorded: nothing to keep
        print(f"recorded {len(summary.outcomes)} cache hit(s) under MLflow parent run {summary.parent_run_id}")
    flush_pending(print)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
