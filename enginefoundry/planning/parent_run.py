"""One build-engines run after its fetch and cache check (`ParentRun`): what flows/build_engines.py carries from
the plan to the units' dispatch."""

from __future__ import annotations

from dataclasses import dataclass

from enginefoundry.inputs.sources import SourceSnapshot
from enginefoundry.inputs.units import Unit
from enginefoundry.planning.cache_plan import CachePlan, UnitKeys
from enginefoundry.smoke.sibling import SiblingRef
from enginefoundry.spec import BuildSpec
from enginefoundry.store.backends import Store


@dataclass(frozen=True)
class ParentRun:
    """One build-engines run after its fetch and cache check: the spec pinned to what was fetched, the units'
    keys, the cache plan (its misses under this run's leases), the waves the misses build in."""

    spec: BuildSpec
    units: list[Unit]
    snapshot: SourceSnapshot
    draft: SourceSnapshot | None
    adapters: dict[str, SourceSnapshot]
    parent: str  # the MLflow parent run
    keyed: UnitKeys
    artifacts: Store
    plan: CachePlan
    siblings: dict[str, SiblingRef]
    waves: list[list[Unit]]
    force: bool
    fetch_s: float
