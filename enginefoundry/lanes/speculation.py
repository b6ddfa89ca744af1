"""What a lane makes of the spec's `speculative` section: TensorRT-LLM's `speculative_config` for a release, and the
refusals (field, why, the fix) that can be decided before any download.

Per release: which `decoding_type` and field names the release has is the registry's (trtllm_flags: an algorithm
whose class the release lacks is refused at `validate`/`plan`, one past the registry's evidence is rendered and
marked to be probed, and the worker's probe of the installed `*DecodingConfig` classes decides). Per model family
and implementation: the feature page's one-model / two-model tables (REF_SPEC_MODELS). Per checkpoint: MTP needs
MTP layers (`num_nextn_predict_layers` in config.json), and a draft must share the target's vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from enginefoundry.errors import InputError
from enginefoundry.inputs.model_config import hub_config, read_config
from enginefoundry.inputs.model_shape import read_model_config
from enginefoundry.inputs.sources import SourceSnapshot, fetch
from enginefoundry.inputs.toolchain import parse_version
from enginefoundry.lanes.trtllm_flags import ABSENT, CHECKED, LLM_API, REF_SPEC_MODELS, flag
from enginefoundry.schemas.loose import HfModelConfig, TrtllmConfig
from enginefoundry.spec import BuildSpec, SourceKind, SpecAlgorithm, SpeculativeSpec

FIELD = "speculative"
DRAFT_PLACEHOLDER = "<draft checkpoint>"
NEW_NAMES = "1.3"  # from here Eagle3 / speculative_model (the 1.3 examples); below, Eagle / speculative_model_dir

# decoding_type per algorithm, below and from NEW_NAMES.
DECODING_TYPE: dict[SpecAlgorithm, tuple[str, str]] = {
    SpecAlgorithm.DRAFT_TARGET: ("Draft_Target", "Draft_Target"),
    SpecAlgorithm.EAGLE3: ("Eagle", "Eagle3"),
    SpecAlgorithm.MTP: ("MTP", "MTP"),
    SpecAlgorithm.NGRAM: ("NGram", "NGram"),
}
# Target families (config.json model_type) the feature page lists for EAGLE 3 (REF_SPEC_MODELS): Llama 3.1 / 3.3
# (model_type llama) and Llama 4 Maverick (llama4). Draft/target and NGram: all models.
EAGLE3_FAMILIES = frozenset({"llama", "llama4"})
# One-model EAGLE 3: Llama 4 Maverick in the table, and Llama 3.1 8B in the 1.0.0 and 1.3 examples
# (eagle3_one_model=True with meta-llama/Llama-3.1-8B-Instruct).
EAGLE3_ONE_MODEL_FAMILIES = frozenset({"llama", "llama4"})
ALL_MODELS = "draft_target or ngram (all models, two-model)"


def new_names(version: str | None) -> bool:
    """Whether `version` writes Eagle3 / speculative_model (1.3 on; an unknown release: the newest form)."""
    return version is None or parse_version(version).release[:2] >= parse_version(NEW_NAMES).release[:2]


def decoding_type(algorithm: SpecAlgorithm, version: str | None) -> str:
    old, new = DECODING_TYPE[algorithm]
    return new if new_names(version) else old


def speculative_config(sp: SpeculativeSpec, version: str | None,
                       draft_dir: Path | str | None = None) -> TrtllmConfig:
    """`speculative_config` of the LLM API YAML for TensorRT-LLM `version` (None: the newest form). `draft_dir`:
    the fetched draft on the worker (for `plan`, a placeholder)."""
    cfg: TrtllmConfig = {"decoding_type": decoding_type(sp.algorithm, version)}
    a = sp.algorithm
    if a is SpecAlgorithm.MTP:
        cfg["num_nextn_predict_layers"] = sp.mtp_layers
    else:
        cfg["max_draft_len"] = sp.max_draft_len
    if a is SpecAlgorithm.NGRAM and sp.max_matching_ngram_size is not None:
        cfg["max_matching_ngram_size"] = sp.max_matching_ngram_size
    if a.needs_draft:
        cfg["speculative_model" if new_names(version) else "speculative_model_dir"] = \
            str(draft_dir) if draft_dir is not None else DRAFT_PLACEHOLDER
    if a is SpecAlgorithm.EAGLE3 and sp.one_model is not None:
        cfg["eagle3_one_model"] = sp.one_model
    return cfg


def release_problems(sp: SpeculativeSpec, version: str | None) -> list[tuple[str, str]]:
    """The algorithm's class or fields absent from release `version` by the registry's evidence."""
    if version is None:
        return []
    cfg = speculative_config(sp, version)
    dt = cfg["decoding_type"]
    entry = flag(LLM_API, f"speculative_config.decoding_type={dt}")
    if entry.status(version) == ABSENT:
        return [(f"{FIELD}.algorithm",
                 f"{sp.algorithm.value} (speculative_config.decoding_type {dt}) is not in TensorRT-LLM {version}: the "
                 f"first release whose sources show it is {entry.since} ({entry.refs[0].split(' (')[0]}); pin "
                 f"toolchain.trtllm_version {_pin(entry.since)}, or use {_others(sp.algorithm, version)}")]
    out = []
    for key in cfg:
        if key == "decoding_type":
            continue
        item = flag(LLM_API, f"speculative_config.{key}")
        if item.status(version) == ABSENT:
            out.append((f"{FIELD}.{_spec_field(key)}",
                        f"speculative_config.{key} is not in TensorRT-LLM {version} (from {item.since}): remove it "
                        f"or pin toolchain.trtllm_version {_pin(item.since)}"))
    return out


def _pin(since: str) -> str:
    """A release the fix may name: the newest the registry's evidence covers, when it is that new."""
    if parse_version(CHECKED).release >= parse_version(since).release:
        return f"{CHECKED} (or another release from {since} on)"
    return f"a release from {since} on"


