"""Cache planning: which units of a run are published already (hits), which this run builds (misses, each
under a build lease), and which share a key with another unit of the same run (duplicates).

Two targets with the same identity (arch, SKUs, GPU count) give units with one key: the run builds it once
and records the others as hits of it; taking the lease twice would make the run wait for itself.

A miss is built under a lease (enginefoundry/store/lease.py): a concurrent run of the same key waits for our
build and records a hit. With `force` the run builds a new build whatever is published, and never adopts
another run's build: it waits for a live holder to finish, then takes the lease itself.

The store is read only through `find_hit`: the content-addressed store's current build of a key
(enginefoundry/store/publish.py `find_current`), trusted only when `publish.check_hit` finds nothing wrong.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from enginefoundry.errors import PipelineError, StoreError
from enginefoundry.evidence.signing import TrustPolicy, run_policy, signer_from_env
from enginefoundry.inputs.units import KeyComponents, SourceDigests, Unit, toolchain_identity, unit_key_components
from enginefoundry.lanes import get_lane
from enginefoundry.settings import EnvSettings
from enginefoundry.spec import BuildSpec
from enginefoundry.store.backends import Store
from enginefoundry.store.layout import lease_key
from enginefoundry.store.lease import DEFAULT_TTL_S, HeldLease, new_owner, try_acquire, wait_for
from enginefoundry.store.publish import PublishedBuild, check_hit, find_current, quarantine_problems

# How long a run waits for another live run that builds the same key (its lease is renewed meanwhile).
WAIT_FOR_OTHER_RUN_S = EnvSettings.read().lease_wait_s

Progress = Callable[[str], None]


def hit_signature_policy(spec: BuildSpec) -> TrustPolicy | None:
    """What a cache hit's attestations must pass when the spec requires signatures (publish.require_signature):
    signed, consistent, and by one of the spec's trusted keys when it names any; None when it does not require
    them. An unsigned hit is refused (and rebuilt, signed): a run must not report a build as its result that its
    own spec's pull, promote and rollout then refuse."""
    if not spec.publish.require_signature:
        return None
    return run_policy(spec, signer_from_env()).model_copy(update={"require_signature": False})


def _signature_refusal(store: Store, build: PublishedBuild, policy: TrustPolicy) -> str | None:
    from enginefoundry.evidence.attest import verify_attestations

    verdict = verify_attestations(store, build, policy)
    if verdict.state in ("verified", "untrusted"):
        return None
    return f"publish.require_signature is true: {verdict.line()}"


def find_hit(store: Store, model: str, key: str, rehash: bool = False,
             progress: Progress = lambda _: None, quarantine: bool = True,
             signatures: TrustPolicy | None = None) -> PublishedBuild | None:
    """The current build of a key when it can be trusted as a cache hit (`publish.check_hit`: schema, key
    recomputed from its key components and matching its location, every blob present with its size; with
    `rehash` every sha256 too; with `signatures` (`hit_signature_policy`) its attestations too); None for a miss
    or a refused build (which the run then rebuilds). A refused build's corrupt blobs are quarantined (unless
    `quarantine` is False: `explain` only reads), so the rebuild writes fresh ones instead of listing them
    again."""
    try:
        build = find_current(store, model, key)
    except StoreError as err:
        progress(f"cache: {key[:12]}: refused ({err}); rebuilding")
        return None
    if build is None:
        return None
    problems = check_hit(store, build, rehash=rehash)
    if problems:
        moved = quarantine_problems(store, build, problems) if quarantine else []
        progress(f"cache: {key[:12]}: build {build.build_id} refused: " + "; ".join(p.line() for p in problems[:5])
                 + (f" (+{len(problems) - 5} more)" if len(problems) > 5 else "")
                 + "".join(f"; quarantined {m}" for m in moved) + "; rebuilding")
        return None
    if signatures is not None and (why := _signature_refusal(store, build, signatures)):
        progress(f"cache: {key[:12]}: build {build.build_id} refused: {why}; rebuilding")
        return None
    return build


class HitCheck(NamedTuple):
    """One unit's hit decision: a duplicate of an earlier unit of the run with its key (not looked up again),
    else the trusted current build of its key (`find_hit`), None for a miss."""

    unit: Unit
    key: str
    duplicate_of: str | None
    hit: PublishedBuild | None


def check_hits(store: Store, model: str, units: list[Unit], keys: dict[str, str], *, force: bool = False,
               rehash: bool = False, progress: Progress = print,
               signatures: TrustPolicy | None = None) -> Iterator[HitCheck]:
    """The hit decision of every unit, in spec order, made as it is asked for (a caller may act on one unit, e.g.
    take its lease, before the next is looked up, or stop at the first miss). The one decision the flow
    (`plan_cache`) and the all-hits fast path (`noop_run.decide_all_hits`) share. With `force` every first unit
    of a key is a miss; `signatures` (`hit_signature_policy`): a hit's attestations must pass it too."""
    first_with_key: dict[str, str] = {}
    for unit in units:
        key = keys[unit.name]
        if key in first_with_key:
            yield HitCheck(unit, key, first_with_key[key], None)
            continue
        first_with_key[key] = unit.name
        yield HitCheck(unit, key, None,
                       None if force else find_hit(store, model, key, rehash, progress, signatures=signatures))


