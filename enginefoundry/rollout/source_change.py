"""Rollout: has the source, or the toolchain, changed since the last published build of each target?

The check must be cheap, since a schedule runs it often and it usually finds nothing: for a Hugging Face
source it resolves the revision to a commit sha (one API call), for S3 it lists the objects' ETags, for a
local folder it hashes the files. That identity is compared with the source recorded on each target's
baseline: its `<target>-champion`, else the newest registered version built for it. Each LoRA adapter of the spec
(`model.adapters`, docs/adapters.md) is probed the same way and compared with the adapter lineage its units recorded:
in adapter_mode merge each adapter's units have their own baseline (`<target>-<adapter>-champion`, else the newest
version of that adapter's lineage), so a new revision of one adapter says "adapter <name>: <old> → <new>" and the
rebuild of the target misses that adapter's unit alone (the others are cache hits, their champions kept); in
adapter_mode serve the served set's unit records every adapter, and any of them changing is its change. The
toolchain identity (the spec's pinned TensorRT-LLM release and image digest, and the versions the lane reports:
transformers/torch on the reference lane, tensorrt_llm/ModelOpt and the probed surface on the TensorRT-LLM lanes) is
compared with the one the baseline's unit key recorded (`key_components.toolchain`): a toolchain bump rebuilds the
target too. No Prefect here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from enginefoundry import tracking_tags as mltags
from enginefoundry.bench.noise import SideBySide
from enginefoundry.identity import checkpoint_digests, sha256_json
from enginefoundry.inputs.adapters import ADAPTER_CONFIG
from enginefoundry.inputs.sources import CHECKPOINT_MARKER, probe
from enginefoundry.inputs.units import expand_units
from enginefoundry.records.alias_lineage import unit_lineage, version_lineage
from enginefoundry.records.lineage import read_manifest_uri
from enginefoundry.records.promotion import Decision, Registry, alias_head, champion_alias, manifest_uri_of
from enginefoundry.rollout.compare import ComparisonRow
from enginefoundry.rollout.toolchain_channel import channel_moved
from enginefoundry.schemas.manifest import SourcePart, ToolchainIdentity
from enginefoundry.spec import BuildSpec, SourceKind, SourceURI, Target

if TYPE_CHECKING:
    from mlflow.entities.model_registry import ModelVersion


class SourceState(BaseModel):
    """What the source is right now, as far as a cheap probe can tell."""

    uri: str
    kind: SourceKind
    revision: str | None = Field(default=None, description="hf: the commit sha the revision resolves to")
    objects: dict[str, str] | None = Field(default=None, description="s3: relative key → ETag")
    weights_digest: str | None = Field(default=None, description="local: digests of the folder")
    tokenizer_digest: str | None = None

    def describe(self) -> str:
        if self.revision:
            return f"{self.uri} @ {self.revision[:12]}"
        if self.objects is not None:
            return f"{self.uri} ({len(self.objects)} objects)"
        return f"{self.uri} (weights {str(self.weights_digest)[:12]})"

    def short(self) -> str:
        """Its identity in a few characters: a commit, the ETags' digest, or the weights digest."""
        return short_identity(self.revision, self.objects, self.weights_digest)


def short_identity(revision: str | None, objects: dict[str, str] | None, weights_digest: str | None) -> str:
    """A source's identity as a person compares it: hf the commit, s3 the digest of its objects' ETags, local the
    weights digest (12 characters each)."""
    if revision:
        return revision[:12]
    if objects is not None:
        return f"etags {sha256_json(objects)[:12]}"
    return f"weights {str(weights_digest)[:12]}"


class Baseline(BaseModel):
    """The last published build of a target that the new source is compared with."""

    target: str
    version: str
    alias: str | None  # `<target>-champion`, or None for the newest registered version
    manifest_uri: str
    source: SourcePart
    toolchain: ToolchainIdentity | None = Field(default=None, description="key_components.toolchain of its unit")



class AdapterChange(BaseModel):
    """One adapter whose source differs from what a baseline's unit was built with."""

    name: str
    old: str | None = Field(default=None, description="its recorded identity (None: the baseline lacked it)")
    new: str | None = Field(default=None, description="its identity now (None: the spec no longer has it)")
    detail: str = ""

    def reason(self) -> str:
        change = f"{self.old or 'absent'} → {self.new or 'removed'}"
        return f"adapter {self.name}: {change}" + (f" ({self.detail})" if self.detail else "")


class TargetChange(BaseModel):
    target: str
    changed: bool
    reason: str
    baseline_version: str | None = None
    toolchain_changed: bool = False
    adapters: list[AdapterChange] = Field(default_factory=list, description="the adapters that changed (issue 36)")


