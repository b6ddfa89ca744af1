"""LoRA adapters (`model.adapters`, issue 36): preflight from adapter_config.json alone, fetch like the base, and
merge into the base with PEFT (adapter_mode merge; in adapter_mode serve, the merge is each adapter's gate reference
and the unit serves the base and every adapter with PEFT: `served_source`, enginefoundry/smoke/serve.py).

Preflight reads one small file per adapter (`adapter_config.json`, bounded: a local file, that one file of a Hub repo
at its revision, or that one S3 object) and refuses, with the field and the fix, an adapter whose
`base_model_name_or_path` names another base, whose target modules the base's architecture lacks (the base built on
PyTorch's meta device from its config.json: no weights), whose rank exceeds `model.max_lora_rank` or the lane's, or
that cannot be merged into the base's precision (a base whose checkpoint is already quantized). No weights are read.

Merge: the base in float32 ⊕ the adapter (`PeftModel.from_pretrained(...).merge_and_unload()`), saved with the base's
tokenizer files into a cache folder named by the merged digest (written under a temporary name and renamed: a kill
leaves no folder a later run reuses). That folder is the adapter unit's source: the lane converts it like any
checkpoint, and the smoke gate's fp32 reference is computed from it (each adapter judged against its own reference).
Its weights digest is derived, not hashed: sha256 of the base's and the adapter's digests and MERGE_FORMAT, so a
unit's keys are known before anything is merged.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from enginefoundry.errors import InputError
from enginefoundry.identity import TOKENIZER_FILES, sha256_json
from enginefoundry.inputs.model_config import lookup, read_config
from enginefoundry.inputs.sources import SourceSnapshot, fetch, remove_stale_partials
from enginefoundry.schemas.loose import HfModelConfig
from enginefoundry.schemas.manifest import AdapterKey
from enginefoundry.settings import cache_root
from enginefoundry.spec import AdapterMode, AdapterSpec, BuildSpec, SourceKind

ADAPTER_CONFIG = "adapter_config.json"
MAX_ADAPTER_CONFIG_BYTES = 1 << 20  # PEFT's adapter_config.json is about 1 KiB
MERGE_FORMAT = 1  # bump when the merge recipe changes (dtype, library): merged checkpoints then get new keys
MAX_BASE_MODULES = 200_000  # a 405B model has under 3,000 linear layers
# Files of the base copied beside the merged weights (save_pretrained writes config.json and the weights).
_BASE_EXTRAS = (*sorted(TOKENIZER_FILES), "generation_config.json")


class AdapterConfig(BaseModel):
    """The fields of PEFT's adapter_config.json (peft LoraConfig) that preflight reads; the rest is ignored."""

    model_config = ConfigDict(extra="ignore")

    peft_type: str = Field(max_length=64)
    base_model_name_or_path: str | None = Field(default=None, max_length=1024)
    r: int = Field(default=8, ge=1, le=1 << 16)  # LoraConfig's default rank
    rank_pattern: dict[str, int] = Field(default_factory=dict, max_length=100_000)
    target_modules: list[str] | str | None = None

    @property
    def max_rank(self) -> int:
        return max([self.r, *self.rank_pattern.values()])


def adapter_field(spec: BuildSpec, name: str) -> str:
    """`model.adapters.<i>`: the spec field of the adapter of that name."""
    for i, a in enumerate(spec.model.adapters):
        if a.name == name:
            return f"model.adapters.{i}"
    return "model.adapters"


def read_adapter_config(spec: BuildSpec, adapter: AdapterSpec) -> tuple[AdapterConfig | None, str]:
    """(the adapter's adapter_config.json, where it was read) or (None, why not); reads that one file only."""
    src = adapter.parsed_source(spec.base_path)
    where = f"{src.uri}/{ADAPTER_CONFIG}"
    try:
        if src.kind is SourceKind.LOCAL:
            data = read_config(Path(src.location) / ADAPTER_CONFIG)
        elif src.kind is SourceKind.HF:
            from huggingface_hub import hf_hub_download

            data = read_config(Path(hf_hub_download(src.location, ADAPTER_CONFIG, revision=src.revision or "main")))
            where = f"{src.location}@{src.revision or 'main'} {ADAPTER_CONFIG}"
        else:
            data = _s3_config(src.location)
    except Exception as err:  # every hub or S3 failure (network, 404, gated, offline) becomes the reason
        return None, f"{where} could not be read ({type(err).__name__}); check the source, HF_ENDPOINT / HF_TOKEN " \
                     "or the S3 credentials"
    if data is None:
        return None, f"{where} is missing or not a JSON object of at most {MAX_ADAPTER_CONFIG_BYTES} bytes: point " \
                     "the source at a Hugging Face PEFT adapter folder (save_pretrained of a PeftModel)"
    try:
        return AdapterConfig.model_validate(data), where
    except ValidationError as err:
        first = err.errors()[0]
        return None, f"{where}: {'.'.join(str(p) for p in first['loc'])}: {first['msg']}; not a PEFT adapter config"


