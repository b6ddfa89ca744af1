"""The unit matrix: variant × profile × target, and the cache keys of docs/architecture.md#units-and-cache-keys."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from enginefoundry.identity import sha256_json
from enginefoundry.inputs.quantized_source import SourceQuantization
from enginefoundry.schemas.manifest import KeyComponents as KeyComponents  # its home is schemas (issue 35)
from enginefoundry.spec import AdapterMode, BuildSpec, Profile, SearchedUnit, Target, Variant
from enginefoundry.spec.lane_options import LaneOptions

if TYPE_CHECKING:
    from enginefoundry.inputs.sources import SourceSnapshot

# Bump when the meaning of a key component or the artifact layout changes: old artifacts then miss.
# 2: the weights digest of an hf source covers only the files the build reads (duplicate formats such as
#    original/*.pth are no longer fetched or hashed; enginefoundry.inputs.sources.DEFAULT_IGNORE_PATTERNS).
FORMAT_VERSION = 2


class Unit(BaseModel):
    """One buildable unit: a variant of the checkpoint, a shape profile, a target architecture."""

    model_config = ConfigDict(frozen=True)

    variant: Variant
    profile: Profile
    target: Target
    # Set when the search proposed this unit (its prediction, or why it fell back); never part of a key.
    searched: SearchedUnit | None = None
    # model.adapters, adapter_mode merge: the adapter merged into the base of this unit (its name); None: the base
    # (in adapter_mode serve, the base serving every adapter: its key has them all, units.served_component).
    adapter: str | None = None

    @property
    def name(self) -> str:
        variant = self.variant.name + (f"+{self.adapter}" if self.adapter else "")
        return f"{variant}.{self.profile.name}.{self.target.name}"


def expand_units(spec: BuildSpec, only_targets: list[str] | None = None) -> list[Unit]:
    """Every unit the spec asks for, in a stable order; `only_targets` filters by target name."""
    if only_targets:
        known = {t.name for t in spec.targets}
        unknown = sorted(set(only_targets) - known)
        if unknown:
            from enginefoundry.errors import InputError

            raise InputError(f"targets {unknown} are not in the spec; known targets: {sorted(known)}")
    units = []
    for variant in spec.variants:
        for target in spec.targets:
            if variant.targets is not None and target.name not in variant.targets:
                continue
            if only_targets and target.name not in only_targets:
                continue
            for profile in spec.profiles:
                for adapter in merged_adapters(spec):
                    units.append(Unit(variant=variant, profile=profile, target=target, adapter=adapter))
    return _with_searched(spec, only_targets, units)


def merged_adapters(spec: BuildSpec) -> list[str | None]:
    """What each variant × profile × target is built for: the base alone (None), or in adapter_mode merge one unit
    per adapter (the base ⊕ that adapter), the base itself then not a unit of the spec."""
    if spec.model.merges_adapters:
        return [a.name for a in spec.model.adapters]
    return [None]


def _with_searched(spec: BuildSpec, only_targets: list[str] | None, units: list[Unit]) -> list[Unit]:
    """The units the search decided, after the hand-written ones. One the spec already names is the same unit
    (same key): it keeps its place and gains the search's prediction."""
    by_name = {t.name: t for t in spec.targets}
    index = {u.name: i for i, u in enumerate(units)}
    for s in spec.searched:
        if s.target not in by_name or (only_targets and s.target not in only_targets):
            continue
        for adapter in merged_adapters(spec):
            unit = Unit(variant=s.variant, profile=s.profile, target=by_name[s.target], searched=s, adapter=adapter)
            if unit.name in index:
                units[index[unit.name]] = unit
            else:
                index[unit.name] = len(units)
                units.append(unit)
    return units


def toolchain_identity(spec: BuildSpec,
                       lane_versions: dict[str, str]) -> dict[str, Any]:  # JSON edge: key components, hashed
    """The toolchain part of a key: pinned versions and image digest, plus what the lane reports."""
    return {
        "lane": spec.lane,
        "trtllm_version": spec.toolchain.trtllm_version,
        "image_digest": spec.toolchain.image_digest,
        "versions": dict(sorted(lane_versions.items())),
    }


def target_identity(target: Target) -> dict[str, Any]:  # JSON edge: the key's target components (hashed)
    """Architecture and SKU class; never the host name or GPU UUID (those are not build inputs)."""
    return {"arch": target.arch.value, "sku": sorted(s.lower() for s in target.sku), "gpu_count": target.gpu_count}


def checkpoint_key_components(
    spec: BuildSpec, variant: Variant, weights_digest: str, tokenizer_digest: str,
    toolchain: dict[str, Any],  # JSON edge: toolchain_identity's JSON
    source_quantization: SourceQuantization | None = None,
) -> dict[str, Any]:  # JSON edge: key components, hashed and recorded
    """`source_quantization`: a pre-quantized source's own quantization (build.quantized_source), recorded in the key
    (`explain` names it); an unquantized source's key is the one it always had."""
    calib = variant.calibration.model_dump(mode="json") if variant.calibration else None
    return {
        "format_version": FORMAT_VERSION,
        "kind": "checkpoint",
        "weights_digest": weights_digest,
        "tokenizer_digest": tokenizer_digest,
        "lane": spec.lane,
        "toolchain": toolchain,
        "variant": variant.key_json(),
        "calibration": calib,
        **_quantized(source_quantization),
    }


def _quantized(source_quantization: SourceQuantization | None,
               ) -> dict[str, Any]:  # JSON edge: the key's source_quantization part
    return {} if source_quantization is None else {"source_quantization": source_quantization.key_json()}


