"""Reference answers: greedy answers of the Hugging Face reference, an artifact computed once and reused.

The answers depend only on the reference weights, its tokenizer, the prompts, the dtype and the generation
settings, so they are keyed by exactly those (ReferenceKey) and stored as one JSON document. Every unit,
target and later run of the same source finds them by key instead of loading the model again.

Storage sits behind one function, `load_or_compute_reference`: a local cache folder first, then the artifact
store (published with `create_if_absent`, so the first writer wins and published bytes never change), then
the computation itself: on the host CPU, or on the unit's GPUs (`device="gpu"`: the model sharded by
accelerate's device_map="auto", before the unit's server takes the GPUs).

A sibling reference (`smoke.reference: sibling`) is the same document with a `SiblingReferenceKey`: the greedy
answers a higher-precision sibling unit served on the same prompts and generation settings, published by the
sibling's smoke stage (`publish_sibling_reference`) and found by key by the units it judges
(`load_sibling_reference`), in this run, a later one or on another worker.
"""

from __future__ import annotations

import gc
import hashlib
import importlib.metadata
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from enginefoundry.errors import ToolError
from enginefoundry.evidence.inputs import InputTrust
from enginefoundry.gpu.precisions import SPREAD_DTYPE
from enginefoundry.identity import checkpoint_digests, sha256_json
from enginefoundry.inputs.dequantize import simulate_activations
from enginefoundry.settings import EnvSettings
from enginefoundry.smoke.prompts import PromptCase
from enginefoundry.store import layout
from enginefoundry.store.backends import Store
from enginefoundry.store.layout import blob_key
from enginefoundry.store.manifest import BuildInput, InputKind

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from enginefoundry.smoke.logprobs import LogprobSpread

REFERENCE_FORMAT = 2


class ReferenceAnswer(BaseModel):
    id: str
    text: str
    token_ids: list[int]  # generated tokens, special tokens left out
    # Aligned with token_ids: each token's text as a server reports it, and its log-prob under the
    # model's raw logits (what OpenAI-compatible servers return, before any sampling processors).
    token_texts: list[str] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)
    finish: str = "length"  # "stop": the model ended its answer (EOS) before max_new_tokens
    prompt_tokens: int | None = None  # the templated prompt's length in tokens


class ReferenceKey(BaseModel):
    """Everything the answers depend on; `digest` names the artifact."""

    weights_digest: str
    tokenizer_digest: str
    prompts_digest: str
    dtype: str
    max_new_tokens: int
    generator: str  # transformers and torch versions, greedy decoding
    format: int = REFERENCE_FORMAT
    device: str | None = None  # None: the host CPU; "gpu": CUDA kernels give other low bits than the CPU's

    @property
    def digest(self) -> str:
        return sha256_json(self.model_dump(exclude_none=True))  # a cpu key keeps the digest it had before `device`


class SiblingReferenceKey(BaseModel):
    """A sibling unit's served answers: the unit key says which build served them (weights, precision, target,
    profile, toolchain), the rest what it was asked."""

    kind: Literal["sibling"] = "sibling"
    sibling_key: str
    prompts_digest: str
    max_new_tokens: int
    format: int = REFERENCE_FORMAT

    @property
    def digest(self) -> str:
        return sha256_json(self.model_dump())


class ReferenceSet(BaseModel):
    key: ReferenceKey | SiblingReferenceKey
    answers: list[ReferenceAnswer]
    served_by: str | None = None  # a sibling reference: the name of the unit that served the answers

    @property
    def by_id(self) -> dict[str, ReferenceAnswer]:
        return {a.id: a for a in self.answers}


class ReferenceOutcome(BaseModel):
    """Which reference a verdict was judged against, and where its answers came from."""

    key: str
    source: str  # "computed", "local cache", "store"
    dtype: str
    model_dir: str
    store_url: str | None = None
    device: str = "cpu"
    sibling_unit: str | None = None  # judged against this sibling unit's served answers
    sibling_key: str | None = None
    simulated: str | None = None  # the answers of the quantization tool's simulated model (SimulatedModel.label)
    simulated_why: str | None = None  # why that model is this unit's reference (smoke/simulated.py)
    # What the reference stage consumed, each bound by digest (evidence/inputs.py): the answers, a simulated model
    inputs: list[BuildInput] = Field(default_factory=list)

    def label(self) -> str:
        where = f", {self.store_url}" if self.store_url else ""
        if self.sibling_unit:
            return (f"sibling unit {self.sibling_unit} (key {(self.sibling_key or '')[:12]}; {self.dtype} served "
                    f"answers {self.key[:12]}, {self.source}{where})")
        on = " on gpu" if self.device != "cpu" else ""
        of = self.simulated or self.model_dir
        return f"{self.dtype} reference {self.key[:12]} of {of}{on} ({self.source}{where})"