def _s3_config(location: str) -> HfModelConfig | None:
    from enginefoundry.store.s3 import s3_client

    bucket, _, prefix = location.partition("/")
    body = s3_client().get_object(Bucket=bucket, Key=f"{prefix.rstrip('/')}/{ADAPTER_CONFIG}",
                                  Range=f"bytes=0-{MAX_ADAPTER_CONFIG_BYTES}")["Body"]
    raw = body.read(MAX_ADAPTER_CONFIG_BYTES + 1)
    if len(raw) > MAX_ADAPTER_CONFIG_BYTES:
        return None
    data = json.loads(raw)
    return data if isinstance(data, dict) else None


def base_names(spec: BuildSpec) -> set[str]:
    """The names an adapter's base_model_name_or_path may give this spec's base: the Hub repo id (and its name),
    the source folder's or prefix's last part, model.name."""
    src = spec.model.parsed_source(spec.base_path)
    names = {spec.model.name, src.location.rstrip("/").rsplit("/", 1)[-1]}
    if src.kind is SourceKind.HF:
        names.add(src.location)
    return names


def names_base(given: str, names: set[str]) -> bool:
    """The adapter's base_model_name_or_path names the base: exactly, or as a path/repo id ending in one of the
    names (an adapter trained from a local copy records that copy's path)."""
    given = given.rstrip("/")
    return given in names or given.rsplit("/", 1)[-1] in names