class ChangeReport(BaseModel):
    source: SourceState
    adapters: dict[str, SourceState] = Field(default_factory=dict, description="model.adapters by name, probed")
    targets: list[TargetChange]

    @property
    def changed(self) -> bool:
        return any(t.changed for t in self.targets)

    @property
    def changed_adapters(self) -> list[str]:
        """The adapters whose new source triggers a build, in the spec's order."""
        changed = {a.name for t in self.targets if t.changed for a in t.adapters}
        return [n for n in self.adapters if n in changed]

    def describe(self) -> str:
        """The base's identity, and each adapter's."""
        adapters = ", ".join(f"{n} {a.short()}" for n, a in self.adapters.items())
        return self.source.describe() + (f" + adapters {adapters}" if adapters else "")

    def trigger(self) -> str:
        """Why this rollout builds: each changed target's reason (MLflow's tag value limit)."""
        return "; ".join(f"{t.target}: {t.reason}" for t in self.targets if t.changed)[:5000]

    def rows(self) -> list[dict[str, str]]:
        return [{"target": t.target, "new": "yes" if t.changed else "no", "baseline": t.baseline_version or "-",
                 "toolchain": "bumped" if t.toolchain_changed else "same", "reason": t.reason}
                for t in self.targets]


def source_state(source: SourceURI, marker: str = CHECKPOINT_MARKER, field: str = "model.source") -> SourceState:
    """The source's identity without downloading weights (local folders are hashed in place). `marker`, `field`:
    as `probe` takes them (an adapter's)."""
    if source.kind is SourceKind.HF:
        return SourceState(uri=source.uri, kind=source.kind, revision=probe(source, marker=marker, field=field))
    if source.kind is SourceKind.S3:
        return SourceState(uri=source.uri, kind=source.kind, objects=_s3_etags(source, marker, field))
    folder = probe(source, marker=marker, field=field)
    weights, tokenizer, _ = checkpoint_digests(Path(folder))
    return SourceState(uri=source.uri, kind=source.kind, weights_digest=weights, tokenizer_digest=tokenizer)


def adapter_states(spec: BuildSpec) -> dict[str, SourceState]:
    """Each adapter of model.adapters probed like the base, by name in the spec's order (none: {})."""
    return {a.name: source_state(a.parsed_source(spec.base_path), ADAPTER_CONFIG, f"model.adapters.{i}.source")
            for i, a in enumerate(spec.model.adapters)}


def _s3_etags(source: SourceURI, marker: str = CHECKPOINT_MARKER, field: str = "model.source") -> dict[str, str]:
    # The same identity enginefoundry.inputs.sources._fetch_s3 records: relative key → VersionId or ETag.
    from enginefoundry.store.s3 import s3_client

    bucket, _, prefix = source.location.partition("/")
    out: dict[str, str] = {}
    for page in s3_client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for obj in page.get("Contents", []):
            out[obj["Key"][len(prefix) + 1:]] = obj.get("VersionId") or obj["ETag"].strip('"')
    probe(source, marker=marker, field=field)  # an empty or unreadable prefix: an input error, the usual message
    return out


def baseline_for(registry: Registry, model: str, target: Target, lineages: set[str] | None = None,
                 stem: str | None = None) -> Baseline | None:
    """The champion of the target (of `stem`, default the target's name), else its newest registered version; with
    `lineages` (the digests of the spec's units on it: alias_lineage), only a version of one of them: another
    spec's unit under the same alias is never this spec's baseline."""
    def ours(v: ModelVersion) -> bool:
        return lineages is None or version_lineage(v) in lineages | {None}

    alias: str | None = champion_alias(stem or target.name)
    champion = registry.version_by_alias(model, str(alias))
    version = champion if champion is not None and ours(champion) else None
    if version is None:
        alias = None
        version = next((v for v in registry.versions_with(model, mltags.TARGET, target.name) if ours(v)), None)
    if version is None:
        return None
    uri = manifest_uri_of(version)
    manifest = read_manifest_uri(uri)
    return Baseline(target=target.name, version=str(version.version), alias=alias, manifest_uri=uri,
                    source=manifest.source, toolchain=manifest.key_components.toolchain)