def prompts_digest(cases: list[PromptCase]) -> str:
    return sha256_json([c.model_dump(mode="json") for c in cases])


def generator_id() -> str:
    def v(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "absent"
    return f"transformers {v('transformers')}, torch {v('torch')}, greedy"


def reference_key(model_dir: Path, cases: list[PromptCase], *, dtype: str, max_new_tokens: int,
                  weights_digest: str | None = None, device: str = "cpu") -> ReferenceKey:
    """The key; pass `weights_digest` when the caller already has it (the pipeline's snapshot does)."""
    w, t, _ = checkpoint_digests(model_dir)
    return ReferenceKey(weights_digest=weights_digest or w, tokenizer_digest=t, prompts_digest=prompts_digest(cases),
                        dtype=dtype, max_new_tokens=max_new_tokens, generator=generator_id(),
                        device=None if device == "cpu" else device)


def sibling_reference_key(sibling_key: str, cases: list[PromptCase], *, max_new_tokens: int) -> SiblingReferenceKey:
    return SiblingReferenceKey(sibling_key=sibling_key, prompts_digest=prompts_digest(cases),
                               max_new_tokens=max_new_tokens)


def load_options(device: str) -> dict[str, str]:
    """from_pretrained's placement: the host CPU, or every visible GPU (accelerate shards the layers over them;
    transformers' device_map needs accelerate, a pin of the `reference` extra)."""
    return {"device_map": "auto"} if device == "gpu" else {}


def wide_options(wide: str) -> dict[str, str]:
    """from_pretrained's options for the spread's wider pass. A mixture-of-experts model (Qwen3-MoE, Mixtral, …)
    runs its experts with torch's grouped_mm by default in transformers 5, which has no float64 kernel ("Expected
    mat_a to be Float32, BFloat16 or Float16 matrix, got Double", transformers/integrations/moe.py `_grouped_mm`):
    the float64 pass asks for the eager experts loop, the same arithmetic one expert at a time. A dense model has
    no experts and ignores it."""
    return {"experts_implementation": "eager"} if wide == "float64" else {}


def resolve_device(device: str) -> str:
    """"auto": a GPU where torch sees one (the reference of 80 prompts on a 135M model: minutes on a shared
    CPU, seconds on a GPU), else the host CPU."""
    if device != "auto":
        return device
    try:
        import torch
    except ImportError:
        return "cpu"
    return "gpu" if torch.cuda.is_available() else "cpu"


def reference_answers(
    model_dir: Path, cases: list[PromptCase], *, dtype: str, max_new_tokens: int, device: str = "cpu",
    progress: Callable[[str], None] | None = None,
) -> list[ReferenceAnswer]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}.get(dtype, torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype, **load_options(device))
    model.eval()  # type: ignore[no-untyped-call]  # transformers 5.24.0: PreTrainedModel.eval is unannotated
    simulate_activations(model, model_dir)  # a dequantized FP8/NVFP4 export: its inputs quantized as the engine's
    try:
        return _generate(model, tok, cases, max_new_tokens, progress or (lambda _: None))
    finally:
        del model
        _release(device)


def _release(device: str) -> None:
    """After a reference model is dropped: on GPUs, give back the memory torch still reserves (the unit's server
    takes these GPUs next, or holds them already)."""
    if device == "gpu":
        import torch

        gc.collect()
        torch.cuda.empty_cache()