def base_modules(config: HfModelConfig) -> set[str] | None:
    """The base's module names (`model.layers.0.self_attn.q_proj`, …), from its config.json alone: the model built
    on PyTorch's meta device (no memory, no weights). None when transformers cannot build that architecture."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        model_type = str(config["model_type"])
        cfg = AutoConfig.for_model(model_type, **{k: v for k, v in config.items() if k != "model_type"})
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)  # type: ignore[no-untyped-call]  # transformers 5.24
    except Exception:  # an architecture this transformers does not know: the fetched base's merge says
        return None
    names = set()
    for n, (name, _) in enumerate(model.named_modules()):
        if n > MAX_BASE_MODULES:
            break
        names.add(name)
    return names


def missing_targets(cfg: AdapterConfig, modules: set[str]) -> list[str]:
    """The adapter's target_modules (PEFT's matching: a name matches a module whose name ends in `.name`; a string
    is a regular expression matched in full) that no module of the base matches."""
    targets = cfg.target_modules
    if targets is None or targets == "all-linear":
        return []
    if isinstance(targets, str):
        try:
            pattern = re.compile(targets)
        except re.error:
            return [targets]
        return [] if any(pattern.fullmatch(m) for m in modules) else [targets]
    return [t for t in targets if not any(m == t or m.endswith("." + t) for m in modules)]


def adapter_problems(spec: BuildSpec, lane_name: str, lane_max_rank: int | None,
                     base_config: HfModelConfig | None = None) -> list[tuple[str, str]]:
    """Every refusal of model.adapters, from adapter_config.json alone (before any download of weights).
    `lane_max_rank`: the lane's own ceiling (None: the lane serves no adapters). `base_config`: the base's
    config.json when the caller has it (the fetched base); else looked up as `plan` does (no download)."""
    adapters = spec.model.adapters
    if not adapters:
        return []
    if lane_max_rank is None:
        return [("model.adapters", f"lane {lane_name} does not build LoRA adapters yet: use lane reference or "
                                   "trtllm, or remove model.adapters")]
    problems: list[tuple[str, str]] = []
    if spec.model.adapter_mode is AdapterMode.SERVE and spec.speculative is not None:
        problems.append(("model.adapter_mode", "serve (the base and every adapter per request, PEFT) does not combine "
                                               "with speculative decoding on the scoring server: remove speculative, "
                                               "or use adapter_mode: merge"))
    if spec.model.max_lora_rank > lane_max_rank:
        problems.append(("model.max_lora_rank", f"{spec.model.max_lora_rank} exceeds lane {lane_name}'s "
                                                f"max_lora_rank ({lane_max_rank}); lower it"))
    config = base_config if base_config is not None else lookup(spec).config
    if config is not None and config.get("quantization_config"):  # serve too: each adapter's reference is a merge
        problems.append(("model.adapter_mode", "the base checkpoint is already quantized (quantization_config in its "
                                               "config.json): a LoRA adapter cannot be merged into quantized "
                                               "weights (merge mode's unit, serve mode's per-adapter gate "
                                               "reference); use the unquantized base as model.source"))
    modules = base_modules(config) if config is not None else None
    names = base_names(spec)
    limit = min(spec.model.max_lora_rank, lane_max_rank)
    for i, adapter in enumerate(adapters):
        field = f"model.adapters.{i}"
        cfg, where = read_adapter_config(spec, adapter)
        if cfg is None:
            problems.append((f"{field}.source", where))
            continue
        if cfg.peft_type.upper() != "LORA":
            problems.append((f"{field}.source", f"{where}: peft_type {cfg.peft_type} is not LORA; only LoRA adapters "
                                                "are built"))
            continue
        given = cfg.base_model_name_or_path
        expected = {adapter.base_model} if adapter.base_model else names
        if not given or not names_base(given, expected):
            problems.append((field, f"adapter {adapter.name} was trained on base '{given or '(not recorded)'}', not "
                                    f"on this spec's base ({', '.join(sorted(expected))}); use an adapter trained on "
                                    f"{spec.model.source}, or set {field}.base_model to '{given}' if model.source is "
                                    "a copy of that base under another name"))
        if cfg.max_rank > limit:
            problems.append((field, f"adapter {adapter.name} has LoRA rank {cfg.max_rank} ({where}), above "
                                    f"model.max_lora_rank {limit}: raise model.max_lora_rank (lane {lane_name} allows "
                                    f"up to {lane_max_rank}) or use an adapter of rank ≤ {limit}"))
        missing = missing_targets(cfg, modules) if modules is not None else []
        if missing:
            problems.append((field, f"adapter {adapter.name} targets modules {missing} that the base's architecture "
                                    f"({config.get('model_type') if config else '?'}) does not have: it was trained "
                                    "on another architecture; use an adapter of this base"))
    return problems


def fetch_adapters(spec: BuildSpec, base: SourceSnapshot, lane_name: str, lane_max_rank: int | None,
                   progress: Callable[[str], None] = print) -> dict[str, SourceSnapshot]:
    """Every adapter fetched, pinned and digested like the base (its folder confined, its revision resolved to a
    commit), after the preflight against the fetched base's own config.json: InputError before any adapter
    weights are downloaded."""
    if not spec.model.adapters:
        return {}
    problems = adapter_problems(spec, lane_name, lane_max_rank, read_config(Path(base.local_dir) / "config.json"))
    if base.quantization is not None:  # serve too: each adapter's gate reference is the base with it merged
        # A ModelOpt export says so in hf_quant_config.json, which config.json's check above does not see.
        problems.append(("model.adapter_mode", f"the base checkpoint is pre-quantized ({base.quantization.label()}): "
                                               "a LoRA adapter cannot be merged into quantized weights; use the "
                                               "unquantized base as model.source"))
    if problems:
        raise InputError("; ".join(f"{f}: {m}" for f, m in problems))
    out = {}
    for i, adapter in enumerate(spec.model.adapters):
        snap = fetch(adapter.parsed_source(spec.base_path), progress=progress, marker=ADAPTER_CONFIG,
                     field=f"model.adapters.{i}.source")
        progress(f"fetch: adapter {adapter.name} {snap.uri} → {len(snap.files)} files, digest "
                 f"{snap.weights_digest[:12]}" + (f", commit {snap.revision}" if snap.revision else ""))
        out[adapter.name] = snap
    return out


def pinned_adapters(spec: BuildSpec, adapters: dict[str, SourceSnapshot]) -> BuildSpec:
    """The spec with each Hub adapter pinned to the commit fetched (a branch may move during the run)."""
    pinned = []
    for a in spec.model.adapters:
        snap = adapters.get(a.name)
        src = a.parsed_source(spec.base_path)
        if snap is not None and snap.kind is SourceKind.HF and snap.revision:
            a = a.model_copy(update={"source": f"hf://{src.location}@{snap.revision}"})
        pinned.append(a)
    return spec.model_copy(update={"model": spec.model.model_copy(update={"adapters": pinned})})


def merged_digest(base: SourceSnapshot, adapter: SourceSnapshot) -> str:
    """The merged checkpoint's weights digest, derived from what it is made of (known before the merge)."""
    return sha256_json({"base_weights_digest": base.weights_digest, "adapter_digest": adapter.weights_digest,
                        "merge": "peft merge_and_unload, float32", "merge_format": MERGE_FORMAT})