def _spec_field(key: str) -> str:
    names = {"eagle3_one_model": "one_model", "speculative_model": "draft", "speculative_model_dir": "draft"}
    return names.get(key, key)


def _others(algorithm: SpecAlgorithm, version: str) -> str:
    ok = [a.value for a in SpecAlgorithm if a is not algorithm and
          flag(LLM_API, f"speculative_config.decoding_type={decoding_type(a, version)}").status(version) != ABSENT]
    return " / ".join(ok) if ok else "no speculation on this release"


def model_problems(sp: SpeculativeSpec, config: HfModelConfig | None, source: str = "the model's config.json",
                   ) -> list[tuple[str, str]]:
    """The target's family and MTP layers against the algorithm (nothing to say without its config.json)."""
    if config is None:
        return []
    a = sp.algorithm
    family = str(config.get("model_type") or "?")
    if a is SpecAlgorithm.MTP:
        layers = config.get("num_nextn_predict_layers")
        have = layers if isinstance(layers, int) and not isinstance(layers, bool) else 0
        if have < 1:
            return [(f"{FIELD}.algorithm",
                     f"mtp drafts with the model's own multi-token-prediction layers, and {source} has no "
                     f"num_nextn_predict_layers (model_type {family}): use {ALL_MODELS}, or eagle3 with a draft "
                     "trained for this model")]
        if sp.mtp_layers > have:
            return [(f"{FIELD}.num_nextn_predict_layers",
                     f"{sp.mtp_layers} MTP layers asked, {source} has num_nextn_predict_layers {have}: set "
                     f"speculative.num_nextn_predict_layers to at most {have}")]
    if a is SpecAlgorithm.EAGLE3:
        if family not in EAGLE3_FAMILIES:
            return [(f"{FIELD}.algorithm",
                     f"eagle3 is documented for {', '.join(sorted(EAGLE3_FAMILIES))} targets (Llama 3.1 8B, Llama 3.3 "
                     f"70B, Llama 4 Maverick; {REF_SPEC_MODELS}), not model_type {family}: use {ALL_MODELS}")]
        if sp.one_model and family not in EAGLE3_ONE_MODEL_FAMILIES:
            return [(f"{FIELD}.one_model", f"the one-model EAGLE 3 is documented for "
                     f"{', '.join(sorted(EAGLE3_ONE_MODEL_FAMILIES))} only: set speculative.one_model: false")]
    return []


def draft_config(spec: BuildSpec) -> tuple[HfModelConfig | None, str]:
    """The draft's config.json before any download (a local draft, or a Hub draft's cached copy) and where from."""
    sp = spec.speculative
    src = sp.parsed_draft(spec.base_path) if sp else None
    if src is None:
        return None, ""
    if src.kind is SourceKind.LOCAL:
        path = Path(src.location) / "config.json"
        return read_config(path), str(path)
    if src.kind is SourceKind.HF:
        found = hub_config(src.location, src.revision or "main", False, [])
        return found.config, found.source
    return None, ""


