"""`explain`: for each unit, hit or miss; for a miss, which key components differ from the nearest
published unit of the same model and target."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from enginefoundry.inputs.sources import SourceSnapshot
from enginefoundry.inputs.units import SourceDigests, expand_units, key_of, toolchain_identity, unit_key_components
from enginefoundry.lanes import get_lane
from enginefoundry.planning.cache_plan import find_hit, hit_signature_policy
from enginefoundry.planning.preflight import reference_summary
from enginefoundry.spec import BuildSpec
from enginefoundry.store import layout
from enginefoundry.store.backends import Store
from enginefoundry.store.publish import find_current


class UnitExplanation(BaseModel):
    unit: str
    key: str
    hit: bool
    nearest: str | None = None  # key of the nearest published unit of the same target
    differences: list[str] = []
    refused: str | None = None  # a published build that `run` would refuse as a hit, and why
    reference: str | None = None  # a miss: the reference its smoke stage will judge it against (preflight)


def _flatten(prefix: str, value: object) -> dict[str, str]:
    if isinstance(value, dict):
        out: dict[str, str] = {}
        for k, v in value.items():
            out.update(_flatten(f"{prefix}.{k}" if prefix else k, v))
        return out
    return {prefix: json.dumps(value, sort_keys=True)}


def diff_components(old: dict[str, Any], new: dict[str, Any]) -> list[str]:  # JSON edge: recorded key components
    a, b = _flatten("", old), _flatten("", new)
    return [f"{k}: {a.get(k, '(absent)')} → {b.get(k, '(absent)')}" for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)]


def published_manifests(store: Store, model: str) -> list[dict[str, Any]]:  # JSON edge: manifest.json
    """The current build's manifest of every unit key of the model, in either layout."""
    keys = {found[2] for prefix in layout.listing_folders(model, units_only=True) for name in store.list(prefix)
            if (found := layout.key_of_listing(name, model)) is not None}
    out = []
    for key in sorted(keys):
        try:
            build = find_current(store, model, key)
        except Exception:  # unreadable or tampered: not a unit to compare against
            continue
        if build is not None and build.manifest is not None:
            out.append(build.manifest.model_dump(mode="json"))
    return out


def explain(spec: BuildSpec, snapshot: SourceSnapshot, store: Store,
            only_targets: list[str] | None = None, draft: SourceSnapshot | None = None,
            adapters: dict[str, SourceSnapshot] | None = None) -> list[UnitExplanation]:
    """`draft`: the fetched `speculative.draft`, for a spec that has one (its digests are part of the keys);
    `adapters`: the fetched model.adapters by name (each adapter unit's key has its digest: a new revision of one
    adapter shows as a miss of that adapter's units alone, `adapter.weights_digest` differing)."""
    toolchain = toolchain_identity(spec, get_lane(spec.lane).versions())
    published = published_manifests(store, spec.model.name)
    source = SourceDigests.of(snapshot, draft, adapters)
    out = []
    for unit in expand_units(spec, only_targets):
        comps = unit_key_components(spec, unit, source, toolchain, spec.lane_options)
        key = key_of(comps)
        # The decision `run` makes (cache_plan.find_hit, the flow's publish.check_hit): a pointer it refuses is a miss.
        said: list[str] = []
        if find_hit(store, spec.model.name, key, progress=said.append, quarantine=False,
                    signatures=hit_signature_policy(spec)) is not None:
            out.append(UnitExplanation(unit=unit.name, key=key, hit=True))
            continue
        refused = said[0] if said else None
        same_target = [m for m in published if m.get("target", {}).get("name") == unit.target.name] or [
            m for m in published if m.get("target", {}).get("arch") == unit.target.arch.value]
        best = min(same_target, key=lambda m: len(diff_components(m["key_components"], comps)), default=None)
        out.append(UnitExplanation(
            unit=unit.name, key=key, hit=False, nearest=best["key"] if best else None,
            differences=diff_components(best["key_components"], comps) if best else
            ["no published unit of this model and target yet"], refused=refused,
            reference=reference_summary(spec, unit),
        ))
    return out