def adapter_lineage(name: str, adapter: SourceSnapshot) -> dict[str, Any]:  # JSON edge: recorded in manifests
    """What the manifest's source records of an adapter: name, source, revision, identity and digest."""
    return {"name": name, "uri": adapter.uri, "kind": adapter.kind.value, "revision": adapter.revision,
            "requested_revision": adapter.requested_revision, "identity": adapter.identity,
            "weights_digest": adapter.weights_digest}


def served_source(base: SourceSnapshot, adapters: dict[str, SourceSnapshot]) -> SourceSnapshot:
    """The source of a unit serving the base and every adapter (adapter_mode serve): the base itself, its identity
    recording every adapter's lineage (the manifest's, MLflow's and `lineage`'s record of the served set)."""
    identity = {**base.identity, "adapters": [adapter_lineage(n, a) for n, a in adapters.items()]}
    return base.model_copy(update={"identity": identity})


def merged_source(base: SourceSnapshot, name: str, adapter: SourceSnapshot,
                  progress: Callable[[str], None] = print) -> SourceSnapshot:
    """The base ⊕ the adapter as a checkpoint folder (merged once per digest, reused after), and its snapshot: the
    base's source identity with the adapter's lineage beside it, the derived weights digest, the base's tokenizer."""
    digest = merged_digest(base, adapter)
    dest = cache_root() / "merged" / digest[:16]
    if not (dest / ".complete").is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_partials(dest)
        tmp = dest.with_name(f"{dest.name}.partial-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        progress(f"merge: adapter {name} ({adapter.weights_digest[:12]}) into the base "
                 f"({base.weights_digest[:12]}) with PEFT merge_and_unload, in float32")
        _merge(Path(base.local_dir), Path(adapter.local_dir), tmp)
        (tmp / ".complete").touch()
        if (dest / ".complete").is_file():  # another run merged the same digest first: its folder may be in use
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            shutil.rmtree(dest, ignore_errors=True)  # a folder without .complete: never used by anyone
            tmp.rename(dest)
    identity = {**base.identity, "base_weights_digest": base.weights_digest,
                "adapter": adapter_lineage(name, adapter)}
    return SourceSnapshot(uri=base.uri, kind=base.kind, local_dir=str(dest), revision=base.revision,
                          requested_revision=base.requested_revision, identity=identity, weights_digest=digest,
                          tokenizer_digest=base.tokenizer_digest, files={})


def _merge(base_dir: Path, adapter_dir: Path, out: Path) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
        merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    except (OSError, ValueError, RuntimeError, KeyError) as err:
        raise InputError(f"model.adapters: merging {adapter_dir} into {base_dir} failed ({type(err).__name__}: "
                         f"{str(err)[:300]}); check that the adapter was trained on this base") from None
    merged.save_pretrained(out)
    for extra in _BASE_EXTRAS:
        if (base_dir / extra).is_file():
            shutil.copyfile(base_dir / extra, out / extra)


def unit_adapters(spec: BuildSpec, adapter: str | None) -> BuildSpec:
    """The spec with only the adapters a unit needs (cluster mode: what its worker fetches): in adapter_mode merge
    the unit's own (`adapter`, its Unit.adapter), in serve every adapter, none for a spec without adapters."""
    if not spec.model.merges_adapters:
        return spec
    kept = [a for a in spec.model.adapters if a.name == adapter]
    return spec.model_copy(update={"model": spec.model.model_copy(update={"adapters": kept})})


def keyed_adapter_digests(key: AdapterKey | None) -> dict[str, str]:
    """The adapter digests a unit's key was computed with, by name: its own adapter's (merge), every served one's
    (serve), none (no adapter)."""
    if key is None:
        return {}
    if key.served is not None:
        return dict(key.served)
    return {key.name: key.weights_digest} if key.name and key.weights_digest else {}


def changed_adapters(key: AdapterKey | None, fetched: dict[str, SourceSnapshot]) -> list[str]:
    """The adapters whose fetched digest is not the one in the unit's key (or that are missing on one side): an
    adapter folder or Hub revision that moved after the parent fetched it."""
    want = keyed_adapter_digests(key)
    got = {name: snap.weights_digest for name, snap in fetched.items()}
    return sorted(n for n in want.keys() | got.keys() if want.get(n) != got.get(n))