def _generate(model: Any, tok: Any, cases: list[PromptCase], max_new_tokens: int,
              progress: Callable[[str], None]) -> list[ReferenceAnswer]:
    import torch

    t0 = last = time.monotonic()

    special = set(tok.all_special_ids)
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    out = []
    with torch.no_grad():
        for case in cases:
            ids = tok.apply_chat_template(case.chat(), add_generation_prompt=True, return_tensors="pt",
                                          return_dict=True).to(model.device)
            gen = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tok.pad_token_id, output_logits=True, return_dict_in_generate=True)
            new = gen.sequences[0, ids["input_ids"].shape[1]:].tolist()
            steps = [(t, torch.log_softmax(gen.logits[i][0].float(), dim=-1)[t].item()) for i, t in enumerate(new)]
            kept = [(t, lp) for t, lp in steps if t not in special]
            stopped = len(new) < max_new_tokens or (bool(new) and new[-1] in eos_ids)
            out.append(ReferenceAnswer(
                id=case.id, text=tok.decode(new, skip_special_tokens=True).strip(),
                token_ids=[t for t, _ in kept], token_texts=[tok.decode([t]) for t, _ in kept],
                token_logprobs=[round(lp, 6) for _, lp in kept], finish="stop" if stopped else "length",
                prompt_tokens=int(ids["input_ids"].shape[1]),
            ))
            now = time.monotonic()
            if now - last >= 10 or len(out) == len(cases):  # a line every 10 s at most, with the time left
                last = now
                left = (now - t0) / len(out) * (len(cases) - len(out))
                progress(f"smoke: reference {len(out)}/{len(cases)} answers ({now - t0:.0f} s, about {left:.0f} s "
                         "left)")
    return out


def default_cache_dir() -> Path:
    return Path(EnvSettings.read().reference_cache or Path.home() / ".cache" / "enginefoundry" / "references")


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def store_key(key: ReferenceKey | SiblingReferenceKey) -> str:
    return layout.reference_answers_key(key.digest)


# How many times this process computed reference answers (tests assert reuse through it, not through timing).
COMPUTE_COUNT = {"n": 0}


def _candidates(cache: Path, store: Store | None, skey: str, signed: Iterable[str]) -> Iterator[tuple[str, bytes]]:
    """Where a cached document may be, in order: the local cache, the store's document, and the store's signed
    copies (blobs named by the digests a trusted key signed)."""
    if cache.is_file():
        yield "local cache", cache.read_bytes()
    if store is not None and store.exists(skey):
        yield "store", store.read_bytes(skey)
    for digest in signed:
        if store is not None and store.exists(blob_key(digest)):
            yield "store", store.read_bytes(blob_key(digest))


def _lookup(key: ReferenceKey | SiblingReferenceKey, cache: Path, store: Store | None,
            trust: InputTrust | None = None) -> tuple[ReferenceSet, str] | None:
    """The document of `key` from the local cache (re-published to the store if it lacks it), else the store.
    With `trust` that requires proof (a run that signs its build: evidence/inputs.py), only a document whose sha256
    a trusted key signed is used, wherever it is found (the local cache, the store's document, the signed copy in the
    store's blobs); None when there is none. Each document used is recorded in `trust`."""
    skey = store_key(key)
    kind = _kind(key)
    signed = trust.proven(store, kind, key.digest) if trust is not None and trust.required and store is not None else {}
    for source, data in _candidates(cache, store, skey, signed):
        try:
            ref = ReferenceSet.model_validate_json(data)
        except ValueError:
            if source == "local cache":
                cache.unlink(missing_ok=True)  # a damaged cache entry is recomputed, never trusted
            continue
        if ref.key != key:
            continue
        digest = hashlib.sha256(data).hexdigest()
        proven_by = signed.get(digest, "")
        if trust is not None and trust.required and not proven_by:
            trust.refuse(f"smoke: {kind} answers {key.digest[:12]} from the {source}",
                         f"sha256 {digest[:12]}… is not signed by a trusted key, and this run signs its build")
            continue
        if source == "local cache" and store is not None:
            store.create_if_absent(skey, data)
        elif source == "store":
            _write_atomic(cache, data)
        if trust is not None:
            trust.record(BuildInput(kind=kind, key=key.digest, uri=store.url(skey) if store is not None else "",
                                    sha256=digest, origin="local cache" if source == "local cache" else "store",
                                    proven_by=proven_by))
        return ref, source
    return None


def _kind(key: ReferenceKey | SiblingReferenceKey) -> InputKind:
    return "sibling-reference" if isinstance(key, SiblingReferenceKey) else "reference"


