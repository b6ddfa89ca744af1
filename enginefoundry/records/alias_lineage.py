"""One lineage per alias: `<stem>-candidate` and `<stem>-champion` of a registered model name exactly one unit
lineage, and a spec whose unit would take over another lineage's aliases is refused with the fix.

A unit's lineage is its identity apart from what a rollout may change: the registered model, the lane, the
target's identity, and the variant, profile, calibration and keyed lane options (a unit key's components without
the source digests and the toolchain, `build.units.unit_key_components`). A searched unit's variant and profile
are the search's to choose, so its lineage is the search's question instead (workload, SLO, objective,
precisions, its rank). Each registered version records its lineage (tags `enginefoundry.lineage` and
`enginefoundry.lineage_label`); a version registered before that is read from its manifest's key components.

So two specs that would share an alias (the shipped tiny-cpu and tiny-search once both took `cpu` of tiny-chat)
are found out at `validate`/`run`/`rollout` when the registry is reachable, at registration (the candidate alias
is not moved onto another lineage's stem) and at promotion (a champion of another lineage is never compared with
nor replaced). No Prefect here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from enginefoundry import tracking_tags as mltags
from enginefoundry.errors import SpecError
from enginefoundry.identity import sha256_json
from enginefoundry.inputs.units import SourceDigests, Unit, expand_units, target_identity, unit_key_components
from enginefoundry.schemas.manifest import KeyComponents
from enginefoundry.spec import BuildSpec

if TYPE_CHECKING:
    from mlflow.entities.model_registry import ModelVersion

# The parts of a unit key that a rollout keeps (build.units.unit_key_components): the rest (source digests,
# toolchain, format version) is what a rollout may change.
LINEAGE_COMPONENTS = ("lane", "variant", "profile", "target", "calibration", "lane_options")


class Lineage(BaseModel):
    """A unit lineage: its digest (compared) and a label a person reads (shown)."""

    digest: str
    label: str

    def tags(self) -> dict[str, str]:
        return {mltags.LINEAGE: self.digest, mltags.LINEAGE_LABEL: self.label}


def _digest(identity: Mapping[str, object]) -> str:
    """The digest of a lineage's identity (its canonical JSON)."""
    return sha256_json(dict(identity))[:24]


def unit_lineage(spec: BuildSpec, unit: Unit) -> Lineage:
    """The lineage of one unit of the spec."""
    label = f"spec {spec.name}: {unit.name} ({spec.lane} lane)"
    if unit.searched is not None and spec.search is not None:
        s = spec.search
        identity: dict[str, object] = {
            "lane": spec.lane, "target": target_identity(unit.target),
            "lane_options": dict(sorted(spec.lane_options.keyed().items())),
            "search": {"workload": s.workload.model_dump(mode="json", exclude={"lengths_file", "lengths"}),
                       "slo": s.slo.model_dump(mode="json"), "objective": s.objective.value,
                       "precisions": sorted(p.value for p in s.precisions), "rank": unit.searched.rank}}
        return Lineage(digest=_digest(identity),
                       label=f"spec {spec.name}: search rank {unit.searched.rank} on {unit.target.name} "
                             f"({spec.lane} lane)")
    blank = SourceDigests(weights="", tokenizer="", draft=("", ""),
                          adapters={a.name: "" for a in spec.model.adapters} or None)
    components = unit_key_components(spec, unit, blank, {}, spec.lane_options)
    return Lineage(digest=_digest(_lineage_identity(KeyComponents.of(components))), label=label)


def _lineage_identity(components: KeyComponents) -> dict[str, object]:
    """The lineage's part of a unit key: LINEAGE_COMPONENTS (as the key hashes them), and an adapter unit's adapter
    name (a new adapter revision is what a rollout changes; another adapter is another lineage). A unit without an
    adapter keeps the lineage it always had."""
    hashed = components.as_json()
    out: dict[str, object] = {k: hashed[k] for k in LINEAGE_COMPONENTS}
    adapter = components.adapter
    if adapter is not None:  # merge: the adapter's name; serve: the served set's names
        out["adapter"] = sorted(adapter.served) if adapter.served is not None else adapter.name
    return out


def manifest_lineage(key_components: KeyComponents | Mapping[str, object]) -> str | None:
    """The lineage digest of a published unit from its key components (a version registered before versions
    recorded it); None for a manifest that lacks them."""
    typed = key_components if isinstance(key_components, KeyComponents) else KeyComponents.of(key_components)
    if any(k not in typed.as_json() for k in LINEAGE_COMPONENTS):
        return None
    return _digest(_lineage_identity(typed))


