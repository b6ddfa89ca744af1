"""The quantization tool's simulated model: the reference a quantized unit is judged against, like with like.

A weight-only quantized build (int4_awq, int4_wo, int8_wo) serves the source model with its weights rounded to a
grid, scaled per group or channel; its answers drift from the fp32 source by the quantization itself, which says
nothing about whether the build is right. NVIDIA ModelOpt, the tool the TensorRT-LLM lanes quantize with, simulates
the quantization in PyTorch ("fake quant": `mtq.quantize` inserts quantizers that round the weights in place of the
kernels). For weight-only formats the simulated model is again a plain checkpoint: each quantized linear layer
computes `(x · s) @ Q(W')ᵀ` (AWQ's pre-quant scale s on the input, none for the others), the same as `x @ (Q(W') ·
diag(s))ᵀ`, so its effective weights are written into a copy of the source and served, referenced and spread like
any model. `simulate` does that once per key (source, format, calibration prompts where the format reads any,
ModelOpt and torch versions) under the cache root, checks the written model against ModelOpt's own (logits equal to
1e-3 relative), and keeps ModelOpt's per-layer parameters beside it (`quantizers.safetensors`: the weight
quantizer's amax, AWQ's pre-quant scale).

Not simulated: formats that quantize activations (fp8, nvfp4: the input quantizer changes every activation, which
no plain checkpoint carries; ModelOpt 0.47.0's NVFP4 fake quant also asserts CUDA tensors,
modelopt/torch/quantization/tensor_quant.py `_dynamic_block_quantize_impl`). Those keep the fp32 source or a
gated sibling as their reference.

Sources (nvidia-modelopt 0.47.0, the wheel on PyPI): INT4_AWQ_CFG (int4 weights in blocks of 128 along the input,
awq_lite calibration), INT8_WEIGHT_ONLY_CFG (int8 per output channel, max calibration), in
modelopt/torch/quantization/config.py; int4_wo is TensorRT-LLM's per-channel int4 weight-only
(convert_checkpoint.py --weight_only_precision int4), INT8_WEIGHT_ONLY_CFG with num_bits 4.
"""

from __future__ import annotations

import copy
import importlib.metadata
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from enginefoundry.build.sources import remove_stale_partials
from enginefoundry.errors import InputError, ToolError
from enginefoundry.identity import TOKENIZER_FILES, checkpoint_digests, list_files, sha256_json
from enginefoundry.settings import cache_root
from enginefoundry.smoke.prompts import PromptCase
from enginefoundry.smoke.reference import ReferenceOutcome, ReferenceSet, load_or_compute_reference
from enginefoundry.spec.checks import CALIBRATION_FREE, SIMULATED_DTYPE, SIMULATED_PRECISIONS
from enginefoundry.store.backends import Store

if TYPE_CHECKING:
    from torch import Tensor

# precision -> (ModelOpt config attribute, num_bits override, what it is); keys: spec.checks.SIMULATED_PRECISIONS
SIMULATED: dict[str, tuple[str, int | None, str]] = {
    "int4_awq": ("INT4_AWQ_CFG", None, "int4 weights, blocks of 128, AWQ (awq_lite) calibration"),
    "int4_wo": ("INT8_WEIGHT_ONLY_CFG", 4, "int4 weights per output channel, max calibration"),
    "int8_wo": ("INT8_WEIGHT_ONLY_CFG", None, "int8 weights per output channel, max calibration"),
}
FORMAT = 1  # of the folder this module writes
QUANTIZATION_COST = "quantization cost"  # the rule judging the simulation against the source (run_smoke)
CALIBRATION_TOKENS = 512  # each calibration prompt is cut here
# A weight-only max calibration needs no data: ModelOpt 0.47.0 calibrates every weight quantizer on the weight itself
# (model_calib.py `max_calibrate`: "Always run weight calibration on the weight tensor directly"; with no forward
# loop, `_run_and_load_max_stats` calls `weight_only_quantize`). CALIBRATION_FREE formats are quantized so, and their
# key holds no prompts: one simulation per source, whatever the prompt set.
NO_CALIBRATION_DATA = "none: max calibration of the weights"
MAX_RELATIVE_LOGIT_ERROR = 1e-3  # the written model against ModelOpt's own, on the first calibration prompt


class SimulatedKey(BaseModel):
    """Everything the simulated model depends on; its digest names the folder."""

    weights_digest: str
    tokenizer_digest: str
    precision: str
    config: str  # the ModelOpt config, as JSON
    calibration_digest: str
    modelopt: str
    torch: str
    format: int = FORMAT

    @property
    def digest(self) -> str:
        return sha256_json(self.model_dump())