def _publish(ref: ReferenceSet, cache: Path, store: Store | None, trust: InputTrust | None = None) -> ReferenceSet:
    """Cache and publish; when someone published the same key first, theirs is the artifact. A run that signs its
    build (`trust`) keeps what it computed instead, stores it under its digest and signs that digest."""
    data = json.dumps(ref.model_dump(mode="json"), sort_keys=True).encode()
    _write_atomic(cache, data)
    skey = store_key(ref.key)
    digest = hashlib.sha256(data).hexdigest()
    origin: Literal["computed", "store"] = "computed"
    if trust is not None and trust.required and store is not None:
        store.create_if_absent(blob_key(digest), data)
        trust.attest(store, _kind(ref.key), ref.key.digest, digest, store.url(skey))
        store.create_if_absent(skey, data)
    elif store is not None and not store.create_if_absent(skey, data):
        data = store.read_bytes(skey)
        ref = ReferenceSet.model_validate_json(data)
        _write_atomic(cache, data)
        digest, origin = hashlib.sha256(data).hexdigest(), "store"
    if trust is not None:
        trust.record(BuildInput(kind=_kind(ref.key), key=ref.key.digest,
                                uri=store.url(skey) if store is not None else "", sha256=digest, origin=origin))
    return ref


@dataclass(frozen=True)
class ReferenceAsk:
    """What reference answers are asked for besides the model and its dtype (part of their key): the prompts, how
    many tokens each answer may have, the device that computes them (resolve_device: "cpu", "gpu", "auto"), and
    whether a dequantized FP8 or NVFP4 checkpoint quantizes its inputs as the unit's engine does (False: the unit's
    server computes the dequantized weights, Lane.quantizes_activations; keyed by the dequantized folder)."""

    cases: list[PromptCase]
    max_new_tokens: int
    device: str = "cpu"
    quantized_inputs: bool = True


@dataclass(frozen=True)
class ReferenceSettings:
    """Where reference answers are kept and which may be used (not part of their key): the store they are read from
    and published to (None: the local cache alone), the local cache folder (None: default_cache_dir()), the trust
    (evidence/inputs.py: a run that signs its build uses only answers a trusted key signed, else computes them
    again; what was used is recorded in it), and where progress lines go."""

    store: Store | None = None
    cache_dir: Path | None = None
    trust: InputTrust | None = None
    progress: Callable[[str], None] = print


def load_or_compute_reference(
    model_dir: Path, ask: ReferenceAsk, settings: ReferenceSettings, *, dtype: str,
    weights_digest: str | None = None, compute: Callable[..., list[ReferenceAnswer]] = reference_answers,
) -> tuple[ReferenceSet, ReferenceOutcome]:
    """The reference answers for this key: from the local cache, else the store, else computed and published.

    The one place that knows where reference answers live (the store layout may change under it).
    """
    cases, max_new_tokens, device = ask.cases, ask.max_new_tokens, resolve_device(ask.device)
    store, trust, progress = settings.store, settings.trust, settings.progress
    key = reference_key(model_dir, cases, dtype=dtype, max_new_tokens=max_new_tokens, weights_digest=weights_digest,
                        device=device)
    digest = key.digest
    cache = (settings.cache_dir or default_cache_dir()) / f"{digest}.json"
    url = store.url(store_key(key)) if store is not None else None

    def outcome(source: str) -> ReferenceOutcome:
        return ReferenceOutcome(key=digest, source=source, dtype=dtype, model_dir=str(model_dir), store_url=url,
                                device=device)

    found = _lookup(key, cache, store, trust)
    if found is not None:
        ref, source = found
        progress(f"smoke: reference answers {digest[:12]} from the {source}" + (f" ({url})" if source == "store"
                                                                                 else ""))
        return ref, outcome(source)
    progress(f"smoke: computing {len(cases)} reference answers ({dtype} on {device}) with {model_dir}")
    COMPUTE_COUNT["n"] += 1
    answers = compute(model_dir, cases, dtype=dtype, max_new_tokens=max_new_tokens, progress=progress,
                      **({"device": device} if device != "cpu" else {}))
    return _publish(ReferenceSet(key=key, answers=answers), cache, store, trust), outcome("computed")


def publish_sibling_reference(
    answers: list[ReferenceAnswer], *, unit: str, unit_key: str, cases: list[PromptCase], max_new_tokens: int,
    store: Store | None, cache_dir: Path | None = None, trust: InputTrust | None = None,
) -> ReferenceSet:
    """A unit's served answers as the reference of the lower-precision units it judges (its smoke stage calls
    this). The first publication of a key stays: a --force rebuild of the sibling keeps the answers units were
    already judged against."""
    key = sibling_reference_key(unit_key, cases, max_new_tokens=max_new_tokens)
    ref = ReferenceSet(key=key, answers=answers, served_by=unit)
    return _publish(ref, (cache_dir or default_cache_dir()) / f"{key.digest}.json", store, trust)