def version_lineage(version: ModelVersion) -> str | None:
    """A registered version's lineage: its tag, else its manifest's key components (None: neither readable)."""
    recorded = version.tags.get(mltags.LINEAGE)
    if recorded:
        return str(recorded)
    from enginefoundry.records.lineage import read_manifest_uri
    from enginefoundry.records.promotion import manifest_uri_of

    try:
        return manifest_lineage(read_manifest_uri(manifest_uri_of(version)).key_components)
    except Exception:  # a version registered by hand, or a manifest gone: no lineage to tell
        return None


def version_label(version: ModelVersion) -> str:
    label = version.tags.get(mltags.LINEAGE_LABEL)
    return str(label) if label else f"version {version.version}, registered before lineages were recorded"


class AliasHolder(BaseModel):
    """Which version of which lineage holds a stem's aliases."""

    alias: str
    version: str
    lineage: str | None
    label: str


def stem_holder(by_alias: Callable[[str, str], ModelVersion | None], model: str, stem: str) -> AliasHolder | None:
    """The version behind `<stem>-champion`, else `<stem>-candidate` (`by_alias(model, alias)`: the version or
    None), with its lineage; None when neither is set."""
    from enginefoundry.records.promotion import candidate_alias, champion_alias

    for alias in (champion_alias(stem), candidate_alias(stem)):
        version = by_alias(model, alias)
        if version is not None:
            return AliasHolder(alias=alias, version=str(version.version), lineage=version_lineage(version),
                               label=version_label(version))
    return None


def other_lineage(holder: AliasHolder | None, mine: Lineage) -> bool:
    """The holder is of another lineage (a holder whose lineage cannot be told is not held against a spec)."""
    return holder is not None and holder.lineage is not None and holder.lineage != mine.digest


def conflict_message(spec: BuildSpec, model: str, stem: str, holder: AliasHolder, mine: Lineage) -> str:
    return (f"alias {holder.alias} of registered model {model} holds version {holder.version} of another unit "
            f"lineage ({holder.label}), not {mine.label}: give this spec a registered model of its own "
            f"(tracking.registered_model: {model}-{spec.name}) or another target name; if this spec replaces that "
            f"lineage, delete the aliases {stem}-champion and {stem}-candidate of {model} first")


def alias_problems(spec: BuildSpec, registry: Any, only_targets: list[str] | None = None) -> list[tuple[str, str]]:
    """(field, message) for each unit of the spec whose alias stem another lineage holds in the registry."""
    from enginefoundry.records.promotion import alias_stems

    model = spec.registered_model_name
    if not registry.aliases(model):
        return []
    stems = alias_stems(spec)
    field = "tracking.registered_model" if spec.tracking.registered_model else "model.name"
    problems = []
    for unit in expand_units(spec, only_targets):
        mine = unit_lineage(spec, unit)
        holder = stem_holder(registry.version_by_alias, model, stems[unit.name])
        if holder is not None and other_lineage(holder, mine):
            problems.append((field, f"unit {unit.name}: "
                                    + conflict_message(spec, model, stems[unit.name], holder, mine)))
    return problems


def registry_if_reachable(spec: BuildSpec) -> Any | None:
    """The spec's registry when one exists to ask: a SQLite file that is not there yet has no aliases (None, and
    none is created); a server is asked once, without the client's retries (its errors are the caller's to judge:
    this check is advisory, and registration and promotion check again with retries). With the retries, `validate`
    against a tracking server that is away waited ~15 s for an answer it then ignores."""
    from enginefoundry.records.promotion import Registry

    uri = spec.tracking.mlflow_uri
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        return None
    registry = Registry(uri)
    registry.client = registry.client.raw  # one attempt (MLflow's own HTTP retries are off: records.tracking)
    return registry


def refuse_alias_collisions(spec: BuildSpec, only_targets: list[str] | None = None) -> None:
    """SpecError naming the field and the fix when a unit's alias stem is another lineage's; nothing when the
    registry cannot be reached (registration and promotion check again, always)."""
    from mlflow.exceptions import MlflowException

    try:
        registry = registry_if_reachable(spec)
        problems = alias_problems(spec, registry, only_targets) if registry is not None else []
    except (MlflowException, OSError):  # unreachable tracking server: checked again where the registry is needed
        return
    if problems:
        raise SpecError(problems, spec.name)