def vocab_size(config: HfModelConfig | None) -> int | None:
    """The vocabulary a config.json embeds (a multimodal config nests it under text_config)."""
    if not config:
        return None
    for c in (config, config.get("text_config")):
        if isinstance(c, dict) and isinstance(c.get("vocab_size"), int):
            return int(c["vocab_size"])
    return None


def draft_problems(spec: BuildSpec, target: HfModelConfig | None, draft: HfModelConfig | None,
                   draft_source: str = "the draft's config.json") -> list[tuple[str, str]]:
    """A draft whose vocabulary differs from the target's: its token ids would mean other tokens, so nothing it
    drafts is accepted (the feature page: "the draft and target models were trained with the same tokenizer")."""
    sp = spec.speculative
    if sp is None or not sp.algorithm.needs_draft:
        return []
    want, have = vocab_size(target), vocab_size(draft)
    if want is None or have is None or want == have:
        return []
    return [(f"{FIELD}.draft", f"{draft_source} has vocab_size {have}, the target {spec.model.name} has {want}: a "
                               "draft must share the target's tokenizer; use a draft of the same model family "
                               "and tokenizer")]


def tokenizer_problem(spec: BuildSpec, target_digest: str, draft_digest: str) -> str | None:
    """After both are fetched (before any GPU time): a draft_target draft ships its own tokenizer, which must be the
    target's byte for byte (an EAGLE 3 head ships none and uses the target's)."""
    sp = spec.speculative
    if sp is None or sp.algorithm is not SpecAlgorithm.DRAFT_TARGET or not draft_digest or not target_digest:
        return None
    if draft_digest == target_digest:
        return None
    return (f"speculative.draft: the draft's tokenizer files (digest {draft_digest[:12]}) differ from the target's "
            f"({target_digest[:12]}): a draft must share the target's tokenizer; use a draft trained with it")


def fetch_speculative_draft(spec: BuildSpec, target: SourceSnapshot,
                            progress: Callable[[str], None] = print) -> SourceSnapshot | None:
    """The spec's `speculative.draft`, fetched like the base (pinned to a commit, digested), or None when its
    speculation drafts with no checkpoint. Raises InputError when the draft cannot serve the fetched target
    (another vocabulary, or for draft_target other tokenizer files), before any GPU time."""
    sp = spec.speculative
    src = sp.parsed_draft(spec.base_path) if sp is not None else None
    if src is None:
        return None
    draft = fetch(src, progress=progress)
    progress(f"fetch: draft {draft.uri} → {len(draft.files)} files, weights {draft.weights_digest[:12]}, "
             f"tokenizer {draft.tokenizer_digest[:12]}" + (f", commit {draft.revision}" if draft.revision else ""))
    problems = [f"{f}: {m}" for f, m in draft_problems(spec, read_model_config(Path(target.local_dir)),
                                                      read_model_config(Path(draft.local_dir)),
                                                      f"the draft {draft.uri}'s config.json")]
    why = tokenizer_problem(spec, target.tokenizer_digest, draft.tokenizer_digest)
    if why:
        problems.append(why)
    if problems:
        raise InputError("; ".join(problems))
    return draft


def pinned_draft(spec: BuildSpec, draft: SourceSnapshot | None) -> BuildSpec:
    """The spec with a Hub draft pinned to the commit fetched (a branch may move before a worker fetches it)."""
    sp = spec.speculative
    if sp is None or draft is None or draft.kind is not SourceKind.HF or not draft.revision:
        return spec
    src = sp.parsed_draft(spec.base_path)
    assert src is not None
    pinned = sp.model_copy(update={"draft": f"hf://{src.location}@{draft.revision}"})
    return spec.model_copy(update={"speculative": pinned})


def spec_problems(spec: BuildSpec, version: str | None, target: HfModelConfig | None,
                  target_source: str = "the model's config.json") -> list[tuple[str, str]]:
    """Every refusal of the spec's `speculative` section on a TensorRT-LLM lane, before any download."""
    sp = spec.speculative
    if sp is None:
        return []
    draft, where = draft_config(spec)
    return (release_problems(sp, version) + model_problems(sp, target, target_source)
            + draft_problems(spec, target, draft, where or "the draft's config.json"))


__all__ = [
    "DECODING_TYPE", "DRAFT_PLACEHOLDER", "decoding_type", "draft_config", "draft_problems",
    "fetch_speculative_draft", "model_problems", "pinned_draft", "release_problems", "spec_problems",
    "speculative_config", "tokenizer_problem", "vocab_size",
]