class SimulatedModel(BaseModel):
    """A folder holding the simulated model (a plain Hugging Face checkpoint, fp32) and how it was made."""

    folder: Path
    key: SimulatedKey
    source: str  # "computed" or "local cache"
    description: str
    modules: int  # quantized linear layers folded
    awq_scaled: int  # of which AWQ pre-quant scaled
    seconds: float

    def label(self) -> str:
        return (f"ModelOpt {self.key.modelopt} simulated {self.key.precision} ({self.description}) of the source, "
                f"{self.key.digest[:12]} ({self.source})")


def modelopt_version() -> str | None:
    """The installed nvidia-modelopt, None where it is not installed."""
    try:
        return importlib.metadata.version("nvidia-modelopt")
    except importlib.metadata.PackageNotFoundError:
        return None


def can_simulate(precision: str) -> str | None:
    """None when `precision` can be simulated here, else why not (with the fix)."""
    if precision not in SIMULATED_PRECISIONS:
        return (f"{precision} is not simulated: ModelOpt's simulation of it quantizes activations too, which no "
                f"plain checkpoint carries (simulated: {', '.join(SIMULATED)})")
    if modelopt_version() is None:
        return "nvidia-modelopt is not installed: pip install 'enginefoundry[simulate]' (or nvidia-modelopt)"
    return None


def config_for(precision: str) -> dict[str, Any]:  # JSON edge: ModelOpt's quantization config
    import modelopt.torch.quantization as mtq

    name, bits, _ = SIMULATED[precision]
    cfg = copy.deepcopy(getattr(mtq, name))
    if bits is not None:  # 0.47.0's quant_cfg: a list of {"quantizer_name": pattern, "cfg": {...}} entries
        entries = [e for e in cfg["quant_cfg"]
                   if isinstance(e, dict) and e.get("quantizer_name") == "*weight_quantizer"]
        if len(entries) != 1 or "num_bits" not in entries[0].get("cfg", {}):
            raise ToolError(f"smoke: ModelOpt {modelopt_version()}'s {name} has no one '*weight_quantizer' entry "
                            "with num_bits (the layout of 0.47.0): cannot derive the int4 weight-only config")
        entries[0]["cfg"]["num_bits"] = bits
    return dict(cfg)


def simulated_key(source: Path, precision: str, calibration: list[PromptCase]) -> SimulatedKey:
    import torch

    w, t, _ = checkpoint_digests(source)
    return SimulatedKey(weights_digest=w, tokenizer_digest=t, precision=precision,
                        config=json.dumps(config_for(precision), default=str),
                        calibration_digest=(NO_CALIBRATION_DATA if precision in CALIBRATION_FREE else
                                            sha256_json([c.model_dump(mode="json") for c in calibration])),
                        modelopt=modelopt_version() or "absent", torch=torch.__version__)


def default_root() -> Path:
    return cache_root() / "simulated"


