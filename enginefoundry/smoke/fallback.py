"""Bounds for a unit judged against a reference of another precision: the quantization spread (issue 39).

A unit whose precision has no like-with-like reference (fp8 and nvfp4 quantize activations, which no plain checkpoint
carries; int4_awq's scales are searched on the lane's own calibration data, except where lane trtllm exports its
checkpoint) is judged against the fp32 source. Its log-prob and text bounds are derived from a measured spread, not
the family's fixed table: the fp32 reference's own answers (computation a: greedy in fp32) against the source's
weights rounded to the unit's format (computation b, "the proxy"), teacher-forced in the build's compute dtype. The
limits are `2 · s + 0.02` and `2 · e + 0.02` as for every spread (logprobs.LogprobSpread), and the text rules' floors
follow from where b leaves the reference (gate.text_floor).

This is a weaker reference than like with like, and the verdict says so: the proxy rounds the weights as the format
does but quantizes no activation (fp8, nvfp4) and searches no AWQ scale (int4_awq: round to nearest in the same
groups of 128, cruder than AWQ), so the bound assumes that a healthy build of that format moves the model from fp32
no more than about twice as far as its weights' rounding alone does. The rounding, after nvidia-modelopt 0.47.0's
presets (modelopt_recipes/configs/numerics/*.yaml, used by presets/model/fp8, nvfp4 and int4_awq.yaml, the configs
the lanes quantize with: quantize.py / hf_ptq.py --qformat fp8, nvfp4, int4_awq):

* fp8: `num_bits: e4m3`, `axis:` none: float8 e4m3 with one scale per tensor (amax / 448);
* nvfp4: `num_bits: e2m1`, `block_sizes: {-1: 16, type: dynamic, scale_bits: e4m3}`: FP4 e2m1 in blocks of 16 along
  the input, each block's scale in float8 e4m3 under one float32 scale per tensor;
* int4_awq: `num_bits: 4`, `block_sizes: {-1: 128, type: static}` (int4_per_block.yaml; TensorRT-LLM's quantize.py
  `--awq_block_size` default 128): int4 in groups of 128 along the input, round to nearest from each group's amax
  (codes -8..7, step amax / 7), without AWQ's pre-quant scales.

Every linear layer but the output embedding is rounded (default_disabled_quantizers.yaml leaves lm_head out).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from enginefoundry.catalog.precisions import PRECISIONS
from enginefoundry.identity import TOKENIZER_FILES, checkpoint_digests
from enginefoundry.smoke.logprobs import LogprobSpread, measure_spread
from enginefoundry.smoke.prompts import PromptCase
from enginefoundry.smoke.reference import (
    ReferenceKey,
    ReferenceOutcome,
    ReferenceSet,
    _release,
    _write_atomic,
    default_cache_dir,
    load_options,
    resolve_device,
    teacher_forced,
)
from enginefoundry.smoke.simulated import (
    NO_CALIBRATION_DATA,
    SimulatedKey,
    SimulatedModel,
    _copy_top_level,
    _materialize,
)

if TYPE_CHECKING:
    from torch import Tensor
    from transformers import PreTrainedModel

PROXIES: dict[str, str] = {
    "fp8": "float8 e4m3, one scale per tensor",
    "nvfp4": "FP4 e2m1 in blocks of 16 with an e4m3 scale per block",
    "int4_awq": "int4 in groups of 128, round to nearest (without AWQ's scales)",
}
# A 16-bit unit judged against an explicit fp32 reference (smoke.reference_precision: fp32): its weights are the
# source's cast to its dtype, nothing else, so its spread is that cast teacher-forced in the dtype. Without it the
# family's table limit (0.15) judged such a unit: 20 × what a healthy bf16 copy measured against fp32 on the lent H100
# (docs/scale.md, "the gate on the GPU").
CASTS: dict[str, str] = {"bf16": "bfloat16, a cast", "fp16": "float16, a cast"}
PROXY_FORMAT = 1  # of the rounding below: part of the cached spread's name
GROUP = 128  # int4_awq's block along the input (int4_per_block.yaml; quantize.py --awq_block_size)
NVFP4_BLOCK = 16
E4M3_MAX = 448.0
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # the magnitudes FP4 e2m1 represents
TORCH_NAMES = {p.value: row.torch_dtype for p, row in PRECISIONS.items() if row.torch_dtype}  # the catalog's column


def bounded_by_cast(precision: str, outcome: ReferenceOutcome) -> bool:
    """A 16-bit unit (CASTS) judged against an explicit fp32 reference of the source itself (neither a simulation
    nor a sibling unit's answers): its bounds follow from the spread of the source cast to its dtype."""
    return (precision in CASTS and outcome.simulated is None and outcome.sibling_unit is None
            and outcome.dtype == "fp32")


def round_int4_groups(w: Tensor, group: int = GROUP) -> Tensor:
    """Symmetric int4 round to nearest in groups of `group` input columns: codes -8..7, step amax / 7 per group (a
    last group shorter than `group` is its own group)."""
    import torch

    x = w.float()
    rows, cols = x.shape
    pad = (-cols) % group
    g = torch.nn.functional.pad(x, (0, pad)).reshape(rows, -1, group)
    step = g.abs().amax(dim=2, keepdim=True) / 7.0
    safe = torch.where(step > 0, step, torch.ones_like(step))
    q = (g / safe).round().clamp(-8, 7) * step
    return q.reshape(rows, cols + pad)[:, :cols]


def round_fp8(w: Tensor) -> Tensor:
    """float8 e4m3 with one scale per tensor (amax / 448)."""
    import torch

    x = w.float()
    scale = x.abs().amax().clamp(min=1e-12) / E4M3_MAX
    return (x / scale).to(torch.float8_e4m3fn).float() * scale


def round_nvfp4(w: Tensor) -> Tensor:
    """FP4 e2m1 in blocks of 16 input columns, each block's scale (amax / 6) stored in float8 e4m3 under one float32
    scale per tensor (amax / (6 · 448)); the magnitude rounds to the nearest e2m1 value."""
    import torch

    x = w.float()
    rows, cols = x.shape
    pad = (-cols) % NVFP4_BLOCK
    b = torch.nn.functional.pad(x, (0, pad)).reshape(rows, -1, NVFP4_BLOCK)
    tensor_scale = b.abs().amax().clamp(min=1e-12) / (6.0 * E4M3_MAX)
    block = (b.abs().amax(dim=2, keepdim=True) / 6.0 / tensor_scale).to(torch.float8_e4m3fn).float() * tensor_scale
    safe = torch.where(block > 0, block, torch.ones_like(block))
    grid = torch.tensor(E2M1)
    mag = (b / safe).abs().clamp(max=6.0)
    nearest = grid[(mag.unsqueeze(-1) - grid).abs().argmin(dim=-1)]
    q = nearest * torch.sign(b) * block
    return q.reshape(rows, cols + pad)[:, :cols]


ROUNDING: dict[str, Callable[[Tensor], Tensor]] = {"fp8": round_fp8, "nvfp4": round_nvfp4,
                                                   "int4_awq": round_int4_groups}


def round_linears(model: Any, precision: str) -> int:
    """Every linear layer's weight but the output embedding's, rounded in place to `precision`'s proxy; how many."""
    import torch

    head = model.get_output_embeddings()
    rounding = ROUNDING[precision]
    done = 0
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and module is not head:
                module.weight.copy_(rounding(module.weight).to(module.weight.dtype))
                done += 1
    return done


def proxy_model(source: Path, precision: str, *, root: Path | None = None,
                progress: Callable[[str], None] = print) -> SimulatedModel:
    """The source with its weights rounded to `precision`'s proxy, a plain fp32 checkpoint (cached by key beside the
    simulations: simulated.default_root). Its greedy answers are what the unit's task accuracy is judged against and
    its own cost against the source is the rule `quantization cost`: the format's cost on this model, apart from the
    build's fidelity. Activations are not quantized (a weaker reference than a simulation)."""
    import torch

    w, t, _ = checkpoint_digests(source)
    key = SimulatedKey(weights_digest=w, tokenizer_digest=t, precision=f"{precision} (weights rounded)",
                       config=json.dumps({"proxy": PROXIES[precision], "format": PROXY_FORMAT}),
                       calibration_digest=NO_CALIBRATION_DATA, modelopt="not used", torch=torch.__version__)
    return _materialize(key, root, lambda out: _round_source(source, precision, key, out, progress))


def _round_source(source: Path, precision: str, key: SimulatedKey, out: Path,
                  progress: Callable[[str], None]) -> SimulatedModel:
    import torch
    from transformers import AutoModelForCausalLM

    t0 = time.monotonic()
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    layers = round_linears(model, precision)
    model.save_pretrained(out)
    _copy_top_level(source, out, set(TOKENIZER_FILES))  # the source's own tokenizer bytes: the digests match
    seconds = round(time.monotonic() - t0, 1)
    progress(f"smoke: the source's weights rounded to {precision} ({layers} layers; {seconds:.0f} s)")
    return SimulatedModel(folder=out, key=key, source="computed",
                          description=f"the source's weights rounded to {precision}: {PROXIES[precision]}; "
                                      "activations not quantized", modules=layers, awq_scaled=0, seconds=seconds)


def spread_file(ref: ReferenceSet, precision: str, dtype: str) -> str:
    assert isinstance(ref.key, ReferenceKey)
    return f"{ref.key.digest}.qspread-{precision}-{dtype}-v{PROXY_FORMAT}.json"


def compute_quantization_spread(source: Path, cases: list[PromptCase], ref: ReferenceSet, *, precision: str,
                                dtype: str, device: str = "cpu",
                                progress: Callable[[str], None] = print) -> LogprobSpread:
    """Computation b: the source's weights rounded to `precision`'s proxy, teacher-forced in `dtype` on the fp32
    reference's answers; the spread against the reference's own log-probs (computation a)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    key = ref.key
    assert isinstance(key, ReferenceKey)
    t0 = time.monotonic()
    tok = AutoTokenizer.from_pretrained(source)
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, **load_options(device))
    model.train(False)  # eval(): transformers leaves PreTrainedModel.eval unannotated
    layers = round_linears(model, precision) if precision in PROXIES else 0  # a cast: the line below does it
    model.to(getattr(torch, TORCH_NAMES[dtype]))
    by_id = ref.by_id
    answers = [by_id[c.id] for c in cases]
    try:
        b = teacher_forced(model, tok, cases, answers, progress=progress, what=f"the {precision}-rounded source")
    finally:
        del model
        _release(device)
    rounded = (f"rounded to {precision} ({PROXIES[precision]}, {layers} layers)" if precision in PROXIES
               else f"cast to {precision} ({CASTS[precision]})")
    spread = measure_spread(
        [a.token_logprobs for a in answers], b, reference_key=key.digest,
        precision=(f"{precision}-rounded weights in {dtype} against {key.dtype}" if precision in PROXIES
                   else f"{precision}-cast weights against {key.dtype}"),
        computation_a=f"greedy decoding in {key.dtype} (transformers, KV cache)",
        computation_b=f"the source's weights {rounded}, teacher-forced in {dtype}",
        ids=[c.id for c in cases])
    progress(f"smoke: quantization spread of {precision} against the {key.dtype} reference measured in "
             f"{time.monotonic() - t0:.0f} s: mean |Δ log-prob| {spread.mean_abs_diff:.4f}, top-1 disagreement "
             f"{spread.top1_disagreement:.4f}")
    return spread


def load_or_compute_quantization_spread(source: Path, cases: list[PromptCase], ref: ReferenceSet, *, precision: str,
                                        dtype: str, device: str = "cpu", cache_dir: Path | None = None,
                                        progress: Callable[[str], None] = print) -> LogprobSpread | None:
    """The quantization spread of `precision` against this fp32 reference, from the local reference cache
    (`<key>.qspread-<precision>-<dtype>-v1.json`, beside the reference) or measured; None for a precision without a
    proxy or a cast, or a reference that is not a source reference."""
    if (precision not in PROXIES and precision not in CASTS) or not isinstance(ref.key, ReferenceKey):
        return None
    cache = (cache_dir or default_cache_dir()) / spread_file(ref, precision, dtype)
    if cache.is_file():
        try:
            spread = LogprobSpread.model_validate_json(cache.read_bytes())
            if spread.reference_key == ref.key.digest:
                progress(f"smoke: quantization spread of {precision} against reference {ref.key.digest[:12]} from "
                         "the local cache")
                return spread
        except ValueError:
            pass
        cache.unlink(missing_ok=True)  # damaged or another reference's: measured again, never trusted
    progress(f"smoke: measuring the quantization spread of {precision} against the {ref.key.dtype} reference "
             f"({len(cases)} prompts; the source's weights rounded, in {dtype})")
    spread = compute_quantization_spread(source, cases, ref, precision=precision, dtype=dtype,
                                         device=resolve_device(device), progress=progress)
    _write_atomic(cache, json.dumps(spread.model_dump(mode="json"), sort_keys=True).encode())
    return spread
