"""A run with nothing to build finishes before it pays for anything: no Prefect (and no ephemeral Prefect
server), no model tooling, no server. The source's identity, the unit keys and the store decide first
(`decide_all_hits`); when every unit has a current, consistent build in the store, the hits are recorded in
MLflow by the flow's own record functions (records/run_records.py: `start_parent`, `record_hit`, `finish_parent`:
a parent run, a unit run per hit, a repaired registration; `record_all_hits`) and the run is done.

Importing the MLflow client and opening its store costs more than everything else of an all-hits run
together (2–3 s idle, 7 s and more on a busy machine), so by default the CLI hands the recording to a
background process (`record_in_background`): the hits to record are first written to a pending file under
the work folder, and the recorder deletes it only once MLflow has them; a pending file that a failed or
killed recorder leaves behind is recorded by the next run (`flush_pending`).

Anything else (a miss, `--force`) returns None and the caller runs the flow, which plans again under
leases. The hits are decided by `cache_plan.check_hits`, the decision the flow's `plan_cache` makes (a unit
whose key an earlier unit has shares its build; every other unit's build is checked by `publish.check_hit`):
a build it refuses is not a hit here either, and the flow rebuilds it.
"""

from __future__ import annotations

import argparse
import os
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from enginefoundry import tracking_tags as mltags
from enginefoundry.errors import InputError, SpecError, StoreError, is_transient
from enginefoundry.inputs.adapters import fetch_adapters
from enginefoundry.inputs.quantized_source import refuse_contradiction
from enginefoundry.inputs.sources import SourceSnapshot, fetch
from enginefoundry.inputs.units import SourceDigests, Unit, expand_units
from enginefoundry.lanes import get_lane
from enginefoundry.lanes.speculation import fetch_speculative_draft
from enginefoundry.planning.cache_plan import check_hits, hit_signature_policy, unit_keys
from enginefoundry.records.run_summary import RunSummary, UnitOutcome
from enginefoundry.settings import work_root
from enginefoundry.spec import BuildSpec, parse_spec
from enginefoundry.store.backends import open_store
from enginefoundry.store.publish import PublishedBuild, read_build


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
    snapshot = fetch(spec.model.parsed_source(spec.base_path), progress=progress,
                     check=lambda quant: refuse_contradiction(spec, quant))
    draft = fetch_speculative_draft(spec, snapshot, progress)
    lane = get_lane(spec.lane)
    adapters = fetch_adapters(spec, snapshot, lane.name, lane.max_lora_rank, progress)
    fetch_s = time.monotonic() - t0
    keyed = unit_keys(spec, units, SourceDigests.of(snapshot, draft, adapters))
    store = open_store(spec.publish.store, spec.publish.s3_endpoint_url)
    hits: dict[str, PublishedBuild] = {}
    for check in check_hits(store, spec.model.name, units, keyed.keys, rehash=rehash, progress=progress,
                            signatures=hit_signature_policy(spec)):
        found = hits[check.duplicate_of] if check.duplicate_of is not None else check.hit
        if found is None:
            return None
        hits[check.unit.name] = found
    return AllHits(source=snapshot, units=units, keys=keyed.keys, hits=hits, fetch_s=fetch_s)


def summary_of(spec: BuildSpec, run: AllHits, parent_run_id: str | None = None,
               outcomes: list[UnitOutcome] | None = None) -> RunSummary:
    from enginefoundry.records.outcomes import hit_outcome

    outcomes = outcomes or [hit_outcome(u, run.keys[u.name], run.hits[u.name], None) for u in run.units]
    return RunSummary(spec=spec.name, source_uri=run.source.uri, source_revision=run.source.revision,
                      parent_run_id=parent_run_id, outcomes=outcomes,
                      stage_seconds={"fetch": round(run.fetch_s, 2), "convert": 0.0})


def record_all_hits(spec: BuildSpec, run: AllHits) -> RunSummary:
    """A parent run with a unit run per hit (registrations repaired), as the flow records a hit."""
    from enginefoundry.records.run_records import finish_parent, record_hit, start_parent, tracker_for

    t0 = time.monotonic()
    tracker = tracker_for(spec)
    parent = start_parent(tracker, spec, run.source.model_dump(mode="json"), {mltags.FAST_PATH: "true"})
    try:
        outcomes = [record_hit(tracker, spec, unit, run.keys[unit.name], run.hits[unit.name], parent)
                    for unit in run.units]
        summary = summary_of(spec, run, parent, outcomes)
        finish_parent(tracker, parent, summary, duration_s=run.fetch_s + time.monotonic() - t0, fetch_s=run.fetch_s,
                      convert_s=0.0)
    except BaseException:
        tracker.end_run(parent, False)
        raise
    return summary


# ------------------------------------------------------------------------------------ in the background