class CachePlan(BaseModel):
    """What a run builds and what it takes from the store, by unit name."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    hits: dict[str, PublishedBuild] = Field(default_factory=dict)
    misses: list[Unit] = Field(default_factory=list, description="units this run builds, in spec order")
    duplicates: dict[str, str] = Field(default_factory=dict, description="unit → the unit of its key built here")
    leases: dict[str, HeldLease] = Field(default_factory=dict, description="unit key → the lease this run holds")

    def is_hit(self, unit: Unit) -> bool:
        return unit.name in self.hits or self.duplicates.get(unit.name) in self.hits

    def hit_of(self, unit: Unit) -> PublishedBuild | None:
        return self.hits.get(unit.name) or self.hits.get(self.duplicates.get(unit.name, ""))

    def release(self, progress: Progress = print) -> None:
        for key, held in self.leases.items():
            held.release()
            if held.lost:
                progress(f"the build lease of {key[:12]} was {held.lost_reason()}: another run may have built "
                         "the same key")
        self.leases.clear()


def plan_cache(
    model: str, units: list[Unit], keys: dict[str, str], store: Store, *, force: bool = False,
    rehash: bool = False, owner: str | None = None, progress: Progress = print, lease_ttl_s: float = DEFAULT_TTL_S,
    wait_timeout_s: float = WAIT_FOR_OTHER_RUN_S, signatures: TrustPolicy | None = None,
) -> CachePlan:
    """Decide hits, misses and duplicates; take the build lease of every miss (waiting for a live run that
    builds the same key). `rehash`: a hit's files are re-hashed too (`--verify-hits`). The caller releases
    the leases with `plan.release()` when its builds are done. `signatures`: `hit_signature_policy`."""
    owner = owner or new_owner()
    plan = CachePlan()
    try:
        for unit, key, duplicate_of, hit in check_hits(store, model, units, keys, force=force, rehash=rehash,
                                                       progress=progress, signatures=signatures):
            if duplicate_of is not None:
                plan.duplicates[unit.name] = duplicate_of
                continue
            if hit is None:
                held, hit = _lease_or_wait(store, model, key, owner, force=force, progress=progress,
                                           ttl_s=lease_ttl_s, timeout_s=wait_timeout_s, signatures=signatures)
                if held is not None:
                    plan.leases[key] = held
                    plan.misses.append(unit)
                    continue
            assert hit is not None
            plan.hits[unit.name] = hit
    except BaseException:
        plan.release()
        raise
    return plan


def _lease_or_wait(
    store: Store, model: str, key: str, owner: str, *, force: bool, progress: Progress, ttl_s: float,
    timeout_s: float, signatures: TrustPolicy | None = None,
) -> tuple[HeldLease | None, PublishedBuild | None]:
    """Take the build lease for a key, or wait for the live run that holds it: without `force` until its
    build is published (a hit), with `force` until its lease is gone (then build our own)."""
    lkey = lease_key(model, key)
    deadline = time.monotonic() + timeout_s
    while True:
        held = try_acquire(store, lkey, owner, ttl_s=ttl_s)
        if held is not None:
            return held, None
        left = deadline - time.monotonic()
        if left <= 0:
            raise PipelineError(
                f"another run has held the build lease of {key[:12]} for over {timeout_s:.0f} s; if no run is "
                f"building it, clear it with `enginefoundry leases --break {key}`")

        def published() -> bool:
            return not force and find_hit(store, model, key, signatures=signatures) is not None

        if wait_for(store, published, lkey, timeout_s=left, progress=progress):
            hit = find_hit(store, model, key, progress=progress, signatures=signatures)
            if hit is not None:
                return None, hit
        # The holder finished without publishing (it failed), or died, or we force a build: take it over.


class UnitKeys(BaseModel):
    """Every unit's key components and key, from the source's identity and the toolchain's versions."""

    components: dict[str, KeyComponents]
    keys: dict[str, str]


def unit_keys(spec: BuildSpec, units: list[Unit], source: SourceDigests) -> UnitKeys:
    """`source`: the fetched sources' digests (the model's; the `speculative.draft`'s where the spec has one; each
    fetched adapter's by name) and a pre-quantized source's own quantization (`SourceDigests.of` the snapshots)."""
    toolchain = toolchain_identity(spec, get_lane(spec.lane).versions())
    components = {unit.name: KeyComponents.of(unit_key_components(spec, unit, source, toolchain, spec.lane_options))
                  for unit in units}
    return UnitKeys(components=components, keys={name: c.key for name, c in components.items()})