def load_sibling_reference(
    sibling_unit: str, sibling_key: str, ask: ReferenceAsk, settings: ReferenceSettings, *, dtype: str,
    model_dir: Path,
) -> tuple[ReferenceSet, ReferenceOutcome] | None:
    """The served answers of the sibling unit of key `sibling_key` on the prompts asked (served where the sibling
    was: `ask.device` plays no part), None when never published (or, with a `settings.trust` that requires proof,
    when none a trusted key signed: `trust.refusals` says so)."""
    store = settings.store
    key = sibling_reference_key(sibling_key, ask.cases, max_new_tokens=ask.max_new_tokens)
    found = _lookup(key, (settings.cache_dir or default_cache_dir()) / f"{key.digest}.json", store, settings.trust)
    if found is None:
        return None
    ref, source = found
    return ref, ReferenceOutcome(key=key.digest, source=source, dtype=dtype, model_dir=str(model_dir),
                                 store_url=store.url(store_key(key)) if store is not None else None,
                                 sibling_unit=sibling_unit, sibling_key=sibling_key)


# --- the spread between two healthy computations at the reference's precision (smoke/logprobs.LogprobSpread) ---

SPREAD_DTYPES = tuple(SPREAD_DTYPE)  # a reference transformers computes: the spread is measurable


def spread_store_key(key: ReferenceKey) -> str:
    return layout.reference_spread_key(key.digest)




PROGRESS_EVERY_S = 10.0  # a long pass says how far it got at most this often


def teacher_forced(model: PreTrainedModel, tok: PreTrainedTokenizerBase, cases: list[PromptCase],
                   answers: list[ReferenceAnswer], *,
                   progress: Callable[[str], None] | None = None,
                   what: str = "the spread's second computation") -> list[tuple[list[float], list[bool]]]:
    """Each answer's tokens scored in one forward pass over the templated prompt + the answer: the log-prob of
    each answer token and whether it is the model's argmax. `progress`: a line at most every 10 s."""
    import torch
    from transformers import BatchEncoding

    out: list[tuple[list[float], list[bool]]] = []
    t0 = last = time.monotonic()
    with torch.no_grad():
        for i, (case, ans) in enumerate(zip(cases, answers, strict=True)):
            now = time.monotonic()
            if progress is not None and i and now - last >= PROGRESS_EVERY_S:
                last = now
                left = (now - t0) / i * (len(cases) - i)
                progress(f"smoke: {what}: {i}/{len(cases)} answers scored ({now - t0:.0f} s, about {left:.0f} s "
                         "left)")
            enc = tok.apply_chat_template(case.chat(), add_generation_prompt=True, return_dict=True)
            assert isinstance(enc, BatchEncoding)  # return_dict=True
            prompt = enc["input_ids"]
            if not ans.token_ids:
                out.append(([], []))
                continue
            ids = torch.tensor([list(prompt) + ans.token_ids], device=model.device)
            rows = torch.log_softmax(model(ids).logits[0].double(), dim=-1)[len(prompt) - 1:-1]
            t = torch.tensor(ans.token_ids, device=rows.device)
            out.append((rows.gather(1, t[:, None])[:, 0].tolist(), (rows.argmax(-1) == t).tolist()))
    return out


