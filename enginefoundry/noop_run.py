"""A run with nothing to build finishes before it pays for anything: no Prefect (and no ephemeral Prefect
server), no model tooling, no server. The source's identity, the unit keys and the store decide first; when
every unit has a current, consistent build in the store, the hits are recorded in MLflow (as the flow
records them: a parent run and a unit run per hit, a repaired registration) and the run is done.

Anything else (a miss, `--force`) returns None and the caller runs the flow, which plans again under
leases. The store is read only through `check_hit` (the function to swap for the verifying store's own).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from enginefoundry.cache_plan import PublishedUnit, find_current, unit_keys
from enginefoundry.pipeline import RunSummary, work_root
from enginefoundry.plan import expand_units
from enginefoundry.run_records import finish_parent, record_hit, run_metrics, start_parent, tracker_for
from enginefoundry.sources import fetch
from enginefoundry.spec import BuildSpec
from enginefoundry.store import Store, open_store


def check_hit(store: Store, model: str, key: str) -> PublishedUnit | None:
    """The current build of a key when its manifest is consistent with where it lies (its own key)."""
    hit = find_current(store, model, key)
    if hit is None or hit.manifest.key != key or hit.manifest.model != model:
        return None
    return hit


def run_if_all_hits(spec: BuildSpec, targets: list[str] | None = None,
                    progress: Callable[[str], None] = lambda _: None) -> RunSummary | None:
    """The run's summary when every unit is published already, else None (nothing was recorded)."""
    t0 = time.monotonic()
    units = expand_units(spec, targets or None)
    snapshot = fetch(spec.model.parsed_source(spec.base_path), progress=progress)
    fetch_s = time.monotonic() - t0
    keyed = unit_keys(spec, units, snapshot.weights_digest, snapshot.tokenizer_digest)
    store = open_store(spec.publish.store, spec.publish.s3_endpoint_url)
    hits: dict[str, PublishedUnit] = {}
    for unit in units:
        key = keyed.keys[unit.name]
        found = next((hits[u] for u in hits if keyed.keys[u] == key), None) or check_hit(store, spec.model.name, key)
        if found is None:
            return None
        hits[unit.name] = found
    progress(f"all {len(units)} unit(s) are published: recording the cache hits, nothing to build")
    tracker = tracker_for(spec)
    parent = start_parent(tracker, spec, snapshot.model_dump(mode="json"), {"enginefoundry.fast_path": "true"})
    ok = False
    try:
        outcomes = [record_hit(tracker, spec, unit, keyed.keys[unit.name], hits[unit.name], parent)
                    for unit in units]
        summary = RunSummary(spec=spec.name, source_uri=snapshot.uri, source_revision=snapshot.revision,
                             parent_run_id=parent, outcomes=outcomes,
                             stage_seconds={"fetch": round(fetch_s, 2), "convert": 0.0,
                                            "total": round(time.monotonic() - t0, 2)})
        ok = summary.ok
        finish_parent(tracker, parent, ok, summary.model_dump(mode="json"),
                      run_metrics(summary, time.monotonic() - t0, fetch_s, 0.0), work_root() / "runs" / parent)
    except BaseException:
        tracker.end_run(parent, False)
        raise
    return summary
