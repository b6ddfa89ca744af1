"""Preflight: can this unit succeed on its target? Every problem at once, before any download or GPU time.

Preflight knows no lane by name: the unit's lane adds its own checks (precision × architecture, plugins, chunked
prefill: `Lane.preflight_checks`) and answers for its memory model (`needs_gpu`, `embedding_sharded`,
`sizes_kv_pool`, `build_footprint`). The rules here hold for every lane (facts/trtllm.md §2, §12):
- max_input_len < max_seq_len ≤ the model's context;
- tp × pp ≤ the target's GPU count; attention heads divisible by tp, KV heads divisible by tp (or tp by them);
- VRAM: weights per GPU, then the KV pool TensorRT-LLM sizes from what is left (see `estimate_memory`);
- host memory and disk for the build, measured where the build runs.

`model_config` is the checkpoint's Hugging Face config.json; without it the shape-dependent checks are skipped
with a note (configs/model-configs/ has the Llama 3 configs, so `plan` can estimate without a download).
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, Field

from enginefoundry.catalog.precisions import PRECISIONS, precisions_where
from enginefoundry.errors import InputError, PreflightError
from enginefoundry.gpu.detect import GPUInfo, match_target
from enginefoundry.gpu.precisions import KV_BYTES, SPREAD_DTYPE, TORCH_BYTES, activation_dtype
from enginefoundry.inputs.model_config import expert_count
from enginefoundry.inputs.model_shape import Check, ModelShape
from enginefoundry.inputs.quantized_source import spec_quantization
from enginefoundry.inputs.units import Unit
from enginefoundry.lanes.moe_parallel import MOE_ADP_REPLICATES, expert_check
from enginefoundry.lanes.registry import get_lane
from enginefoundry.lanes.trtllm_disagg import role_variants
from enginefoundry.schemas.loose import HfModelConfig
from enginefoundry.spec import Arch, BuildSpec, ReferenceDevice, Target
from enginefoundry.spec.checks import (
    SIMULATED_DTYPE,
    SIMULATED_PRECISIONS,
    SIMULATED_REFERENCE,
    UNIT_PRECISION,
    ReferenceSource,
    no_like_reference,
)

GIB = 1024**3

# Share of the memory left after the weights that TensorRT-LLM spends before it sizes the KV pool: CUDA context,
# activation buffers (max_num_tokens), cuBLAS workspaces, CUDA graphs. The KV fraction then applies to the rest.
RUNTIME_MARGIN = 0.12
# Refuse a profile whose max_batch_size × max_seq_len is more than this many times the tokens the KV pool holds.
# Paged KV admits requests while blocks are free, so 2–10× is normal (real requests are shorter than
# max_seq_len, and the scheduler queues the rest); at typical lengths (≈ half of max_seq_len) 16× full-length
# means ≈ 8× oversubscription, where max_batch_size is fiction and its buffers are waste.
OVERSUBSCRIPTION_LIMIT = 16.0

# --- report --------------------------------------------------------------------------------------------------


class MemoryEstimate(BaseModel):
    params: int
    active_params: int | None = Field(default=None, description="per token, for a mixture-of-experts model")
    expert_weights_bytes_per_gpu: int | None = Field(default=None, description="the routed experts' share of "
                                                     "weights_bytes_per_gpu (split over moe_ep × moe_tp)")
    weights_bytes_total: int
    weights_bytes_per_gpu: int
    kv_bytes_per_token_per_gpu: int
    gpu_memory_bytes: int | None = None
    gpu_memory_source: str | None = None
    kv_budget_bytes: int | None = None
    kv_tokens_fit: int | None = None
    full_sequences_fit: int | None = None
    oversubscription: float | None = Field(default=None, description="max_batch_size × max_seq_len / tokens_fit")
    speculative_bytes_per_gpu: int | None = Field(
        default=None, description="a speculative unit's share of weights_bytes_per_gpu: the draft's weights "
        "(draft_target, eagle3) or the MTP layers (mtp)")
    speculative_what: str | None = None
    host_needed_bytes: int | None = None
    host_available_bytes: int | None = None
    disk_needed_bytes: int | None = None
    disk_free_bytes: int | None = None


class PreflightReport(BaseModel):
    unit: str
    lane: str
    target: str
    checks: list[Check] = Field(default_factory=list)
    estimates: MemoryEstimate | None = None
    notes: list[str] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def problems(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def raise_for_problems(self) -> None:
        if self.ok:
            return
        lines = [f"  {c.name}: {c.message}" + (f" — fix: {c.fix}" if c.fix else "") for c in self.problems]
        raise PreflightError(f"unit {self.unit} cannot succeed on target {self.target} "
                             f"({len(lines)} problem(s)):\n" + "\n".join(lines))


# --- host resources ------------------------------------------------------------------------------------------

def host_memory_bytes(cgroup_root: Path = Path("/sys/fs/cgroup"), meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """Memory a build may use: the cgroup limit (v2 memory.max, v1 memory.limit_in_bytes) capped by MemTotal."""
    total = None
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024
                break
    except OSError:
        pass
    limit = None
    for f in (cgroup_root / "memory.max", cgroup_root / "memory" / "memory.limit_in_bytes"):
        try:
            raw = f.read_text().strip()
        except OSError:
            continue
        if raw.isdigit() and int(raw) < 2**60:  # "max" / a huge number: no limit
            limit = int(raw)
        break
    values = [v for v in (total, limit) if v]
    return min(values) if values else None


def free_disk_bytes(path: Path) -> int | None:
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


# --- the checks ----------------------------------------------------------------------------------------------

def _cc(arch: Arch) -> tuple[int, int] | None:
    return arch.compute_capability


def _length_checks(spec: BuildSpec, unit: Unit, shape: ModelShape | None) -> list[Check]:
    p = unit.profile
    out = []
    if p.max_input_len >= p.max_seq_len:
        out.append(Check(name="lengths", ok=False,
                         message=f"max_input_len ({p.max_input_len}) must be < max_seq_len ({p.max_seq_len})",
                         fix="max_seq_len counts input plus output tokens: raise it or lower max_input_len"))
    else:
        out.append(Check(name="lengths", ok=True, message=f"input ≤ {p.max_input_len}, sequence ≤ {p.max_seq_len}"))
    limit = shape.context_limit if shape else None
    if limit and p.max_seq_len > limit:
        out.append(Check(name="context_window", ok=False,
                         message=f"max_seq_len {p.max_seq_len} exceeds the model's context of {limit} tokens",
                         fix=f"max_seq_len ≤ {limit}"))
    return out


def _parallel_checks(spec: BuildSpec, unit: Unit, shape: ModelShape | None) -> list[Check]:
    v, t = unit.variant, unit.target
    world = v.gpus
    shape_text = (f"{v.disaggregated.tag()} ({world} GPUs: both roles' workers)" if v.disaggregated
                  else f"tp × pp = {world} GPUs")
    out = []
    if t.arch is Arch.CPU:
        if get_lane(spec.lane).needs_gpu:
            out.append(Check(name="device", ok=False, message=f"lane {spec.lane} needs an NVIDIA GPU; target "
                                                               f"{t.name} is cpu",
                             fix="use a lane that runs on cpu targets, or a GPU target (sm80+)"))
        return out
    if world > t.gpu_count:
        out.append(Check(name="parallelism", ok=False,
                         message=f"{shape_text}, target {t.name} has gpu_count {t.gpu_count}",
                         fix=f"gpu_count ≥ {world} on the target, or lower " + (
                             "the roles' workers or parallelism" if v.disaggregated else "tp/pp")))
    else:
        extra = f" (uses {world} of {t.gpu_count})" if world < t.gpu_count else ""
        what = shape_text if v.disaggregated else f"tp {v.tp} × pp {v.pp}"
        out.append(Check(name="parallelism", ok=True, message=f"{what} on {t.gpu_count} GPU(s){extra}"))
    if shape and v.attention_dp:
        out.append(Check(name="heads_divisible", ok=True,
                         message=f"attention DP: every rank runs attention with all {shape.num_attention_heads} heads "
                                 f"({MOE_ADP_REPLICATES.split(' (')[0]})"))
    elif shape:
        problems = []
        if shape.num_attention_heads % v.tp:
            problems.append(f"{shape.num_attention_heads} attention heads are not divisible by tp {v.tp}")
        kv = shape.num_key_value_heads
        if kv % v.tp and v.tp % kv:
            problems.append(f"{kv} KV heads are not divisible by tp {v.tp} (nor tp by them)")
        if v.pp > shape.num_hidden_layers:
            problems.append(f"pp {v.pp} exceeds the {shape.num_hidden_layers} layers")
        if problems:
            divisors = [d for d in (1, 2, 4, 8, 16)
                        if shape.num_attention_heads % d == 0 and (kv % d == 0 or d % kv == 0)]
            out.append(Check(name="heads_divisible", ok=False, message="; ".join(problems),
                             fix=f"tp in {divisors}"))
        else:
            note = " (KV heads replicated: tp > KV heads)" if v.tp > kv else ""
            out.append(Check(name="heads_divisible", ok=True,
                             message=f"{shape.num_attention_heads} heads / {kv} KV heads split over tp {v.tp}{note}"))
    return out


# --- memory --------------------------------------------------------------------------------------------------

def _gpu_memory(target: Target, gpus: Sequence[GPUInfo] | None) -> tuple[int | None, str | None]:
    if gpus:
        try:
            used = match_target(target, gpus)
        except PreflightError:
            used = []
        if used:
            g = min(used, key=lambda x: x.memory_total_mib)
            return g.memory_total_mib * 1024 * 1024, f"detected {g.name}"
    if target.memory_gib:
        return int(target.memory_gib * GIB), "target.memory_gib"
    return None, None


def speculative_weights(spec: BuildSpec, unit: Unit, shape: ModelShape,
                        draft: ModelShape | None) -> tuple[int, int, str] | None:
    """(bytes in all, bytes per GPU, what) a speculative unit loads besides the target's weights; None for none (no
    `speculative` section, ngram, or a draft whose config.json is not at hand: `draft` None).

    draft_target / eagle3: the draft checkpoint (an EAGLE 3 head is a one-layer model with its own config.json), in
    its own dtype (the variant quantizes the target only), counted whole on every GPU (conservative: the draft's
    parallelism is the runtime's choice). mtp: num_nextn_predict_layers (default 1) decoder layers of the target
    (an MoE layer for an MoE model) plus each module's eh_proj (2·hidden × hidden), in the variant's precision,
    split as the target's layers are over tp (routed experts over moe_ep × moe_tp), on one pipeline stage."""
    sp = spec.speculative
    if sp is None:
        return None
    if sp.algorithm.needs_draft:
        if draft is None:
            return None
        total = draft.param_count() * draft.dtype_bytes
        return total, total, f"the {sp.algorithm.value} draft ({draft.param_count() / 1e6:.0f}M params)"
    if sp.algorithm.value != "mtp":
        return None
    v = unit.variant
    n = sp.num_nextn_predict_layers or 1
    layer = shape.decoder_layer_params()
    per_weight = v.precision.row.weight_bytes  # the linear layers, scales included (the catalog's column)
    dense = (layer["attention"] + layer["mlp"] + 2 * shape.hidden_size * shape.hidden_size) * per_weight
    experts = layer["experts"] * per_weight
    norms = layer["norms"] * TORCH_BYTES.get(activation_dtype(v.precision, shape) or "bfloat16", 2)
    total = int(n * (dense + experts + norms))
    per_gpu = int(n * (dense / (1 if v.attention_dp else v.tp) + experts / (v.moe_ep * v.moe_tp_size) + norms))
    return total, per_gpu, f"{n} MTP layer(s)"


def estimate_memory(spec: BuildSpec, unit: Unit, shape: ModelShape, gpu_memory_bytes: int | None,
                    gpu_memory_source: str | None = None, draft: ModelShape | None = None) -> MemoryEstimate:
    """Weights per GPU, KV bytes per token per GPU, and how many tokens the KV pool holds.

    TensorRT-LLM loads the weights, allocates activations, then gives `kv_cache_free_gpu_memory_fraction` of the
    free memory to the KV pool. Estimate: kv_budget = (memory − weights) × (1 − RUNTIME_MARGIN) × fraction.
    The engine lane replicates the embedding on every TP rank (convert_checkpoint's --use_parallel_embedding
    is off by default); the PyTorch backend shards it. A mixture-of-experts model loads every expert (total, not
    active, parameters): the routed experts are split over moe_ep × moe_tp ranks, the rest over tp, unless attention
    DP replicates it on every rank (and each rank's KV cache then holds every KV head of its own requests). A
    speculative unit adds its draft's weights or its MTP layers (`speculative_weights`; `draft`: the draft's shape).
    """
    v, p = unit.variant, unit.profile
    act = activation_dtype(v.precision, shape) or "bfloat16"
    act_bytes = TORCH_BYTES.get(act, 2)
    parts = shape.params()
    # Bytes per weight of the linear layers, scales included (the catalog's weight bits and scale overhead).
    # Embeddings, lm_head and norms stay in the activation dtype (ModelOpt and convert_checkpoint leave lm_head
    # unquantized by default).
    per_weight = v.precision.row.weight_bytes
    expert_bytes = parts["experts"] * per_weight
    dense_bytes = (parts["attention"] + parts["mlp"]) * per_weight
    other_bytes = (parts["lm_head"] + parts["norms"]) * act_bytes
    embed_bytes = parts["embedding"] * act_bytes
    world = v.tp * v.pp
    total = int(expert_bytes + dense_bytes + other_bytes + embed_bytes)
    # Routed experts: split over moe_ep × moe_tp (= tp, the lane's world-size rule) ranks of each pipeline stage.
    experts_per_gpu = expert_bytes / (v.moe_ep * v.moe_tp_size * v.pp)
    if v.attention_dp:
        # Attention DP: attention, dense FFNs, embedding and lm_head run with tp 1 on every rank (MOE_ADP_REPLICATES).
        per_gpu = int((dense_bytes + other_bytes + embed_bytes) / v.pp + experts_per_gpu)
    else:
        embed_per_gpu = embed_bytes / world if get_lane(spec.lane).embedding_sharded else embed_bytes / v.pp
        per_gpu = int((dense_bytes + other_bytes) / world + embed_per_gpu + experts_per_gpu)

    speculative = speculative_weights(spec, unit, shape, draft)
    if speculative is not None:
        total, per_gpu = total + speculative[0], per_gpu + speculative[1]

    kv_bytes = KV_BYTES.get(
        v.kv_cache_dtype, act_bytes)
    layers_per_stage = math.ceil(shape.num_hidden_layers / v.pp)
    kv_heads_per_gpu = shape.num_key_value_heads if v.attention_dp else math.ceil(shape.num_key_value_heads / v.tp)
    kv_per_token = layers_per_stage * 2 * kv_heads_per_gpu * shape.head_dim * kv_bytes

    est = MemoryEstimate(params=shape.param_count(), active_params=shape.active_param_count() if shape.is_moe else None,
                         expert_weights_bytes_per_gpu=int(experts_per_gpu) if shape.is_moe else None,
                         weights_bytes_total=total, weights_bytes_per_gpu=per_gpu,
                         kv_bytes_per_token_per_gpu=kv_per_token, gpu_memory_bytes=gpu_memory_bytes,
                         gpu_memory_source=gpu_memory_source,
                         speculative_bytes_per_gpu=speculative[1] if speculative else None,
                         speculative_what=speculative[2] if speculative else None)
    if gpu_memory_bytes:
        free = max(0, gpu_memory_bytes - per_gpu)
        budget = int(free * (1 - RUNTIME_MARGIN) * p.kv_cache_free_gpu_memory_fraction)
        tokens = budget // kv_per_token if kv_per_token else 0
        est.kv_budget_bytes = budget
        est.kv_tokens_fit = tokens
        est.full_sequences_fit = tokens // p.max_seq_len
        est.oversubscription = round(p.max_batch_size * p.max_seq_len / tokens, 2) if tokens else math.inf
    return est


def _vram_checks(spec: BuildSpec, unit: Unit, shape: ModelShape, est: MemoryEstimate) -> list[Check]:
    v, p, t = unit.variant, unit.profile, unit.target
    if not est.gpu_memory_bytes:
        return []
    mem = est.gpu_memory_bytes
    out = []
    usable = mem * (1 - RUNTIME_MARGIN)
    if est.weights_bytes_per_gpu > usable:
        need_tp = next((n for n in (2, 4, 8, 16) if est.weights_bytes_per_gpu * v.tp / n <= usable), None)
        fixes = []
        if need_tp:
            fixes.append(f"tp {need_tp} on {need_tp}+ GPUs")
        cc = _cc(t.arch) or (0, 0)
        smaller = smaller_precisions(cc)
        fixes.append(f"a smaller precision on {t.arch.value} ({', '.join(smaller)})")
        fixes.append("GPUs with more memory")
        out.append(Check(name="weights_fit", ok=False,
                         message=f"weights need {_gib(est.weights_bytes_per_gpu)} per GPU; {_gib(mem)} GPUs "
                                 f"({est.gpu_memory_source}) leave {_gib(usable)} after the runtime margin",
                         fix="; or ".join(fixes)))
        return out
    out.append(Check(name="weights_fit", ok=True,
                     message=f"weights {_gib(est.weights_bytes_per_gpu)} per GPU of {_gib(mem)}"))
    if not get_lane(spec.lane).sizes_kv_pool:
        return out
    tokens = est.kv_tokens_fit or 0
    if tokens < p.max_seq_len:
        out.append(Check(name="kv_budget", ok=False,
                         message=f"the KV cache holds ≈{tokens} tokens, less than one sequence of max_seq_len "
                                 f"{p.max_seq_len}",
                         fix="lower max_seq_len, raise kv_cache_free_gpu_memory_fraction, use an fp8 KV cache "
                             "(sm89+), or raise tp"))
    elif (est.oversubscription or 0) > OVERSUBSCRIPTION_LIMIT:
        fit_batch = int(OVERSUBSCRIPTION_LIMIT * tokens // p.max_seq_len)
        out.append(Check(name="kv_budget", ok=False,
                         message=f"max_batch_size {p.max_batch_size} × max_seq_len {p.max_seq_len} is "
                                 f"{est.oversubscription:.0f}× the ≈{tokens} tokens the KV cache holds (limit "
                                 f"{OVERSUBSCRIPTION_LIMIT:.0f}×)",
                         fix=f"max_batch_size ≤ {max(fit_batch, 1)}, a shorter max_seq_len, an fp8 KV cache, or "
                             "more GPUs (tp)"))
    else:
        over = est.oversubscription or 0
        tail = (f"; max_batch_size {p.max_batch_size} full-length would need {over:.1f}× that: paged KV admits "
                "fewer at once" if over > 1 else "")
        out.append(Check(name="kv_budget", ok=True,
                         message=f"KV cache ≈{tokens} tokens = {est.full_sequences_fit} sequences of "
                                 f"{p.max_seq_len}{tail}"))
    return out


def _host_checks(spec: BuildSpec, unit: Unit, shape: ModelShape, est: MemoryEstimate, on_worker: bool,
                 workdir: Path, host_memory: int | None) -> list[Check]:
    v = unit.variant
    world = v.tp * v.pp
    source_bytes = shape.param_count() * shape.dtype_bytes
    per_rank = est.weights_bytes_total // world
    host, disk = get_lane(spec.lane).build_footprint(spec, unit, est, source_bytes, per_rank)
    host = int(host * 1.1)
    est.host_needed_bytes, est.host_available_bytes = host, host_memory
    free = free_disk_bytes(workdir)
    est.disk_needed_bytes, est.disk_free_bytes = int(disk), free
    out = []
    where = "this host" if on_worker else "this host (not the build worker: informational)"
    if host_memory is not None:
        ok = host <= host_memory or not on_worker
        out.append(Check(name="host_memory", ok=ok,
                         message=f"the build needs ≈{_gib(host)} host memory; {where} allows {_gib(host_memory)}",
                         fix=None if ok else "lane option load_by_shard: true, build_workers: 1, or a bigger host"))
    if free is not None:
        ok = disk <= free or not on_worker
        out.append(Check(name="disk", ok=ok,
                         message=f"checkpoint + artifacts need ≈{_gib(disk)}; {where} has {_gib(free)} free at "
                                 f"{workdir}",
                         fix=None if ok else "free disk space or point the work folder at a larger volume"))
    return out


def smaller_precisions(cc: tuple[int, int]) -> list[str]:
    """The quantized precisions a weights-do-not-fit fix may offer on `cc`, from the catalog's rows (quantized,
    suggested, the minimum capability met) in its order; the integer weight-only ones only below SM 100 (builder.py
    refuses INT8/INT4 there, facts §0)."""
    return [p.value for p in precisions_where(suggested=True)
            if p.is_quantized and (p.row.min_cc is None or cc >= p.row.min_cc)
            and not (p.row.int_weight_only and cc >= (10, 0))]


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


# A reference's bytes per parameter, by the precision transformers computes it in (the catalog's weight bits).
REFERENCE_DTYPE_BYTES = {p.value: row.weight_bits // 8 for p, row in PRECISIONS.items() if row.torch_dtype}
NO_SPREAD = "one dtype for every unit: no log-prob spread is measured, the family's table bounds"


class ReferenceFit(BaseModel):
    """Where a source reference of one dtype would run, what it needs and what that place allows."""

    dtype: str
    device: ReferenceDevice
    need: int
    limit: int | None  # None: unknown here (no spec limit, no detected host or GPUs, no memory_gib)
    where: str  # what sets the limit, e.g. "smoke.reference_host_memory_gib allows"
    place: str = "the host CPU"
    spread: bool = False  # like with like: the log-prob spread's wider-arithmetic pass is budgeted too

    @property
    def fits(self) -> bool | None:
        return None if self.limit is None else self.need <= self.limit


def reference_need(shape: ModelShape, dtype: str, spread: bool = False) -> int:
    """The whole source in `dtype` (params × bytes), +20% for activations, the KV of greedy decoding and the
    tokenizer. With the spread (like with like), the larger of that and the spread's pass: the same weights in
    wider arithmetic (the reference's model is freed before it loads; `.to()` converts one tensor at a time)."""
    wide = (8 if SPREAD_DTYPE.get(dtype, "float64") == "float64" else 4) if spread else 0
    per_param = max(REFERENCE_DTYPE_BYTES.get(dtype, 4), wide)
    return int(shape.param_count() * per_param * 1.2)


def dequantizes(spec: BuildSpec, precision: str) -> bool:
    """smoke.reference_precision: unit (the default) or simulated judges a unit of `precision` against its lane's
    own quantized checkpoint, dequantized (the lane exports ModelOpt's unified checkpoint for it: Lane.dequantizable;
    like with like)."""
    if prequantized_reference(spec, precision):
        return True
    return (spec.smoke.reference_precision in (UNIT_PRECISION, SIMULATED_REFERENCE)
            and spec.smoke.reference is ReferenceSource.SOURCE and precision in get_lane(spec.lane).dequantizable)


def prequantized_reference(spec: BuildSpec, precision: str) -> bool:
    """The source is pre-quantized as `precision` in a format the gate dequantizes (build.quantized_source): every
    lane's unit of it is judged against the checkpoint dequantized, the only reference it has (tasks/smoke.py)."""
    quant = spec_quantization(spec)
    return quant is not None and quant.dequantizable and quant.precision.value == precision


def proxied(spec: BuildSpec, precision: str) -> bool:
    """A unit of `precision` is judged against the fp32 source with its quantization's proxy (smoke/fallback.py: the
    source's weights rounded to the format, its task accuracy and spread): no like-with-like reference on this lane."""
    from enginefoundry.smoke.fallback import PROXIES

    return (precision in PROXIES and not like_reference(spec, precision)
            and spec.smoke.reference_precision in (UNIT_PRECISION, SIMULATED_REFERENCE))


def like_reference(spec: BuildSpec, precision: str) -> bool:
    """A unit of `precision` is judged like with like (its own precision computed, simulated or dequantized)."""
    return prequantized_reference(spec, precision) or spec.smoke.has_like_reference(
        precision, get_lane(spec.lane).dequantizable)


def reference_problems(spec: BuildSpec) -> list[tuple[str, str, int | None]]:
    """What the spec requires of its gate that its units cannot have, as (field, message, the variant's index or
    None for every unit): like-with-like references (`smoke.no_like_reference: refuse`) for a precision that has
    none on this lane, log-prob checks (`smoke.logprob_checks: required`) from a smoke server that cannot serve
    them. `validate` and the run refuse them by field, `plan` on the units they concern."""
    problems: list[tuple[str, str, int | None]] = []
    if spec.smoke.no_like_reference == "refuse":
        for i, v in enumerate(spec.variants):
            p = v.precision.value
            if like_reference(spec, p):
                continue
            why = ("smoke.reference: sibling judges it by its sibling's answers"
                   if spec.smoke.reference is ReferenceSource.SIBLING else
                   f"smoke.reference_precision {spec.smoke.reference_precision}"
                   if spec.smoke.reference_precision not in (UNIT_PRECISION, SIMULATED_REFERENCE) else
                   no_like_reference(p))
            problems.append(("smoke.no_like_reference", (
                f"refuse: variants.{i}.precision {p} has no reference at its own precision on lane {spec.lane} "
                f"({why}); remove that variant, use a lane that exports its checkpoint (lane trtllm's int4_awq, fp8, "
                "nvfp4), "
                "or set smoke.no_like_reference: fallback (the fp32 source, bounds derived from the quantization "
                "spread)"), i))
    missing = get_lane(spec.lane).smoke_logprobs_missing(spec)
    if spec.smoke.logprob_checks == "required" and missing is not None:
        problems.append(("smoke.logprob_checks", f"required, but lane {spec.lane}'s smoke server cannot serve "
                         f"{missing}; set smoke.logprob_checks: when-served (the verdict names the checks not run)",
                         None))
    return problems


def unit_reference(spec: BuildSpec, unit: Unit) -> tuple[str, bool]:
    """The dtype of the unit's source reference (smoke.reference_precision; `unit`: its own where transformers
    computes it, else fp32) and whether its log-prob spread is measured (like with like)."""
    precision = unit.variant.precision.value
    if dequantizes(spec, precision):
        return SIMULATED_DTYPE, True
    return spec.smoke.reference_for(precision)[0], spec.smoke.like_with_like(precision)


def reference_summary(spec: BuildSpec, unit: Unit) -> str:
    """The reference the unit's smoke verdict will be judged against, as `plan` and `validate` show it."""
    from enginefoundry.spec.siblings import sibling_variant

    sibling = sibling_variant(spec, unit.variant)
    if sibling is not None:
        return f"sibling {sibling.name}"
    dtype, spread = unit_reference(spec, unit)
    if spec.smoke.simulates(unit.variant.precision.value):
        # The build's compute dtype (smoke.simulated.simulated_dtype) is read from the source, not known to a plan.
        return f"simulated {unit.variant.precision.value} (TensorRT-LLM's quantizer, the build's dtype; like with like)"
    if prequantized_reference(spec, unit.variant.precision.value):
        quant = spec_quantization(spec)
        inputs = (", its inputs quantized as the engine's" if quant is not None and quant.quantizes_activations
                  and get_lane(spec.lane).quantizes_activations else "")
        return (f"the pre-quantized {unit.variant.precision.value} source, dequantized{inputs} (the build's dtype; "
                "like with like)")
    if dequantizes(spec, unit.variant.precision.value):
        return f"the lane's {unit.variant.precision.value} checkpoint, dequantized (the build's dtype; like with like)"
    if spread:
        return f"{dtype} (like with like)"
    precision = unit.variant.precision.value
    if spec.smoke.reference_precision in (UNIT_PRECISION, SIMULATED_REFERENCE) and precision in SIMULATED_PRECISIONS:
        return (f"{dtype} (no {precision} reference on lane {spec.lane}: calibrated on its data; bounds from the "
                "quantization spread)")
    if spec.smoke.reference_precision in (UNIT_PRECISION, SIMULATED_REFERENCE):
        return f"{dtype} (no {precision} reference; bounds from the quantization spread)"
    return f"{dtype} (smoke.reference_precision)"


def reference_fit(spec: BuildSpec, unit: Unit, shape: ModelShape, dtype: str, device: ReferenceDevice,
                  host_memory: int | None, gpus: Sequence[GPUInfo] | None, spread: bool = False) -> ReferenceFit:
    """cpu: host RAM (`smoke.reference_host_memory_gib`, else this host's). gpu: the unit's GPUs on its worker
    (the model sharded by device_map="auto"): the detected GPUs of the target, else tp × pp GPUs of the
    target's memory_gib, less the runtime margin; a cpu target has none. `spread`: budget the log-prob spread's
    wider-arithmetic pass too (reference_need)."""
    need = reference_need(shape, dtype, spread)
    fit = _fit(spec, unit, dtype, device, need, host_memory, gpus)
    return fit.model_copy(update={"spread": spread})


def _fit(spec: BuildSpec, unit: Unit, dtype: str, device: ReferenceDevice, need: int, host_memory: int | None,
         gpus: Sequence[GPUInfo] | None) -> ReferenceFit:
    if device is ReferenceDevice.CPU:
        allowed = spec.smoke.reference_host_memory_gib
        if allowed is not None:
            return ReferenceFit(dtype=dtype, device=device, need=need, limit=int(allowed * GIB),
                                where="smoke.reference_host_memory_gib allows")
        return ReferenceFit(dtype=dtype, device=device, need=need, limit=host_memory, where="this host has")
    t = unit.target
    if t.arch is Arch.CPU or t.gpu_count == 0:
        return ReferenceFit(dtype=dtype, device=device, need=need, limit=0, where=f"target {t.name} has no GPU:")
    mem, source = _gpu_memory(t, gpus)
    if mem is None:
        return ReferenceFit(dtype=dtype, device=device, need=need, limit=None,
                            where=f"target {t.name}'s GPU memory is unknown (no detected GPU, no memory_gib)")
    count = unit.variant.gpus
    if gpus:
        with contextlib.suppress(PreflightError):  # GPUs that do not match: gpu_match refuses them
            count = max(count, len(match_target(t, gpus)))
    usable = int(count * mem * (1 - RUNTIME_MARGIN))
    place = f"{count}× {_gib(mem)} GPUs of target {t.name} ({source})"
    return ReferenceFit(dtype=dtype, device=device, need=need, limit=usable, where=f"{place} leave", place=place)


def _fit_text(fit: ReferenceFit) -> str:
    where = fit.where if fit.limit is None else f"{fit.where} {_gib(fit.limit)}"
    what = "host memory" if fit.device is ReferenceDevice.CPU else "on GPUs"
    spread = f" and its log-prob spread ({SPREAD_DTYPE[fit.dtype]} pass, like with like)" if fit.spread else ""
    return f"the {fit.dtype} smoke reference{spread} needs ≈{_gib(fit.need)} {what}; {where}"


def reference_check(spec: BuildSpec, unit: Unit, shape: ModelShape, host_memory: int | None, *, on_worker: bool,
                    gpus: Sequence[GPUInfo] | None = None) -> Check:
    """The smoke reference of one unit, before any download. A unit judged against its sibling loads no model.
    A source reference loads the whole source in the unit's reference dtype (unit_reference) on
    `smoke.reference_device`, like with like then its spread's wider pass (reference_fit). It is refused when it
    exceeds what the spec allows (reference_host_memory_gib, the target's GPUs) or, on the worker, the host's
    memory; the fix lists every option that fits in this spec."""
    from enginefoundry.spec.siblings import sibling_variant

    sibling = sibling_variant(spec, unit.variant)
    if sibling is not None:
        return Check(name="reference_memory", ok=True,
                     message=f"judged against sibling unit {sibling.name}.{unit.profile.name}.{unit.target.name}'s "
                             "served answers: no reference model is loaded")
    dtype, spread = unit_reference(spec, unit)
    device = spec.smoke.reference_device
    fit = reference_fit(spec, unit, shape, dtype, device, host_memory, gpus, spread)
    host_unchecked = device is ReferenceDevice.CPU and spec.smoke.reference_host_memory_gib is None and not on_worker
    ok = fit.fits is not False or host_unchecked
    if fit.limit is None or ok:
        return Check(name="reference_memory", ok=True, message=_fit_text(fit))
    return Check(name="reference_memory", ok=False, message=_fit_text(fit),
                 fix="; or ".join(reference_fixes(spec, unit, shape, host_memory, gpus, fit)))


SIMULATION_COPIES = 1  # the source in fp32, its linear weights replaced in place (smoke/simulated.py)
DEQUANTIZATION_COPIES = 2  # the dequantized float32 tensors, then the model loaded from them to check it


def simulation_check(spec: BuildSpec, unit: Unit, shape: ModelShape, host_memory: int | None, *,
                     on_worker: bool) -> Check:
    """smoke.reference_precision: simulated, an int8_wo or int4_wo unit: its quantization is simulated on the host
    CPU (smoke/simulated.py: TensorRT-LLM's weight-only quantizer, from the weights alone) before its reference is
    computed: the host holds the source in fp32 (+20%), the cache root the simulated fp32 checkpoint (and a format
    that needs ModelOpt needs it installed). A unit whose lane's checkpoint is dequantized instead (`dequantizes`):
    the float32 tensors and the model loaded back from them, twice that. Refused on the worker (or against
    smoke.reference_host_memory_gib); elsewhere it informs."""
    from enginefoundry.smoke.simulated import can_simulate

    precision = unit.variant.precision.value
    export = dequantizes(spec, precision)
    proxy = not export and not spec.smoke.simulates(precision)  # judged against fp32: its quantization's proxy
    need = int(shape.param_count() * 4 * (DEQUANTIZATION_COPIES if export else SIMULATION_COPIES) * 1.2)
    disk = int(shape.param_count() * 4)
    prequantized = prequantized_reference(spec, precision)  # dequantized by this project's code: no ModelOpt
    whose = "the pre-quantized source's" if prequantized else "the lane's"
    doing, once = ((f"dequantizing {whose} {precision} checkpoint", "once per checkpoint") if export else
                   (f"rounding the source's weights to {precision} (the proxy its task accuracy is judged against)",
                    "once per source") if proxy else
                   (f"the {precision} simulation", "once per source (the weights alone)"))
    what = f"{doing} (host CPU) needs ≈{_gib(need)} host memory and ≈{_gib(disk)} under the cache root, {once}"
    why_not = None if proxy or prequantized else can_simulate(precision)
    if why_not is not None:
        return Check(name="simulation", ok=not on_worker, message=f"{what}; {why_not}",
                     fix="pip install 'enginefoundry[simulate]' on the workers that run the smoke reference, or "
                         "smoke.reference_precision: fp32 (the fp32 source judges every unit)")
    allowed = spec.smoke.reference_host_memory_gib
    limit, where = ((int(allowed * GIB), "smoke.reference_host_memory_gib allows") if allowed is not None
                    else (host_memory, "this host has"))
    if limit is not None and need > limit and (on_worker or allowed is not None):
        return Check(name="simulation", ok=False, message=f"{what}; {where} {_gib(limit)}",
                     fix=f"a reference host with ≥ {math.ceil(need / GIB)} GiB (smoke.reference_host_memory_gib), "
                         "or smoke.reference_precision: fp32 (no simulation: the fp32 source judges every unit)")
    from enginefoundry.smoke.simulated import default_root

    root = default_root()  # under EF_REFERENCE_CACHE where set, else the cache root's
    free = free_disk_bytes(root)
    if on_worker and free is not None and disk > free:
        return Check(name="simulation", ok=False, message=f"{what}; {root} has {_gib(free)} free",
                     fix="free space there (EF_REFERENCE_CACHE, else EF_CACHE_DIR) or point it at a larger disk")
    return Check(name="simulation", ok=True, message=what)


def reference_fixes(spec: BuildSpec, unit: Unit, shape: ModelShape, host_memory: int | None,
                    gpus: Sequence[GPUInfo] | None, failed: ReferenceFit) -> list[str]:
    """Every way to a reference that fits in this spec: another precision, another device, a sibling unit whose
    own reference fits, a larger host or GPUs, or answers already published. Like with like (the spread
    budgeted), a fixed dtype comes first: the same reference without the spread's wider pass."""
    from enginefoundry.spec.siblings import higher_precision_variants

    fixes = []
    fixed = dict.fromkeys(([failed.dtype] if failed.spread else []) + (["bf16"] if failed.dtype == "fp32" else []))
    for dtype in fixed:
        alt = reference_fit(spec, unit, shape, dtype, failed.device, host_memory, gpus)
        if alt.fits:
            note = f"; {NO_SPREAD}" if failed.spread else ""
            fixes.append(f"smoke.reference_precision: {dtype} (≈{_gib(alt.need)} on {alt.device.value}{note})")
            break
    other = ReferenceDevice.GPU if failed.device is ReferenceDevice.CPU else ReferenceDevice.CPU
    for dtype, spread in dict.fromkeys([(failed.dtype, failed.spread), *((d, False) for d in fixed)]):
        alt = reference_fit(spec, unit, shape, dtype, other, host_memory, gpus, spread)
        if alt.fits:
            extra = "" if spread == failed.spread else f" with smoke.reference_precision: {dtype}"
            fixes.append(f"smoke.reference_device: {other.value}{extra} (≈{_gib(alt.need)} on {alt.place})")
            break
    for variant in higher_precision_variants(spec, unit.variant, unit.target.name):
        sib = Unit(variant=variant, profile=unit.profile, target=unit.target)
        sib_dtype, sib_spread = unit_reference(spec, sib)
        if reference_fit(spec, sib, shape, sib_dtype, failed.device, host_memory, gpus, sib_spread).fits:
            fixes.append(f"smoke.reference: sibling with smoke.reference_sibling: {variant.name} (unit {sib.name}, "
                         f"whose own {sib_dtype} reference fits, judges this unit by its served answers)")
            break
    fixes.append("a larger reference host (smoke.reference_host_memory_gib ≥ "
                 f"{math.ceil(failed.need / GIB)})" if failed.device is ReferenceDevice.CPU else
                 f"GPUs with more memory for target {unit.target.name} (≥ {_gib(failed.need)} in all)")
    fixes.append("reference answers already published for this source (computed once where they fit)")
    return fixes


# --- entry points --------------------------------------------------------------------------------------------

def preflight(spec: BuildSpec, unit: Unit,
              model_config: HfModelConfig | None,
              gpus: list[GPUInfo] | None,
              *, workdir: Path | None = None, host_memory: int | None = None) -> PreflightReport:
    """Check one unit. `gpus` = the build worker's detected GPUs (None when planning elsewhere): with them the
    GPU match, host memory and disk checks can refuse; without them they only inform."""
    report = PreflightReport(unit=unit.name, lane=spec.lane, target=unit.target.name)
    t = unit.target
    shape = ModelShape.from_config(model_config) if model_config else None
    if shape is not None:
        host = host_memory if host_memory is not None else host_memory_bytes()
        report.checks.append(reference_check(spec, unit, shape, host, on_worker=gpus is not None, gpus=gpus))
        from enginefoundry.spec.siblings import sibling_variant

        precision = unit.variant.precision.value
        simulated = spec.smoke.simulates(precision) or dequantizes(spec, precision) or proxied(spec, precision)
        if simulated and sibling_variant(spec, unit.variant) is None:
            report.checks.append(simulation_check(spec, unit, shape, host, on_worker=gpus is not None))
    lane = get_lane(spec.lane)
    if t.arch is Arch.CPU and not lane.needs_gpu:
        report.checks.append(Check(name="device", ok=True, message="cpu target: no GPU checks apply"))
        report.notes.append(f"cpu target on lane {spec.lane}: precision, VRAM and parallelism checks do not apply")
        return report
    if gpus is not None and t.arch is not Arch.CPU:
        try:
            used = match_target(t, gpus)
            report.checks.append(Check(name="gpu_match", ok=True,
                                       message=f"{len(used)}× {used[0].name} ({used[0].arch})" if used else "ok"))
        except PreflightError as err:
            report.checks.append(Check(name="gpu_match", ok=False, message=str(err),
                                       fix=f"run on a worker of pool {t.pool}"))
    report.checks += lane.preflight_checks(spec, unit, shape)  # precision × arch, plugins, chunked prefill
    report.checks += _length_checks(spec, unit, shape)
    report.checks += _parallel_checks(spec, unit, shape)
    # A disaggregated unit is checked role by role: each role's workers are aggregated servers of their own shape.
    roles = {r: unit.model_copy(update={"variant": rv, "profile": unit.profile.model_copy(
        update={"max_batch_size": bs})}) for r, (rv, bs) in role_variants(unit.variant).items()} or {"": unit}
    for role, u in roles.items():
        if u.variant.moe_ep > 1 or u.variant.moe_tp is not None:
            if model_config is None:
                report.notes.append("model config unknown: the expert count is not checked against moe_ep")
            else:
                experts = expert_check(u.variant, expert_count(model_config))
                if experts is not None:
                    report.checks.append(_for_role(experts, role))
    if t.arch is Arch.CPU:
        return report
    if shape is None:
        report.notes.append("model config unknown: head-divisibility, VRAM, host-memory and disk estimates skipped")
        return report
    mem, source = _gpu_memory(t, gpus)
    draft = _draft_shape(spec, report)
    host = host_memory if host_memory is not None else host_memory_bytes()
    for role, u in roles.items():
        est = estimate_memory(spec, u, shape, mem, source, draft)
        if report.estimates is None or est.weights_bytes_per_gpu > report.estimates.weights_bytes_per_gpu:
            report.estimates = est  # a disaggregated unit's: the role with the most weights per GPU
        if mem is not None:
            report.checks += [_for_role(c, role) for c in _vram_checks(spec, u, shape, est)]
        report.checks += [_for_role(c, role) for c in _host_checks(spec, u, shape, est, gpus is not None,
                                                                    workdir or Path(os.getcwd()), host)]
    if mem is None:
        report.notes.append(f"GPU memory unknown (no detected GPU, no memory_gib on target {t.name}): VRAM check "
                            "skipped")
    return report


def _for_role(check: Check, role: str) -> Check:
    """A check of one role of a disaggregated unit, saying which ("" : the unit's own)."""
    return check.model_copy(update={"message": f"{role} workers: {check.message}"}) if role else check


def _draft_shape(spec: BuildSpec, report: PreflightReport) -> ModelShape | None:
    """The speculative draft's shape from its config.json where it is at hand (a local draft, a Hub draft's cached
    config); else a note that its weights are not in the estimate."""
    sp = spec.speculative
    if sp is None or not sp.algorithm.needs_draft:
        return None
    from enginefoundry.lanes.speculation import draft_config

    try:
        config, _ = draft_config(spec)
        shape = ModelShape.from_config(config) if config else None
    except InputError:
        shape = None
    if shape is None:
        report.notes.append("speculative.draft config unknown: its weights are not in the memory estimate")
    return shape


def format_estimates(report: PreflightReport) -> str:
    """One line for the plan table: params, weights per GPU, KV per token, tokens and sequences that fit."""
    e = report.estimates
    if e is None:
        return "; ".join(report.notes) or "no estimates"
    active = f" ({e.active_params / 1e9:.1f}B active)" if e.active_params is not None else ""
    draft = (f" incl. {e.speculative_what} {_gib(e.speculative_bytes_per_gpu)}"
             if e.speculative_bytes_per_gpu is not None else "")
    parts = [f"{e.params / 1e9:.1f}B params{active}", f"weights {_gib(e.weights_bytes_per_gpu)}/GPU{draft}",
             f"KV {e.kv_bytes_per_token_per_gpu / 1024:.0f} KiB/token/GPU"]
    if e.kv_tokens_fit is not None:
        parts.append(f"KV pool ≈{e.kv_tokens_fit / 1000:.1f}k tokens ({e.full_sequences_fit} full sequences)")
        if e.oversubscription is not None and e.oversubscription > 1:
            parts.append(f"batch × seq = {e.oversubscription:.1f}× pool")
    else:
        parts.append("GPU memory unknown")
    problems = report.problems
    status = "ok" if not problems else "REFUSED: " + ", ".join(c.name for c in problems)
    return " · ".join(parts) + f" · {status}"