def compute_spread(model_dir: Path, cases: list[PromptCase], ref: ReferenceSet, *, device: str = "cpu",
                   progress: Callable[[str], None] = print) -> LogprobSpread:
    """Computation b of LogprobSpread: the reference's weights in its dtype, run in wider arithmetic."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from enginefoundry.smoke.logprobs import measure_spread

    key = ref.key
    assert isinstance(key, ReferenceKey)
    torch_dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[key.dtype]
    wide = SPREAD_DTYPE[key.dtype]
    t0 = time.monotonic()
    tok = AutoTokenizer.from_pretrained(model_dir)
    # Loaded in the wider dtype, so that device_map="auto" places the size it will hold (a model accelerate has
    # dispatched cannot be cast with .to(): "You can't move a model that has some modules offloaded"), then each
    # weight rounded to the reference's dtype in place: the same (rounded) weights, wider arithmetic.
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, wide),
                                                                  **load_options(device), **wide_options(wide))
    model.train(False)  # eval(): transformers leaves PreTrainedModel.eval unannotated
    simulate_activations(model, model_dir)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.device.type == "meta":
                raise ToolError(f"smoke: the spread's {wide} pass of {model_dir} does not fit the free memory of "
                                f"the GPUs and the host ({name} was offloaded to disk): set "
                                "smoke.reference_device: cpu, or smoke.reference_precision to one dtype")
            p.data.copy_(p.data.to(torch_dtype))
    by_id = ref.by_id
    answers = [by_id[c.id] for c in cases]
    try:
        b = teacher_forced(model, tok, cases, answers, progress=progress,
                           what=f"log-prob spread of the {key.dtype} reference")
    finally:
        del model
        _release(device)
    spread = measure_spread(
        [a.token_logprobs for a in answers], b, reference_key=key.digest, precision=key.dtype,
        computation_a=f"greedy decoding in {key.dtype} (transformers, KV cache)",
        computation_b=f"one teacher-forced forward pass of the {key.dtype} weights in {wide}",
        ids=[c.id for c in cases])
    progress(f"smoke: log-prob spread of the {key.dtype} reference measured in {time.monotonic() - t0:.0f} s: "
             f"mean |Δ log-prob| {spread.mean_abs_diff:.4f}, top-1 disagreement {spread.top1_disagreement:.4f}")
    return spread


def load_or_compute_spread(model_dir: Path, cases: list[PromptCase], ref: ReferenceSet, *, store: Store | None,
                           cache_dir: Path | None = None, device: str = "cpu",
                           progress: Callable[[str], None] = print,
                           trust: InputTrust | None = None) -> LogprobSpread | None:
    """The spread of this source reference, stored beside it (`<key>.spread.v2.json`, create-if-absent); None for a
    reference whose precision transformers does not compute or a sibling's answers (no second computation).
    `trust`: as for `load_or_compute_reference` (a signing run uses only a spread a trusted key signed)."""
    from enginefoundry.smoke.logprobs import LogprobSpread

    key = ref.key
    if not isinstance(key, ReferenceKey) or key.dtype not in SPREAD_DTYPES:
        return None
    cache = (cache_dir or default_cache_dir()) / spread_store_key(key).rsplit("/", 1)[-1]
    skey = spread_store_key(key)
    proof = trust is not None and trust.required and store is not None
    signed = trust.proven(store, "spread", key.digest) if trust is not None and proof and store is not None else {}

    def used(digest: str, origin: Literal["computed", "store", "local cache"], proven_by: str = "") -> None:
        if trust is not None:
            trust.record(BuildInput(kind="spread", key=key.digest, uri=store.url(skey) if store is not None else "",
                                    sha256=digest, origin=origin, proven_by=proven_by))

    for source, data in _candidates(cache, store, skey, signed):
        try:
            spread = LogprobSpread.model_validate_json(data)
        except ValueError:
            if source == "local cache":
                cache.unlink(missing_ok=True)  # damaged: measured again, never trusted
            continue
        if spread.reference_key != key.digest:
            continue
        digest = hashlib.sha256(data).hexdigest()
        if trust is not None and trust.required and digest not in signed:
            trust.refuse(f"smoke: log-prob spread of reference {key.digest[:12]} from the {source}",
                         f"sha256 {digest[:12]}… is not signed by a trusted key, and this run signs its build")
            continue
        _write_atomic(cache, data)
        progress(f"smoke: log-prob spread of reference {key.digest[:12]} from the {source}")
        used(digest, "local cache" if source == "local cache" else "store", signed.get(digest, ""))
        return spread
    progress(f"smoke: measuring the log-prob spread of the {key.dtype} reference ({len(cases)} prompts)")
    spread = compute_spread(model_dir, cases, ref, device=resolve_device(device), progress=progress)
    data = json.dumps(spread.model_dump(mode="json"), sort_keys=True).encode()
    _write_atomic(cache, data)
    digest = hashlib.sha256(data).hexdigest()
    if trust is not None and proof and store is not None:  # what this run measured, signed; never another's
        store.create_if_absent(blob_key(digest), data)
        trust.attest(store, "spread", key.digest, digest, store.url(skey))
        store.create_if_absent(skey, data)
    elif store is not None and not store.create_if_absent(skey, data):
        data = store.read_bytes(skey)
        _write_atomic(cache, data)
        spread = LogprobSpread.model_validate_json(data)
        used(hashlib.sha256(data).hexdigest(), "store")
        return spread
    used(digest, "computed")
    return spread