class RecorderDestinations(BaseModel):
    """Where a recorder writes: always the configured destinations of the run that starts it (its command line),
    never what a pending file says. MLflow's credentials (MLFLOW_TRACKING_TOKEN, …) go only to this URI."""

    model_config = ConfigDict(frozen=True)

    store: str
    mlflow_uri: str
    s3_endpoint_url: str | None = None

    @classmethod
    def of(cls, spec: BuildSpec) -> RecorderDestinations:
        return cls(store=spec.publish.store, mlflow_uri=spec.tracking.mlflow_uri,
                   s3_endpoint_url=spec.publish.s3_endpoint_url)

    def argv(self) -> list[str]:
        return ["--store", self.store, "--mlflow-uri", self.mlflow_uri,
                *(["--s3-endpoint-url", self.s3_endpoint_url] if self.s3_endpoint_url else [])]


# Spec fields that name a destination: a pending file never carries them (a planted one that does is refused).
_DESTINATION_FIELDS = (("publish", "store"), ("publish", "s3_endpoint_url"), ("tracking", "mlflow_uri"))
PENDING_MAX_AGE_S = 24 * 3600.0  # a record no recorder could record in a day is dropped, with a message


class PendingHits(BaseModel):
    """A pending file: the hits of one all-hits run, bound to the store they were found in (`store`; every build
    must be that store's, and still published there with the same manifest digest when it is recorded)."""

    model_config = ConfigDict(extra="forbid")

    store: str
    spec: dict[str, Any]  # JSON edge: the spec as recorded
    base_dir: str | None
    run: AllHits

    @field_validator("spec")
    @classmethod
    def _no_destinations(cls, spec: dict[str, Any]) -> dict[str, Any]:  # JSON edge: the spec as recorded
        if any(not isinstance(spec.get(section) or {}, dict) for section in ("publish", "tracking")):
            raise ValueError("publish and tracking must be mappings")
        named = [".".join(f) for f in _DESTINATION_FIELDS if isinstance(spec.get(f[0]), dict) and f[1] in spec[f[0]]]
        if named:
            raise ValueError(f"names destinations of its own ({', '.join(named)}); a pending record never does")
        return spec

    @model_validator(mode="after")
    def _one_store(self) -> PendingHits:
        others = sorted({b.store_uri for b in self.run.hits.values()} - {self.store})
        if others:
            raise ValueError(f"lists builds of another store ({', '.join(others)[:200]}) than its own {self.store}")
        return self


def _without_destinations(spec: BuildSpec) -> dict[str, Any]:  # JSON edge: the spec as recorded
    data = spec.model_dump(mode="json")
    for section, field in _DESTINATION_FIELDS:
        data.get(section, {}).pop(field, None)
    return data


def pending_dir() -> Path:
    return work_root() / "pending-hits"


def record_in_background(spec: BuildSpec, run: AllHits) -> tuple[int, Path]:
    """Write the hits to a pending file, start a detached recorder for it; its pid and log."""
    folder = pending_dir()
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
    pending = folder / f"{name}.json"
    tmp = folder / f".{name}.partial"
    store = next((b.store_uri for b in run.hits.values()), spec.publish.store)  # the opened store's own URI
    tmp.write_text(PendingHits(store=store, spec=_without_destinations(spec), base_dir=spec.base_dir,
                               run=run).model_dump_json())
    os.replace(tmp, pending)  # a pending file is whole or absent
    return _start_recorder([str(pending)], RecorderDestinations.of(spec), folder / f"{name}.log")


def flush_in_background(spec: BuildSpec) -> tuple[int, Path] | None:
    """What earlier recorders left behind, recorded by a detached recorder (a run never waits for it: a record
    naming an MLflow that is down must not hold a run up); None when nothing is pending."""
    folder = pending_dir()
    if not folder.is_dir() or not any(folder.glob("*.json")):
        return None
    return _start_recorder([], RecorderDestinations.of(spec), folder / f"flush-{os.getpid()}.log")


def _start_recorder(pending: list[str], dest: RecorderDestinations, log: Path) -> tuple[int, Path]:
    with log.open("wb") as out:  # kept: what the recorder said, if it failed
        proc = subprocess.Popen([sys.executable, "-m", "enginefoundry.planning.noop_run", *pending, *dest.argv()],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, "EF_WORK_DIR": str(work_root())})
    return proc.pid, log


class RefusedRecord(ValueError):
    """A pending file that is not a record of this store's hits: dropped, never recorded."""


PENDING_MAX_BYTES = 16 << 20  # a record lists a run's hits: a few KiB per unit


