"""A published unit in the MLflow registry, idempotently.

Registration is keyed by the unit's manifest URI (one registered-model version per published build): a
second call finds the version instead of adding one. A cache hit calls it too, so a unit published while
MLflow was unreachable (or whose version or alias was deleted) is registered and aliased by the next run
that finds it in the store. A hit restores a missing alias; it never moves an alias that points at another
existing version (a newer build may hold it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel

from enginefoundry import tracking_tags as mltags
from enginefoundry.inputs.units import Unit
from enginefoundry.records.alias_lineage import stem_holder, unit_lineage
from enginefoundry.records.lineage import adapter_tags
from enginefoundry.records.promotion import candidate_alias, unit_alias_stem
from enginefoundry.records.tracking import RetryingClient, Tracker, UnitVersion, register_unit
from enginefoundry.schemas.manifest import Manifest, ToolchainIdentity
from enginefoundry.spec import BuildSpec
from enginefoundry.store.unit_status import RegistryStatus, UnitStatus

if TYPE_CHECKING:
    from mlflow.entities.model_registry import ModelVersion

MANIFEST_URI_TAG = mltags.MANIFEST_URI


class Registration(BaseModel):
    version: str
    created: bool  # False: the version existed already
    alias: str | None  # the alias that points at this version now (None: none asked or another holds it)
    alias_set: bool  # this call (re)pointed the alias
    refused: str | None = None  # why the alias was not moved: another unit lineage holds its stem


def candidate_alias_of(spec: BuildSpec, unit: Unit, manifest: Manifest) -> str | None:
    """`<stem>-candidate` (promotion.alias_stems) for a unit that passed its gates, else None."""
    return candidate_alias(unit_alias_stem(spec, unit)) if manifest.status == UnitStatus.CANDIDATE else None


def version_tags(spec: BuildSpec, unit: Unit, manifest: Manifest, manifest_uri: str, run_url: str,
                 prefect: dict[str, str], manifest_sha256: str = "") -> dict[str, str]:
    """What an auditor asks first, on the model version itself, so `@<stem>-candidate` answers in one hop:
    source and revision, digests, toolchain, gate verdict, the headline throughput, links to the run, the
    manifest and its sha256 (which `verify`, `pull` and `rollback` hold the manifest to) and the Prefect flow run
    (`prefect`: the registering flow run's context, if any)."""
    from enginefoundry.bench.report import best_throughput

    best = best_throughput(manifest.benchmark.model_dump(mode="json"))
    agreement = manifest.smoke.figure("smoke_agreement")
    toolchain = manifest.key_components.toolchain
    tags = {
        mltags.KEY: manifest.key, mltags.TARGET: unit.target.name, mltags.ARCH: unit.target.arch.value,
        mltags.LANE: manifest.lane, mltags.STATUS: manifest.status, mltags.MANIFEST_URI: manifest_uri,
        mltags.MANIFEST_SHA256: manifest_sha256,
        mltags.ALIAS_STEM: unit_alias_stem(spec, unit),
        **unit_lineage(spec, unit).tags(),
        mltags.SOURCE_URI: manifest.source.uri,
        mltags.SOURCE_REVISION: manifest.source.revision or "",
        mltags.WEIGHTS_DIGEST: manifest.source.weights_digest,
        mltags.TOKENIZER_DIGEST: manifest.source.tokenizer_digest,
        **adapter_tags(manifest.source),
        mltags.TOOLCHAIN_IMAGE: _image(toolchain),
        mltags.GATE_VERDICT: manifest.status + (f": {manifest.status_reason}" if manifest.status_reason else
                                                 ": smoke and benchmark gates passed"),
        mltags.DEPLOYABLE: "true" if manifest.status == UnitStatus.CANDIDATE else "false",
        mltags.SMOKE_AGREEMENT: "" if agreement is None else f"{float(agreement):.4f}",
        mltags.PROMPTS_DIGEST: manifest.prompts_digest or "",
        mltags.BEST_OUTPUT_TPS: f"{best.output_tokens_per_s:.1f}" if best else "",
        mltags.BEST_AT: best.label() if best else "no benchmark point qualifies",
        mltags.RUN_URL: run_url,
        mltags.PREFECT_FLOW_RUN_ID: prefect.get(mltags.PREFECT_FLOW_RUN_ID) or manifest.prefect_flow_run_id or "",
        mltags.PREFECT_FLOW_RUN_URL: prefect.get(mltags.PREFECT_FLOW_RUN_URL, ""),
        **{mltags.version_tag(k): v for k, v in manifest.versions.items()},
    }
    return {k: v for k, v in tags.items() if v}


def registered_versions(client: RetryingClient, registered_model: str, manifest_uri: str) -> list[ModelVersion]:
    """The versions registered for this manifest URI, oldest first. Tags are filtered here: tag names with dots
    need quoting that differs between MLflow stores (as promotion.Registry.versions_with does)."""
    from mlflow.exceptions import MlflowException

    try:
        found = client.search_model_versions(f"name = '{registered_model}'", max_results=10_000)
    except MlflowException:
        return []
    return sorted((v for v in found if v.tags.get(MANIFEST_URI_TAG) == manifest_uri), key=lambda v: int(v.version))


def find_registered(client: RetryingClient, registered_model: str, manifest_uri: str) -> ModelVersion | None:
    """The newest version registered for this manifest URI."""
    mine = registered_versions(client, registered_model, manifest_uri)
    return mine[-1] if mine else None


def ensure_registered(
    tracker: Tracker, spec: BuildSpec, *, unit: Unit, manifest: Manifest, manifest_uri: str, run_id: str,
    tags: dict[str, str], move_alias: bool,
) -> Registration:
    """Register the published unit (with `tags`: `version_tags`) in the spec's registered model unless a version of
    it exists; point its candidate alias (`candidate_alias_of`: none when it did not pass its gates) at it when
    the alias is missing (or always, with `move_alias`: a fresh build)."""
    from mlflow.exceptions import MlflowException

    client = tracker.client
    registered_model, alias = spec.registered_model_name, candidate_alias_of(spec, unit, manifest)
    existing = find_registered(client, registered_model, manifest_uri)
    if existing is None:
        new = UnitVersion(unit_name=unit.name, run_id=run_id, artifact_uri=manifest_uri.rsplit("/", 1)[0],
                          tags={**tags, MANIFEST_URI_TAG: manifest_uri},
                          params=manifest.build_params.model_dump(mode="json"),
                          description=version_description(unit, manifest, manifest_uri))
        version = register_unit(tracker, new, registered_model=registered_model, alias=None)
        created = True
        first = next(iter(registered_versions(client, registered_model, manifest_uri)), None)
        if first is not None and int(first.version) < int(version):
            # Another run registered this manifest at the same moment: the first version stands, ours goes (version
            # numbers are handed out in commit order, so the later registrant always sees the earlier one here).
            client.delete_model_version(registered_model, version)
            version, created = str(first.version), False
    else:
        version, created = str(existing.version), False
        if tags.get(mltags.MANIFEST_SHA256) and not existing.tags.get(mltags.MANIFEST_SHA256):
            # Registered before digests were recorded: anchor it now, from a build the store's record checked.
            client.set_model_version_tag(registered_model, version, mltags.MANIFEST_SHA256,
                                         tags[mltags.MANIFEST_SHA256])
    if alias is None:
        return Registration(version=version, created=created, alias=None, alias_set=False)
    refused = _other_lineage_holds(client, registered_model, alias, tags)
    if refused:
        return Registration(version=version, created=created, alias=None, alias_set=False, refused=refused)
    holder = _alias_holder(client, registered_model, alias)
    if holder == version:
        return Registration(version=version, created=created, alias=alias, alias_set=False)
    if holder is not None and not (move_alias or created):
        return Registration(version=version, created=created, alias=None, alias_set=False)
    try:
        client.set_registered_model_alias(registered_model, alias, version)
    except MlflowException:
        # Another run of this spec set the alias between our read and our write (the store's upsert is a read then
        # an insert: two at once collide on the alias's unique row). Read it again and decide on what is there now.
        now = _alias_holder(client, registered_model, alias)
        if now == version:
            return Registration(version=version, created=created, alias=alias, alias_set=False)
        if now is not None and not (move_alias or created):
            return Registration(version=version, created=created, alias=None, alias_set=False)
        client.set_registered_model_alias(registered_model, alias, version)  # the row exists now: an update
        holder = now
    if holder is not None:
        _supersede(client, registered_model, holder)
    return Registration(version=version, created=created, alias=alias, alias_set=True)


def _alias_holder(client: RetryingClient, registered_model: str, alias: str) -> str | None:
    from mlflow.exceptions import MlflowException

    try:
        return str(client.get_model_version_by_alias(registered_model, alias).version)
    except MlflowException:
        return None


def version_description(unit: Unit, manifest: Manifest, manifest_uri: str) -> str:
    """What the MLflow UI shows first on a version. MLflow sets a version's own status (READY once registered) and
    has no API to set another, so a rejected unit says so here, in `enginefoundry.status`/`deployable` and by
    having no alias."""
    if manifest.status == UnitStatus.CANDIDATE:
        return f"{unit.name}: {manifest_uri}"
    return (f"REJECTED, not deployable: {manifest.status_reason or 'its gates failed'}. {unit.name}: "
            f"{manifest_uri}")[:5000]


def _supersede(client: RetryingClient, registered_model: str, number: str) -> None:
    """The version `<stem>-candidate` moved away from: a candidate never promoted says `superseded` now (version and
    run, as promotion moves them); a champion or previous champion keeps its word."""
    from mlflow.exceptions import MlflowException

    try:
        old = client.get_model_version(registered_model, number)
        if old.tags.get(mltags.STATUS) != UnitStatus.CANDIDATE:
            return
        client.set_model_version_tag(registered_model, number, mltags.STATUS, RegistryStatus.SUPERSEDED)
        if old.run_id:
            client.set_tag(old.run_id, mltags.STATUS, RegistryStatus.SUPERSEDED)
    except MlflowException:  # a version or run deleted since: nothing to say on it
        return


def _other_lineage_holds(client: RetryingClient, registered_model: str, alias: str, tags: dict[str, str]) -> str | None:
    """Why `alias` may not move to a version of this lineage (`tags`' enginefoundry.lineage): the stem's champion or
    candidate is of another unit lineage (alias_lineage). None: free, or the same lineage."""
    from mlflow.exceptions import MlflowException

    mine = tags.get(mltags.LINEAGE)
    if not mine:
        return None

    def by_alias(model: str, name: str) -> ModelVersion | None:
        try:
            found: ModelVersion = client.get_model_version_by_alias(model, name)
            return found
        except MlflowException:
            return None

    holder = stem_holder(by_alias, registered_model, alias.removesuffix("-candidate"))
    if holder is None or holder.lineage in (None, mine):
        return None
    return (f"{alias} not moved: {holder.alias} of {registered_model} is version {holder.version} of another unit "
            f"lineage ({holder.label}); give this spec its own tracking.registered_model")


def _image(toolchain: ToolchainIdentity | None) -> str:
    """`image@digest` of the toolchain a unit was built with, as far as its key recorded it."""
    return "@".join(x for x in (toolchain.image, toolchain.image_digest) if x) if toolchain else ""