def differs(state: SourceState, recorded: SourcePart) -> str | None:
    """Why the source differs from what a baseline was built from, or None when it is the same."""
    if _place(recorded.uri) != _place(state.uri):
        return f"source changed from {recorded.uri} to {state.uri}"
    if state.kind is SourceKind.HF:
        old = recorded.revision
        return None if old == state.revision else f"new commit {str(state.revision)[:12]} (built from {str(old)[:12]})"
    if state.kind is SourceKind.S3:
        if _recorded_objects(recorded) == state.objects:
            return None
        changed = _changed_objects(recorded, state)
        return f"{len(changed)} object(s) changed: {', '.join(changed[:5])}"
    # A merged adapter unit's weights digest is derived from the base's and the adapter's: the base's is beside it.
    weights = (recorded.identity.base_weights_digest if recorded.identity is not None else None) \
        or recorded.weights_digest
    if (weights, recorded.tokenizer_digest) == (state.weights_digest, state.tokenizer_digest):
        return None
    return f"local files changed (weights {str(state.weights_digest)[:12]})"


def _recorded_objects(recorded: SourcePart) -> dict[str, str]:
    """An S3 source's objects (relative key → VersionId or ETag) as a unit recorded them; {} where it recorded none."""
    return (recorded.identity.objects if recorded.identity is not None else None) or {}


def _changed_objects(recorded: SourcePart, state: SourceState) -> list[str]:
    """The keys whose object differs between what a unit recorded and the prefix now (added and removed too)."""
    old, new = _recorded_objects(recorded), state.objects or {}
    return sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))


def _place(uri: str) -> str:
    """Where a source is: its URI, a Hub one without its revision (a build pins a branch to its commit; the commit
    is compared on its own)."""
    return uri.rsplit("@", 1)[0] if uri.startswith("hf://") else uri


def recorded_adapters(source: SourcePart) -> dict[str, SourcePart]:
    """The adapters a unit was built with, by name, as its manifest's source records them (adapter_lineage): a
    merged unit's one adapter, a served set's every adapter; none for a unit of the base alone."""
    identity = source.identity
    if identity is None:
        return {}
    parts = identity.adapters if identity.adapters is not None else [identity.adapter] if identity.adapter else []
    return {str(p.name): p for p in parts}


def adapter_differs(name: str, state: SourceState | None, recorded: SourcePart | None) -> AdapterChange | None:
    """How an adapter's source differs from what a unit recorded of it (None: the same). `state` None: the spec no
    longer has it; `recorded` None: the unit was built without it."""
    if state is None or recorded is None:
        if state is None and recorded is None:
            return None
        return AdapterChange(name=name, old=_recorded_short(recorded) if recorded else None,
                             new=state.short() if state else None,
                             detail="added to the served set" if recorded is None else "no longer in the spec")
    if _place(recorded.uri) != _place(state.uri):
        return AdapterChange(name=name, old=recorded.uri, new=state.uri, detail="another source")
    old, new = _recorded_short(recorded), state.short()
    if state.kind is SourceKind.S3:
        keys = _changed_objects(recorded, state)
        return AdapterChange(name=name, old=old, new=new, detail=f"{len(keys)} object(s) changed: "
                                                                 f"{', '.join(keys[:5])}") if keys else None
    same = recorded.revision == state.revision if state.kind is SourceKind.HF else \
        recorded.weights_digest == state.weights_digest
    return None if same else AdapterChange(name=name, old=old, new=new)


def _recorded_short(recorded: SourcePart) -> str:
    """short_identity of an adapter as a unit recorded it (adapter_lineage: revision, identity, weights digest)."""
    if recorded.kind == SourceKind.S3.value:
        return short_identity(None, _recorded_objects(recorded), None)
    return short_identity(recorded.revision, None, recorded.weights_digest)


def toolchain_differs(current: ToolchainIdentity | None, recorded: ToolchainIdentity | None) -> str | None:
    """Why the toolchain differs from the one a baseline was built with, or None. A baseline that recorded no
    toolchain (an older manifest) is not a bump."""
    if not recorded or not current:
        return None
    changed = [k for k in ("trtllm_version", "image_digest") if getattr(current, k) != getattr(recorded, k)]
    now, then = current.versions, recorded.versions or {}
    if now is not None:  # None: this host has no toolchain to ask (a CPU-only parent); the spec's fields decide
        changed += [k for k in sorted(set(now) | set(then)) if now.get(k) != then.get(k)]
    if not changed:
        return None

    def value(identity: ToolchainIdentity, k: str) -> str | None:
        if k in ("trtllm_version", "image_digest"):
            pinned: str | None = getattr(identity, k)
            return pinned
        return (identity.versions or {}).get(k)

    return "toolchain changed: " + ", ".join(f"{k} {value(recorded, k)} → {value(current, k)}" for k in changed)


class UnitsChange(BaseModel):
    """What is new for one group of a target's units against their baseline: the target's units, or in adapter_mode
    merge one adapter's (`adapter`)."""

    adapter: str | None = None
    changed: bool
    reasons: list[str]
    baseline: str | None = Field(default=None, description="'<alias> v<n>' or 'newest v<n>'; None: never built")
    baseline_version: str | None = None
    toolchain_changed: bool = False
    adapters: list[AdapterChange] = Field(default_factory=list)