class SourceDigests(BaseModel):
    """What the fetched sources put in a unit's key, as one value: the model's weights and tokenizer digests, the
    speculative draft's (weights, tokenizer) digests where the spec has one (`draft`), each fetched adapter's
    digest by name (`adapters`), and a pre-quantized source's own quantization (`quantization`, as the checkpoint
    key has it). Never a URI or a path: a moved source with the same files is the same unit."""

    model_config = ConfigDict(frozen=True)

    weights: str
    tokenizer: str
    draft: tuple[str, str] | None = None
    adapters: dict[str, str] | None = None
    quantization: SourceQuantization | None = None

    @classmethod
    def of(cls, snapshot: SourceSnapshot, draft: SourceSnapshot | None = None,
           adapters: Mapping[str, SourceSnapshot] | None = None) -> SourceDigests:
        """The digests of the fetched model `snapshot`, its `speculative.draft` and its model.adapters by name."""
        return cls(weights=snapshot.weights_digest, tokenizer=snapshot.tokenizer_digest,
                   draft=(draft.weights_digest, draft.tokenizer_digest) if draft is not None else None,
                   adapters={name: a.weights_digest for name, a in (adapters or {}).items()},
                   quantization=snapshot.quantization)


def unit_key_components(
    spec: BuildSpec, unit: Unit, source: SourceDigests,
    toolchain: dict[str, Any],  # JSON edge: toolchain_identity's JSON
    lane_options: LaneOptions | dict[str, Any] | None = None,  # JSON edge: the options the spec set
) -> dict[str, Any]:  # JSON edge: key components, hashed and recorded
    """Everything that changes what a unit's build produces. No paths, clocks or credentials. A speculative unit
    adds its `speculative` section, with the draft's weights and tokenizer digests (`source.draft`) where it has
    a draft; a unit without one keeps the key it always had. A unit of an adapter adds its `adapter` (name, mode
    and the adapter's digest from `source.adapters`, name → digest of the fetched adapter folder). A pre-quantized
    source adds its own quantization (`source.quantization`, as the checkpoint key does)."""
    calib = unit.variant.calibration.model_dump(mode="json") if unit.variant.calibration else None
    extra: dict[str, Any] = {}  # JSON edge: the components only speculative units and adapter units have
    if spec.speculative is not None:
        extra["speculative"] = speculative_component(spec, source.draft)
    if unit.adapter is not None:
        extra["adapter"] = adapter_component(spec, unit.adapter, source.adapters)
    elif spec.model.serves_adapters:
        extra["adapter"] = served_component(spec, source.adapters)
    return {
        "format_version": FORMAT_VERSION,
        "kind": "unit",
        "weights_digest": source.weights,
        "tokenizer_digest": source.tokenizer,
        "lane": spec.lane,
        "toolchain": toolchain,
        "variant": unit.variant.key_json(),
        "profile": unit.profile.model_dump(mode="json"),
        "target": target_identity(unit.target),
        "calibration": calib,
        "lane_options": dict(sorted(_keyed(lane_options).items())),
        **extra,
        **_quantized(source.quantization),
    }


def speculative_component(spec: BuildSpec, draft_digests: tuple[str, str] | None,
                          ) -> dict[str, Any]:  # JSON edge: the key's speculative part
    """The spec's speculative section as a unit key hashes it: its fields and, with a draft, the draft's digests
    (never its URI or path: a moved draft with the same files is the same unit)."""
    assert spec.speculative is not None
    out = dict(spec.speculative.keyed())
    if spec.speculative.algorithm.needs_draft:
        if draft_digests is None:
            raise ValueError("a speculative unit with a draft needs the draft's digests for its key: fetch "
                             "speculative.draft first")
        out["draft_weights_digest"], out["draft_tokenizer_digest"] = draft_digests
    return out


def adapter_component(spec: BuildSpec, name: str, adapter_digests: dict[str, str] | None,
                      ) -> dict[str, Any]:  # JSON edge: the key's adapter part
    """The unit's adapter as its key hashes it: its name, the mode and the digest of its fetched folder (never its
    URI or path: a moved adapter with the same files is the same unit; a new revision is a new key)."""
    digest = (adapter_digests or {}).get(name)
    if digest is None:
        raise ValueError(f"a unit of adapter {name} needs the adapter's digest for its key: fetch model.adapters first")
    return {"name": name, "mode": spec.model.adapter_mode.value, "weights_digest": digest}


def served_component(spec: BuildSpec, adapter_digests: dict[str, str] | None,
                     ) -> dict[str, Any]:  # JSON edge: the key's adapter part, adapter_mode serve
    """A unit serving the base and every adapter (adapter_mode serve): the mode and each adapter's digest by name
    (a new revision of any one is a new key of the unit that serves it; `explain` names `adapter.served.<name>`)."""
    return {"mode": AdapterMode.SERVE.value,
            "served": {a.name: adapter_component(spec, a.name, adapter_digests)["weights_digest"]
                       for a in spec.model.adapters}}


def _keyed(lane_options: LaneOptions | dict[str, Any] | None) -> dict[str, Any]:  # JSON edge: options hashed
    """The options a unit key hashes: those the spec set, less the lane's `unkeyed` ones (how a build is judged,
    not what it is: the reference lane's smoke_server)."""
    if isinstance(lane_options, LaneOptions):
        return lane_options.keyed()
    return dict(lane_options or {})


def key_of(components: KeyComponents | Mapping[str, object]) -> str:
    """The key: the hash of the components' canonical JSON (typed or as recorded: the same key)."""
    return sha256_json(components.as_json() if isinstance(components, KeyComponents) else dict(components))