def simulate(source: Path, precision: str, calibration: list[PromptCase], *, root: Path | None = None,
             progress: Callable[[str], None] = print) -> SimulatedModel:
    """The simulated model of `source` quantized as `precision`, from the cache or computed (on the host CPU).

    Raises InputError when the precision cannot be simulated here (the reason and the fix), ToolError when the
    written model does not reproduce ModelOpt's (a quantizer this module does not fold)."""
    why = can_simulate(precision)
    if why is not None:
        raise InputError(f"smoke: no simulated reference for {precision}: {why}")
    if not calibration:
        raise InputError("smoke: a simulated reference needs prompts (calibration, and the check of the written "
                         "model); the prompt set is empty")
    key = simulated_key(source, precision, calibration)
    final = (root or default_root()) / key.digest
    meta = final / "simulated.json"
    if meta.is_file():
        done = SimulatedModel.model_validate_json(meta.read_text())
        return done.model_copy(update={"folder": final, "source": "local cache"})
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(final)  # a killed simulation's folder (its process gone): never read, only taking space
    tmp = final.with_name(f"{final.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        made = _compute(source, precision, calibration, key, tmp, progress)
        made.folder = final
        (tmp / "simulated.json").write_text(made.model_dump_json(indent=2))
        try:
            os.rename(tmp, final)  # whole or absent: a kill leaves only a .partial-<pid> folder, never read
        except OSError:
            if not meta.is_file():  # not someone else's finished copy
                raise
            shutil.rmtree(tmp, ignore_errors=True)
            return SimulatedModel.model_validate_json(meta.read_text()).model_copy(
                update={"folder": final, "source": "local cache"})
        return made
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def simulated_reference(source: Path, cases: list[PromptCase], precision: str, *, max_new_tokens: int,
                        store: Store | None, device: str = "cpu", weights_digest: str | None = None,
                        progress: Callable[[str], None] = print) -> tuple[ReferenceSet, ReferenceOutcome]:
    """The answers a `precision` unit is judged against: the simulated model's (simulated on the host CPU,
    calibrated on `cases`), greedy in SIMULATED_DTYPE on `device`; cached and published by key as any reference.
    The source's own SIMULATED_DTYPE answers (`weights_digest`: the source's, where the caller has it), which the
    `quantization cost` rule judges the simulation against, are computed here too: on a GPU before a server takes
    it."""
    sim = simulate(source, precision, cases, progress=progress)
    ref, outcome = load_or_compute_reference(sim.folder, cases, dtype=SIMULATED_DTYPE, max_new_tokens=max_new_tokens,
                                             store=store, progress=progress, device=device)
    load_or_compute_reference(source, cases, dtype=SIMULATED_DTYPE, max_new_tokens=max_new_tokens, store=store,
                              weights_digest=weights_digest, progress=progress, device=device)
    return ref, outcome.model_copy(update={"simulated": sim.label()})


def _compute(source: Path, precision: str, calibration: list[PromptCase], key: SimulatedKey, out: Path,
             progress: Callable[[str], None]) -> SimulatedModel:
    import modelopt.torch.quantization as mtq
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.monotonic()
    tok: Any = AutoTokenizer.from_pretrained(source)
    batches = [tok.apply_chat_template(c.chat(), add_generation_prompt=True, return_tensors="pt", return_dict=True,
                                       truncation=True, max_length=CALIBRATION_TOKENS)["input_ids"]
               for c in calibration]
    model: Any = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    model.eval()
    data_free = precision in CALIBRATION_FREE
    progress(f"smoke: simulating {precision} with ModelOpt {key.modelopt} ({SIMULATED[precision][2]}; "
             + ("the weights alone, no calibration data)" if data_free else f"{len(batches)} calibration prompts)"))

    def forward_loop(m: Any) -> None:
        with torch.no_grad():
            for i, ids in enumerate(batches, 1):
                m(ids)
                if i % 16 == 0:
                    progress(f"smoke: calibration {i}/{len(batches)} ({time.monotonic() - t0:.0f} s)")

    mtq.quantize(model, config_for(precision), None if data_free else forward_loop)
    with torch.no_grad():
        expected = model(batches[0]).logits
        folded, params = _fold(model)
    del model
    plain: Any = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    plain.eval()
    missing = set(folded) - set(plain.state_dict())
    if missing:
        raise ToolError(f"smoke: the simulated model names weights the source lacks: {sorted(missing)[:3]}")
    plain.load_state_dict(folded, strict=False)
    with torch.no_grad():
        got = plain(batches[0]).logits
    err = float((got - expected).abs().max() / expected.abs().max().clamp_min(1e-12))
    if err > MAX_RELATIVE_LOGIT_ERROR:
        raise ToolError(f"smoke: the written {precision} simulation does not reproduce ModelOpt's model (largest "
                        f"logit difference {err:.2e} of the largest logit > {MAX_RELATIVE_LOGIT_ERROR}): a "
                        "quantizer this module does not fold")
    plain.save_pretrained(out)
    for f in list_files(source):  # the source's own tokenizer bytes: the served unit's tokenizer digest matches
        if f.name in TOKENIZER_FILES and f.parent == source:
            shutil.copyfile(f, out / f.name)
    save_file({k: v.contiguous() for k, v in params.items()}, str(out / "quantizers.safetensors"))
    modules = sum(k.endswith(".amax") for k in params)
    awq = sum(k.endswith(".pre_quant_scale") for k in params)
    seconds = round(time.monotonic() - t0, 1)
    progress(f"smoke: {precision} simulation written ({modules} layers, {awq} AWQ-scaled; logits within "
             f"{err:.1e} of ModelOpt's; {seconds:.0f} s)")
    return SimulatedModel(folder=out, key=key, source="computed", description=SIMULATED[precision][2],
                          modules=modules, awq_scaled=awq, seconds=seconds)


def _fold(model: Any) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Each quantized linear's effective weight Q(W') · diag(s), and its quantizer parameters. Refuses a layer
    whose input quantizer is enabled (activations quantized: not a plain checkpoint)."""
    weights: dict[str, Tensor] = {}
    params: dict[str, Tensor] = {}
    for name, module in model.named_modules():
        wq = getattr(module, "weight_quantizer", None)
        if wq is None or not wq.is_enabled:
            continue
        iq = getattr(module, "input_quantizer", None)
        if iq is not None and iq.is_enabled:
            raise ToolError(f"smoke: {name} quantizes its input; a weight-only simulation cannot hold it")
        w = wq(module.weight.detach()).float()
        scale = getattr(iq, "pre_quant_scale", None) if iq is not None else None
        if scale is not None:
            w = w * scale.detach().float().reshape(1, -1)
            params[f"{name}.pre_quant_scale"] = scale.detach().float().reshape(-1).clone()
        if wq.amax is not None:
            params[f"{name}.amax"] = wq.amax.detach().float().clone()
        weights[f"{name}.weight"] = w.clone()
    if not weights:
        raise ToolError("smoke: ModelOpt quantized no linear layer of this model")
    return weights, params
