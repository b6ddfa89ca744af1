"""Rollout: has the source, or the toolchain, changed since the last published build of each target?

The check must be cheap, since a schedule runs it often and it usually finds nothing: for a Hugging Face
source it resolves the revision to a commit sha (one API call), for S3 it lists the objects' ETags, for a
local folder it hashes the files. That identity is compared with the source recorded on each target's
baseline: its `<target>-champion`, else the newest registered version built for it. The toolchain identity (the
spec's pinned TensorRT-LLM release and image digest, and the versions the lane reports: transformers/torch on the
reference lane, tensorrt_llm/ModelOpt and the probed surface on the TensorRT-LLM lanes) is compared with the one
the baseline's unit key recorded (`key_components.toolchain`): a toolchain bump rebuilds the target too. No
Prefect here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from enginefoundry import tracking_tags as mltags
from enginefoundry.bench.noise import SideBySide
from enginefoundry.identity import checkpoint_digests
from enginefoundry.inputs.sources import probe
from enginefoundry.inputs.units import expand_units
from enginefoundry.records.alias_lineage import unit_lineage, version_lineage
from enginefoundry.records.lineage import read_manifest_uri
from enginefoundry.records.promotion import Decision, Registry, champion_alias, manifest_uri_of
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


class Baseline(BaseModel):
    """The last published build of a target that the new source is compared with."""

    target: str
    version: str
    alias: str | None  # `<target>-champion`, or None for the newest registered version
    manifest_uri: str
    source: SourcePart
    toolchain: ToolchainIdentity | None = Field(default=None, description="key_components.toolchain of its unit")



class TargetChange(BaseModel):
    target: str
    changed: bool
    reason: str
    baseline_version: str | None = None
    toolchain_changed: bool = False


class ChangeReport(BaseModel):
    source: SourceState
    targets: list[TargetChange]

    @property
    def changed(self) -> bool:
        return any(t.changed for t in self.targets)

    def rows(self) -> list[dict[str, str]]:
        return [{"target": t.target, "new": "yes" if t.changed else "no", "baseline": t.baseline_version or "-",
                 "toolchain": "bumped" if t.toolchain_changed else "same", "reason": t.reason}
                for t in self.targets]


def source_state(source: SourceURI) -> SourceState:
    """The source's identity without downloading weights (local folders are hashed in place)."""
    if source.kind is SourceKind.HF:
        return SourceState(uri=source.uri, kind=source.kind, revision=probe(source))
    if source.kind is SourceKind.S3:
        return SourceState(uri=source.uri, kind=source.kind, objects=_s3_etags(source))
    folder = probe(source)
    weights, tokenizer, _ = checkpoint_digests(Path(folder))
    return SourceState(uri=source.uri, kind=source.kind, weights_digest=weights, tokenizer_digest=tokenizer)


def _s3_etags(source: SourceURI) -> dict[str, str]:
    # The same identity enginefoundry.inputs.sources._fetch_s3 records: relative key → VersionId or ETag.
    from enginefoundry.store.s3 import s3_client

    bucket, _, prefix = source.location.partition("/")
    out: dict[str, str] = {}
    for page in s3_client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for obj in page.get("Contents", []):
            out[obj["Key"][len(prefix) + 1:]] = obj.get("VersionId") or obj["ETag"].strip('"')
    probe(source)  # an empty or unreadable prefix is an input error with the usual message
    return out


def baseline_for(registry: Registry, model: str, target: Target, lineages: set[str] | None = None) -> Baseline | None:
    """The champion of the target, else its newest registered version; with `lineages` (the digests of the spec's
    units on it: alias_lineage), only a version of one of them: another spec's unit under the same alias is never
    this spec's baseline."""
    def ours(v: ModelVersion) -> bool:
        return lineages is None or version_lineage(v) in lineages | {None}

    champion = registry.version_by_alias(model, champion_alias(target.name))
    alias: str | None = champion_alias(target.name)
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
    if recorded.uri != state.uri:
        return f"source changed from {recorded.uri} to {state.uri}"
    if state.kind is SourceKind.HF:
        old = recorded.revision
        return None if old == state.revision else f"new commit {str(state.revision)[:12]} (built from {str(old)[:12]})"
    if state.kind is SourceKind.S3:
        old_objects = (recorded.identity.objects if recorded.identity is not None else None) or {}
        if old_objects == state.objects:
            return None
        changed = sorted(k for k in set(old_objects) | set(state.objects or {})
                         if old_objects.get(k) != (state.objects or {}).get(k))
        return f"{len(changed)} object(s) changed: {', '.join(changed[:5])}"
    if (recorded.weights_digest, recorded.tokenizer_digest) == (state.weights_digest, state.tokenizer_digest):
        return None
    return f"local files changed (weights {str(state.weights_digest)[:12]})"


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


def detect_change(spec: BuildSpec, registry: Registry, only_targets: list[str] | None = None,
                  toolchain: ToolchainIdentity | None = None) -> ChangeReport:
    """Per target of the spec: is there something new to build (the source, or the toolchain when `toolchain`,
    this run's identity, is given)? A target never built is new. With `toolchain.channel`, `spec` is the one the
    channel was applied to (toolchain_channel.with_channel), and a bump of its fields says the channel moved."""
    state = source_state(spec.model.parsed_source(spec.base_path))
    rows = []
    for target in spec.targets:
        if only_targets and target.name not in only_targets:
            continue
        lineages = {unit_lineage(spec, u).digest for u in expand_units(spec, [target.name])}
        base = baseline_for(registry, spec.registered_model_name, target, lineages)
        if base is None:
            rows.append(TargetChange(target=target.name, changed=True, reason="never built: first build"))
            continue
        why = differs(state, base.source)
        bump = toolchain_differs(toolchain, base.toolchain)
        moved = (channel_moved(spec.toolchain.channel, base.toolchain, toolchain)
                 if bump and spec.toolchain.channel else None)
        bump = f"{moved} ({bump})" if moved else bump
        label = f"{base.alias} v{base.version}" if base.alias else f"newest v{base.version}"
        reason = "; ".join(r for r in (why, bump) if r) or f"same source as {label}"
        rows.append(TargetChange(target=target.name, changed=bool(why or bump), baseline_version=base.version,
                                 reason=reason, toolchain_changed=bump is not None))
    return ChangeReport(source=state, targets=rows)


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
