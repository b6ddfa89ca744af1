"""A published unit in the MLflow registry, idempotently.

Registration is keyed by the unit's manifest URI (one registered-model version per published build): a
second call finds the version instead of adding one. A cache hit calls it too, so a unit published while
MLflow was unreachable (or whose version or alias was deleted) is registered and aliased by the next run
that finds it in the store. A hit restores a missing alias; it never moves an alias that points at another
existing version (a newer build may hold it).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from enginefoundry.manifest import Manifest
from enginefoundry.plan import Unit
from enginefoundry.tracking import Tracker, register_unit

MANIFEST_URI_TAG = "enginefoundry.manifest_uri"


class Registration(BaseModel):
    version: str
    created: bool  # False: the version existed already
    alias: str | None  # the alias that points at this version now (None: none asked or another holds it)
    alias_set: bool  # this call (re)pointed the alias


def candidate_alias_of(unit: Unit, manifest: Manifest) -> str | None:
    return f"{unit.target.name}-candidate" if manifest.status == "candidate" else None


def registration_tags(unit: Unit, manifest: Manifest, manifest_uri: str) -> dict[str, str]:
    return {
        "enginefoundry.key": manifest.key, "enginefoundry.target": unit.target.name,
        "enginefoundry.arch": unit.target.arch.value, "enginefoundry.lane": manifest.lane,
        "enginefoundry.status": manifest.status, MANIFEST_URI_TAG: manifest_uri,
        "enginefoundry.source_revision": manifest.source.get("revision") or "",
        "enginefoundry.source_uri": manifest.source.get("uri", ""),
        **{f"enginefoundry.version.{k}": v for k, v in manifest.versions.items()},
    }


def find_registered(client: Any, registered_model: str, manifest_uri: str) -> Any | None:
    """The newest version registered for this manifest URI. Tags are filtered here: tag names with dots
    need quoting that differs between MLflow stores (as promotion.Registry.versions_with does)."""
    from mlflow.exceptions import MlflowException

    try:
        found = client.search_model_versions(f"name = '{registered_model}'", max_results=10_000)
    except MlflowException:
        return None
    mine = [v for v in found if v.tags.get(MANIFEST_URI_TAG) == manifest_uri]
    return max(mine, key=lambda v: int(v.version)) if mine else None


def ensure_registered(
    tracker: Tracker, *, registered_model: str, unit: Unit, manifest: Manifest, manifest_uri: str, run_id: str,
    move_alias: bool,
) -> Registration:
    """Register the published unit unless a version of it exists; point its candidate alias at it when the
    unit passed its gates and the alias is missing (or always, with `move_alias`: a fresh build)."""
    from mlflow.exceptions import MlflowException

    client = tracker.client
    alias = candidate_alias_of(unit, manifest)
    existing = find_registered(client, registered_model, manifest_uri)
    if existing is None:
        version = register_unit(tracker, registered_model=registered_model, unit_name=unit.name, run_id=run_id,
                                artifact_uri=manifest_uri.rsplit("/", 1)[0],
                                tags=registration_tags(unit, manifest, manifest_uri), params=manifest.build_params,
                                alias=None)
        created = True
    else:
        version, created = str(existing.version), False
    if alias is None:
        return Registration(version=version, created=created, alias=None, alias_set=False)
    try:
        holder = str(client.get_model_version_by_alias(registered_model, alias).version)
    except MlflowException:
        holder = None
    if holder == version:
        return Registration(version=version, created=created, alias=alias, alias_set=False)
    if holder is not None and not (move_alias or created):
        return Registration(version=version, created=created, alias=None, alias_set=False)
    client.set_registered_model_alias(registered_model, alias, version)
    return Registration(version=version, created=created, alias=alias, alias_set=True)