def units_change(state: SourceState, adapters: dict[str, SourceState], base: Baseline | None,
                 toolchain: ToolchainIdentity | None = None, channel: str | None = None,
                 adapter: str | None = None) -> UnitsChange:
    """One group's change (pure): the base's source against the baseline's, each adapter the group is built with
    (`adapters`: merge mode its one adapter, serve mode every adapter) against the baseline's record of it, and
    the toolchain (with `channel`: the channel the spec follows, named when its move is the bump)."""
    if base is None:
        return UnitsChange(adapter=adapter, changed=True, reasons=[
            f"adapter {adapter}: never built: first build" if adapter else "never built: first build"])
    why = differs(state, base.source)
    recorded = recorded_adapters(base.source)
    changes = [c for n in [*adapters, *(n for n in recorded if n not in adapters)]
               if (c := adapter_differs(n, adapters.get(n), recorded.get(n))) is not None]
    bump = toolchain_differs(toolchain, base.toolchain)
    moved = channel_moved(channel, base.toolchain, toolchain) if bump and channel else None
    bump = f"{moved} ({bump})" if moved else bump
    reasons = [r for r in (why, *(c.reason() for c in changes), bump) if r]
    label = f"{base.alias} v{base.version}" if base.alias else f"newest v{base.version}"
    return UnitsChange(adapter=adapter, changed=bool(reasons), reasons=reasons or [f"same source as {label}"],
                       baseline=label, baseline_version=base.version, toolchain_changed=bump is not None,
                       adapters=changes)


def target_change(target: str, groups: list[UnitsChange]) -> TargetChange:
    """A target's row from its groups' changes: new when any group is; the reasons of the new ones (each said
    once), else every group's "same source as"."""
    changed = [g for g in groups if g.changed]
    reasons = [r for g in (changed or groups) for r in g.reasons]
    versions = [g.baseline_version for g in groups if g.baseline_version]
    return TargetChange(target=target, changed=bool(changed), reason="; ".join(dict.fromkeys(reasons)),
                        baseline_version=", ".join(versions) or None,
                        toolchain_changed=any(g.toolchain_changed for g in groups),
                        adapters=[a for g in changed for a in g.adapters])


def detect_change(spec: BuildSpec, registry: Registry, only_targets: list[str] | None = None,
                  toolchain: ToolchainIdentity | None = None) -> ChangeReport:
    """Per target of the spec: is there something new to build (the source, an adapter's source, or the toolchain
    when `toolchain`, this run's identity, is given)? A target never built is new. With `toolchain.channel`, `spec`
    is the one the channel was applied to (toolchain_channel.with_channel), and a bump of its fields says the
    channel moved. In adapter_mode merge, each adapter's units are judged against their own baseline."""
    state = source_state(spec.model.parsed_source(spec.base_path))
    adapters = adapter_states(spec)
    merge = spec.model.merges_adapters
    rows = []
    for target in spec.targets:
        if only_targets and target.name not in only_targets:
            continue
        groups: dict[str | None, set[str]] = {}  # adapter (merge mode) or None → the lineages of its units
        for u in expand_units(spec, [target.name]):
            groups.setdefault(u.adapter, set()).add(unit_lineage(spec, u).digest)
        judged = []
        for adapter, lineages in groups.items():
            stem = alias_head(target.name, adapter)  # a champion per adapter, as registration names it
            base = baseline_for(registry, spec.registered_model_name, target, lineages, stem)
            built_with = ({adapter: adapters[adapter]} if adapter else {}) if merge else adapters  # serve: all
            judged.append(units_change(state, built_with, base, toolchain, spec.toolchain.channel, adapter))
        rows.append(target_change(target.name, judged))
    return ChangeReport(source=state, adapters=adapters, targets=rows)


class RolloutReport(BaseModel):
    """What one rollout did: the change it saw, whether it built, and each alias stem's promotion decision (made
    whether or not it built: promotion.decide_promotions)."""

    spec: str
    change: ChangeReport
    built: bool
    build_ok: bool | None = None
    decisions: list[Decision] = Field(default_factory=list)
    comparison: list[ComparisonRow] = Field(default_factory=list, description="old vs new per target, for the "
                                                                               "targets this rollout rebuilt")
    side_by_side: list[SideBySide] = Field(default_factory=list, description="champion and candidate measured in "
                                                                             "this rollout, per stem")
    build_run_id: str | None = Field(default=None, description="the MLflow parent run of the build, when it built")
    duration_s: float = 0.0

    @property
    def promoted(self) -> list[Decision]:
        return [d for d in self.decisions if d.action == "promoted"]