def _pending_bytes(path: Path) -> bytes:
    """A pending file's bytes: a regular file (never read through a link, never a FIFO or device that would hang
    or never end the read) of at most PENDING_MAX_BYTES; RefusedRecord otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError as err:
        raise RefusedRecord(f"not a readable regular file ({err.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise RefusedRecord("not a regular file")
        if info.st_size > PENDING_MAX_BYTES:
            raise RefusedRecord(f"{info.st_size} bytes: larger than any record ({PENDING_MAX_BYTES})")
        return f.read(PENDING_MAX_BYTES + 1)


def read_pending(path: Path, dest: RecorderDestinations) -> tuple[BuildSpec, AllHits] | None:
    """A pending file's spec (with `dest` as its destinations) and hits; None when it belongs to another store
    (left for a run of that store); RefusedRecord when it is malformed, names destinations of its own, or lists a
    build that is not published in its store under the digest it names."""
    try:
        pending = PendingHits.model_validate_json(_pending_bytes(path))
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'record'}: {e['msg']}" for e in err.errors()[:3])
        raise RefusedRecord(f"not a valid pending record ({problems})") from None
    store = open_store(dest.store, dest.s3_endpoint_url)
    if pending.store != store.uri:
        return None
    publish, tracking = pending.spec.get("publish") or {}, pending.spec.get("tracking") or {}
    data = {**pending.spec, "publish": {**publish, "store": dest.store, "s3_endpoint_url": dest.s3_endpoint_url},
            "tracking": {**tracking, "mlflow_uri": dest.mlflow_uri}}
    try:
        spec = parse_spec(data, source=str(path), base_dir=Path(pending.base_dir) if pending.base_dir else None)
    except SpecError as err:
        raise RefusedRecord(f"its spec is invalid: {err}") from None
    for unit, build in pending.run.hits.items():
        try:
            stored = read_build(store, build.model, build.key, build.build_id, "unit")
        except (StoreError, InputError) as err:
            if is_transient(err):  # the store is unreachable now: the record is given back for a later recorder
                raise
            raise RefusedRecord(f"unit {unit}: build {build.build_id} is not in {dest.store} ({err})") from None
        if stored.manifest_sha256 != build.manifest_sha256:
            raise RefusedRecord(f"unit {unit}: build {build.build_id} has another manifest digest in {dest.store}")
    return spec, pending.run


def record_pending(path: Path, dest: RecorderDestinations,
                   progress: Callable[[str], None] = lambda _: None) -> RunSummary | None:
    """Record one pending file in `dest`'s MLflow; None when another recorder has claimed it, when it belongs
    to another store, or when it was refused (then it is dropped, with a message). A claim is an atomic rename,
    so two recorders never record one file twice; a failed recording gives the file back for the next run."""
    claimed = path.with_name(f"{path.stem}.{os.getpid()}.recording")
    try:
        os.rename(path, claimed)
    except FileNotFoundError:
        return None
    try:
        found = read_pending(claimed, dest)
    except RefusedRecord as err:
        progress(f"tracking: dropped the pending record {path.name}: {err}")
        claimed.unlink(missing_ok=True)
        return None
    except BaseException:
        os.rename(claimed, path.with_name(f"{path.stem}.json"))
        raise
    if found is None:
        os.rename(claimed, path.with_name(f"{path.stem}.json"))
        return None
    try:
        summary = record_all_hits(*found)
    except BaseException:
        os.rename(claimed, path.with_name(f"{path.stem}.json"))
        raise
    claimed.unlink(missing_ok=True)
    return summary


def flush_pending(dest: RecorderDestinations, progress: Callable[[str], None] = lambda _: None,
                  min_age_s: float = 60.0, max_age_s: float = PENDING_MAX_AGE_S) -> int:
    """Record what earlier recorders left behind (failed, or killed mid-way), oldest first; how many were
    recorded. A file younger than `min_age_s` may still be in a live recorder's hands and is left to it; one
    older than `max_age_s` is dropped with a message (whatever it names, it never holds anything up)."""
    folder = pending_dir()
    if not folder.is_dir():
        return 0
    for stuck in folder.glob("*.recording"):  # its recorder was killed: give it back
        if time.time() - stuck.lstat().st_mtime > 600:
            os.replace(stuck, folder / f"{stuck.name.split('.')[0]}.json")
    done = 0
    for path in sorted(folder.glob("*.json")):
        age = time.time() - path.lstat().st_mtime  # a dangling link is dropped, not a crash
        if age < min_age_s:
            continue
        if age > max_age_s:
            progress(f"tracking: dropped the pending record {path.name}: not recorded in {age / 3600:.0f} h")
            path.unlink(missing_ok=True)
            continue
        try:
            done += record_pending(path, dest, progress) is not None
        except Exception as err:
            progress(f"tracking: could not record {path.name} yet: {type(err).__name__}: {str(err)[:200]}")
    return done


def main(argv: list[str]) -> int:
    """The background recorder: this run's hits (if a pending file is named), then anything earlier recorders
    left behind, in the destinations given on its command line."""
    parser = argparse.ArgumentParser(prog="python -m enginefoundry.planning.noop_run")
    parser.add_argument("pending", nargs="?")
    parser.add_argument("--store", required=True)
    parser.add_argument("--mlflow-uri", required=True)
    parser.add_argument("--s3-endpoint-url")
    args = parser.parse_args(argv)
    dest = RecorderDestinations(store=args.store, mlflow_uri=args.mlflow_uri, s3_endpoint_url=args.s3_endpoint_url)
    if args.pending:
        pending = Path(args.pending)
        summary = record_pending(pending, dest, print)
        if summary is not None:
            pending.with_suffix(".log").unlink(missing_ok=True)  # recorded: nothing to keep
            print(f"recorded {len(summary.outcomes)} cache hit(s) under MLflow parent run {summary.parent_run_id}")
    flush_pending(dest, print)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
