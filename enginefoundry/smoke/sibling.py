"""Sibling references in a run: which unit judges which (`sibling_refs`), the order that follows
(`reference_waves`: a sibling is built, served and gated before the units it judges), and the judged unit's
reference (`sibling_reference`): the sibling's served answers, or a refusal that says why there are none.

A sibling rejected by its own gate cannot judge others: its dependents are refused with its reason.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from enginefoundry.errors import ReferenceRefused
from enginefoundry.evidence.inputs import InputTrust
from enginefoundry.inputs.units import Unit
from enginefoundry.smoke.prompts import PromptCase
from enginefoundry.smoke.reference import (
    ReferenceAsk,
    ReferenceOutcome,
    ReferenceSet,
    ReferenceSettings,
    load_sibling_reference,
)
from enginefoundry.spec import BuildSpec
from enginefoundry.spec.siblings import named_sibling, sibling_variant
from enginefoundry.store.backends import Store
from enginefoundry.store.publish import find_current
from enginefoundry.store.unit_status import UnitStatus

FIX = "or set smoke.reference: source"


class SiblingRef(BaseModel):
    """The unit whose served answers judge another: its name, unit key and precision."""

    model_config = ConfigDict(frozen=True)

    unit: str
    key: str
    precision: str


def serves_as_sibling(spec: BuildSpec, unit: Unit) -> bool:
    """This unit's served answers judge lower-precision units of the spec (its smoke stage publishes them)."""
    sibling = named_sibling(spec)
    return sibling is not None and sibling.name == unit.variant.name


def sibling_refs(spec: BuildSpec, units: list[Unit], keys: dict[str, str]) -> dict[str, SiblingRef]:
    """Judged unit name → its sibling (same profile and target, the spec's reference_sibling variant)."""
    out = {}
    for unit in units:
        variant = sibling_variant(spec, unit.variant)
        if variant is None:
            continue
        name = Unit(variant=variant, profile=unit.profile, target=unit.target).name
        out[unit.name] = SiblingRef(unit=name, key=keys[name], precision=variant.precision.value)
    return out


def reference_waves(units: list[Unit], siblings: dict[str, SiblingRef]) -> list[list[Unit]]:
    """`units` in waves, spec order within each: a unit comes after the sibling that judges it."""
    def depth(name: str) -> int:
        return 0 if name not in siblings else 1 + depth(siblings[name].unit)

    waves: dict[int, list[Unit]] = {}
    for unit in units:
        waves.setdefault(depth(unit.name), []).append(unit)
    return [waves[d] for d in sorted(waves)]


def refusal_text(label: str, status: UnitStatus, reason: str) -> str:
    said = {UnitStatus.REJECTED: "was rejected by its own gate",
            UnitStatus.FAILED: "failed"}.get(status, f"is {status}")
    return (f"refused: its reference, {label}, {said} ({reason or 'no reason recorded'}); a sibling that did not "
            f"pass its own gate judges no other unit: fix the sibling, {FIX}")


def sibling_reference(
    ref: SiblingRef, spec: BuildSpec, cases: list[PromptCase], *, store: Store, model_dir: Path,
    cache_dir: Path | None = None, trust: InputTrust | None = None,
) -> tuple[ReferenceSet, ReferenceOutcome]:
    """The sibling's served answers on these prompts. Raises ReferenceRefused (one line, with the fix) when the
    sibling is not published, was rejected by its own gate, or never served these prompts, or (`trust`: a run that
    signs its build) when no answers of it that a trusted key signed are found."""
    label = f"sibling unit {ref.unit} (key {ref.key[:12]})"
    build = find_current(store, spec.model.name, ref.key)
    manifest = build.manifest if build is not None else None
    if manifest is None:
        raise ReferenceRefused(f"refused: its reference, {label}, is not published (it failed or was not built); "
                               f"fix the sibling's own failure first, {FIX}")
    if manifest.status != UnitStatus.CANDIDATE:
        raise ReferenceRefused(refusal_text(label, manifest.status, manifest.status_reason))
    found = load_sibling_reference(ref.unit, ref.key, ReferenceAsk(cases, spec.smoke.max_new_tokens),
                                   ReferenceSettings(store=store, cache_dir=cache_dir, trust=trust),
                                   dtype=ref.precision, model_dir=model_dir)
    if found is None and trust is not None and trust.refusals:
        raise ReferenceRefused(f"refused: its reference, {label}: {trust.refusals[-1]}; a signed build is judged only "
                               f"by answers a trusted key signed: rebuild the sibling with --force, {FIX}")
    if found is None:
        raise ReferenceRefused(f"refused: its reference, {label}, published no served answers for this prompt set "
                               f"and max_new_tokens {spec.smoke.max_new_tokens} (built before with other smoke "
                               f"settings, or before sibling references); rebuild it with --force, {FIX}")
    return found
