"""The quantization tool's simulated model: the reference a quantized unit is judged against, like with like.

A weight-only quantized build (int4_awq, int4_wo, int8_wo) serves the source model with its weights rounded to a
grid, scaled per group or channel; its answers drift from the fp32 source by the quantization itself, which says
nothing about whether the build is right. The simulated model is that quantization written into a plain copy of
the source (each quantized linear layer computes `(x · s) @ Q(W')ᵀ`, AWQ's pre-quant scale s on the input and none
for the others, the same as `x @ (Q(W') · diag(s))ᵀ`), served, referenced and spread like any model:

* int4_awq by NVIDIA ModelOpt, the tool the lanes quantize it with (quantize.py, hf_ptq.py): its fake quantization
  (`mtq.quantize`, INT4_AWQ_CFG: int4 weights in blocks of 128 along the input, awq_lite calibration on the prompts;
  nvidia-modelopt 0.47.0, modelopt/torch/quantization/config.py), folded and checked against ModelOpt's own logits
  (1e-3 relative); ModelOpt's amax and pre-quant scales kept beside it.
* int8_wo and int4_wo by TensorRT-LLM's own weight-only quantizer, which the engine lane's convert_checkpoint.py
  runs (not ModelOpt; sources at TRTLLM_WEIGHT_ONLY_BITS): from the weights alone, no calibration data; its stored
  per-channel scales kept beside it.

`simulate` writes one folder per key (source, format and its configuration, the calibration prompts where the
format reads any, the ModelOpt and torch versions) under the cache root, whole or not at all.

Not simulated: formats that quantize activations (fp8, nvfp4: the input quantizer changes every activation, which
no plain checkpoint carries; ModelOpt 0.47.0's NVFP4 fake quant also asserts CUDA tensors,
modelopt/torch/quantization/tensor_quant.py `_dynamic_block_quantize_impl`). Those keep the fp32 source or a
gated sibling as their reference.
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

from enginefoundry.catalog.precisions import PRECISIONS
from enginefoundry.errors import InputError, SourceError, ToolError
from enginefoundry.gpu.precisions import SHORT_DTYPE, activation_dtype
from enginefoundry.identity import TOKENIZER_FILES, checkpoint_digests, sha256_json
from enginefoundry.inputs.dequantize import simulate_activations
from enginefoundry.inputs.quantized_source import (
    DEQUANTIZED,
    MAX_QUANT_CONFIG_BYTES,
    SourceQuantization,
    read_json_bounded,
    read_quantization,
    write_dequantized,
)
from enginefoundry.inputs.sources import remove_stale_partials
from enginefoundry.settings import EnvSettings, cache_root
from enginefoundry.smoke.prompts import PromptCase
from enginefoundry.smoke.reference import (
    ReferenceAsk,
    ReferenceKey,
    ReferenceOutcome,
    ReferenceSet,
    ReferenceSettings,
    load_or_compute_reference,
)
from enginefoundry.spec import Precision
from enginefoundry.spec.checks import (
    BUILD_DTYPE_WORDS,
    CALIBRATION_FREE,
    SIMULATED_DTYPE,
    SIMULATED_PRECISIONS,
    simulated_why,
)
from enginefoundry.store.manifest import BuildInput

if TYPE_CHECKING:
    from torch import Tensor, nn
    from transformers import PreTrainedModel

# precision -> what simulates it; keys: spec.checks.SIMULATED_PRECISIONS. int4_awq is ModelOpt's (the lanes quantize
# it with ModelOpt: quantize.py, hf_ptq.py); int8_wo and int4_wo are TensorRT-LLM's own weight-only quantizer (the
# engine lane's convert_checkpoint.py --use_weight_only), written out below (trtllm_weight_only).
SIMULATED: dict[str, str] = {
    "int4_awq": "ModelOpt INT4_AWQ_CFG: int4 weights, blocks of 128, AWQ (awq_lite) calibration",
    "int4_wo": "TensorRT-LLM's weight-only int4: per output channel, step max/8, codes -8..7",
    "int8_wo": "TensorRT-LLM's weight-only int8: per output channel, step max/128, codes -128..127",
}
MODELOPT_CONFIGS = {"int4_awq": "INT4_AWQ_CFG"}  # precision -> ModelOpt config attribute
# TensorRT-LLM's weight-only quantization (convert_checkpoint.py --use_weight_only --weight_only_precision int8|int4):
# each decoder linear's weight, cast to the model dtype (tensorrt_llm/models/llama/convert.py@0afa06ab `get_weight`),
# goes through torch.ops.trtllm.symmetric_quantize_last_axis_of_batched_matrix (models/convert_utils.py
# `get_tllm_linear_weight`; lm_head and the embeddings are not quantized), whose kernel
# (cpp/tensorrt_llm/kernels/cutlass_kernels/cutlass_preprocessors.cpp@b35ac1b6 `symmetric_quantize`) takes each output
# channel's max |w| in float, steps of max / 2^(bits-1) (max/128, max/8: the full int range, so the largest weight
# clips to 127 or 7 steps), rounds half away from zero (C `round`), clips to [-2^(bits-1), 2^(bits-1) - 1], and
# stores the step in the model dtype: the engine multiplies the codes by that stored scale.
# The precisions TensorRT-LLM's own weight-only quantizer makes, by their weight bits (the catalog's columns).
TRTLLM_WEIGHT_ONLY_BITS = {p.value: row.weight_bits for p, row in PRECISIONS.items() if row.weight_only_precision}
FORMAT = 2  # of the folder this module writes (2: int8_wo and int4_wo are TensorRT-LLM's quantizer, not ModelOpt's)
QUANTIZATION_COST = "quantization cost"  # the rule judging the simulation against the source (run_smoke)
CALIBRATION_TOKENS = 512  # each calibration prompt is cut here
NO_CALIBRATION_DATA = "none: the weights alone"  # CALIBRATION_FREE formats: their key holds no prompts
MAX_RELATIVE_LOGIT_ERROR = 1e-3  # the written model against ModelOpt's own, on the first calibration prompt
TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


class SimulatedKey(BaseModel):
    """Everything the simulated model depends on; its digest names the folder."""

    weights_digest: str
    tokenizer_digest: str
    precision: str
    config: str  # the quantizer's configuration (ModelOpt's config; TensorRT-LLM's bits and scale dtype), as JSON
    calibration_digest: str
    modelopt: str
    torch: str
    format: int = FORMAT
    activations: str = ""  # "simulated": an FP8 or NVFP4 export's input quantization is computed (dequantize.py)

    @property
    def digest(self) -> str:  # `activations` only where set: every key made before it keeps its digest
        return sha256_json(self.model_dump(exclude=set() if self.activations else {"activations"}))


class SimulatedModel(BaseModel):
    """A folder holding the simulated (or dequantized) model, a plain Hugging Face checkpoint in fp32, and how it was
    made."""

    folder: Path
    key: SimulatedKey
    source: str  # "computed" or "local cache"
    description: str
    modules: int  # quantized linear layers written
    awq_scaled: int  # of which AWQ pre-quant scaled
    seconds: float

    def label(self) -> str:
        return (f"simulated {self.key.precision} ({self.description}) of the source, {self.key.digest[:12]} "
                f"({self.source})")


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
    if precision in MODELOPT_CONFIGS and modelopt_version() is None:
        return "nvidia-modelopt is not installed: pip install 'enginefoundry[simulate]' (or nvidia-modelopt)"
    return None


def simulated_dtype(source: Path, override: str | None = None) -> str:
    """The dtype a TensorRT-LLM weight-only build of `source` computes in, which its simulated reference is computed
    in: the lane's dtype option (`override`, a torch dtype name), else the checkpoint's 16-bit dtype, fp16 for an
    fp32 one (convert_checkpoint.py's dtype auto: gpu.precisions.activation_dtype); SIMULATED_DTYPE where the
    config.json names none."""
    from enginefoundry.inputs.model_shape import checkpoint_shape

    torch_name = activation_dtype(Precision.INT8_WO, checkpoint_shape(source), override)
    return SHORT_DTYPE.get(torch_name or "", SIMULATED_DTYPE)


def config_for(precision: str, dtype: str = SIMULATED_DTYPE) -> dict[str, Any]:  # JSON edge: the quantizer's config
    """ModelOpt's config for its formats; for TensorRT-LLM's weight-only quantizer, what defines it (its scales are
    stored in the build's compute `dtype`)."""
    if precision in TRTLLM_WEIGHT_ONLY_BITS:
        return {"quantizer": "tensorrt_llm symmetric_quantize_last_axis_of_batched_matrix",
                "bits": TRTLLM_WEIGHT_ONLY_BITS[precision], "scale_dtype": dtype,
                "modules": "every linear but the output embedding", "source": "cutlass_preprocessors.cpp@b35ac1b6"}
    import modelopt.torch.quantization as mtq

    return dict(copy.deepcopy(getattr(mtq, MODELOPT_CONFIGS[precision])))


def trtllm_weight_only(weight: Tensor, bits: int, dtype: str = SIMULATED_DTYPE) -> tuple[Tensor, Tensor]:
    """One [out, in] weight as TensorRT-LLM's weight-only engine holds it, dequantized: (codes × stored scale, the
    stored scale per output channel), both float32 (module comment above TRTLLM_WEIGHT_ONLY_BITS)."""
    import torch

    w = weight.detach().to(getattr(torch, TORCH_DTYPES[dtype])).float()
    step = w.abs().amax(dim=1, keepdim=True) / float(1 << (bits - 1))
    x = w / torch.where(step != 0, step, torch.ones_like(step))  # an all-zero channel stays zero
    codes = torch.round(x)  # half to even; C's round takes ties away from zero:
    ties = (x - torch.trunc(x)).abs() == 0.5
    codes = torch.where(ties, torch.trunc(x) + torch.sign(x), codes)
    codes = codes.clamp(-float(1 << (bits - 1)), float((1 << (bits - 1)) - 1))
    scale = step.to(getattr(torch, TORCH_DTYPES[dtype])).float()
    return codes * scale, scale.reshape(-1)


def simulated_key(source: Path, precision: str, calibration: list[PromptCase],
                  dtype: str | None = None) -> SimulatedKey:
    import torch

    dtype = dtype or simulated_dtype(source)
    w, t, _ = checkpoint_digests(source)
    return SimulatedKey(weights_digest=w, tokenizer_digest=t, precision=precision,
                        config=json.dumps(config_for(precision, dtype), default=str),
                        calibration_digest=(NO_CALIBRATION_DATA if precision in CALIBRATION_FREE else
                                            sha256_json([c.model_dump(mode="json") for c in calibration])),
                        modelopt=(modelopt_version() or "absent") if precision in MODELOPT_CONFIGS else "not used",
                        torch=torch.__version__)


def default_root() -> Path:
    """Where simulated (and dequantized) models are kept: under the reference cache the user chose
    (EF_REFERENCE_CACHE/simulated), else the cache root's (EF_CACHE_DIR, ~/.cache/enginefoundry: simulated/)."""
    chosen = EnvSettings.read().reference_cache
    return Path(chosen) / "simulated" if chosen else cache_root() / "simulated"


def simulate(source: Path, precision: str, calibration: list[PromptCase], *, root: Path | None = None,
             dtype: str | None = None, progress: Callable[[str], None] = print) -> SimulatedModel:
    """The simulated model of `source` quantized as `precision`, from the cache or computed (on the host CPU);
    `dtype`: the build's compute dtype (TensorRT-LLM's weight-only scales are stored in it; default
    simulated_dtype(source)).

    Raises InputError when the precision cannot be simulated here (the reason and the fix), ToolError when the
    written model does not reproduce ModelOpt's (a quantizer this module does not fold)."""
    why = can_simulate(precision)
    if why is not None:
        raise InputError(f"smoke: no simulated reference for {precision}: {why}")
    if not calibration:
        raise InputError("smoke: a simulated reference needs prompts (calibration, and the check of the written "
                         "model); the prompt set is empty")
    dtype = dtype or simulated_dtype(source)
    key = simulated_key(source, precision, calibration, dtype)
    return _materialize(key, root, lambda tmp: _compute(source, precision, calibration, key, tmp, dtype, progress))


# The folder's record of how it was made (its own path, the seconds it took): a hidden file, so the folder's
# weights digest (identity.list_files skips hidden entries), which keys the simulation's answers and is signed as an
# input, is the model's alone and the same on every worker.
MARKER = ".simulated.json"


def _materialize(key: SimulatedKey, root: Path | None,
                 compute: Callable[[Path], SimulatedModel]) -> SimulatedModel:
    """The folder of `key` under `root` (default_root()): found, or computed into `<key>.partial-<pid>` and renamed
    (whole or absent; a killed computation's folder is removed by the next one of that key)."""
    final = (root or default_root()) / key.digest
    meta = final / MARKER
    if meta.is_file():
        done = SimulatedModel.model_validate_json(meta.read_text())
        return done.model_copy(update={"folder": final, "source": "local cache"})
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(final)  # a killed simulation's folder (its process gone): never read, only taking space
    tmp = final.with_name(f"{final.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        made = compute(tmp)
        made.folder = final
        (tmp / MARKER).write_text(made.model_dump_json(indent=2))
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


# --- the lane's own quantized checkpoint, dequantized ------------------------------------------------------------
# Lane trtllm quantizes with ModelOpt's hf_ptq.py into a unified Hugging Face checkpoint: `hf_quant_config.json`
# beside safetensors whose quantized linears hold packed codes and scales. Dequantized, that checkpoint is exactly
# the quantization the engine serves (the lane's calibration data, and ModelOpt's export-time resmoothing of layers
# that share an input), where a simulation calibrated here would be another quantization (docs/smoke-gate.md 'AWQ
# calibrated elsewhere'). The layouts and their dequantization: enginefoundry/inputs/dequantize.py (one home, shared
# with the reference lane, which serves a pre-quantized source dequantized). FP8 and NVFP4 quantize each linear's
# input too: their dequantized reference carries that quantization beside the weights, and the reference's model
# computes it (dequantize.simulate_activations), unless the unit's lane serves the plain weights (the reference lane).
UNIFIED_QUANT_CONFIG = "hf_quant_config.json"


def _quant_config(checkpoint: Path) -> dict[str, Any] | None:  # JSON edge: hf_quant_config.json
    """The whole `hf_quant_config.json` of a ModelOpt unified checkpoint, None where `checkpoint` is not one."""
    path = checkpoint / UNIFIED_QUANT_CONFIG
    if not path.is_file():
        return None
    try:  # bounded: the checkpoint's files are input (build.quantized_source.read_json_bounded)
        cfg = read_json_bounded(path, MAX_QUANT_CONFIG_BYTES, "smoke")
        if cfg is None or not isinstance(_block(cfg), dict):
            raise TypeError("no quantization block")
    except (SourceError, TypeError) as err:
        raise ToolError(f"smoke: {path} is not a ModelOpt quantization config ({err})") from None
    return cfg


def _block(cfg: dict[str, Any]) -> Any:  # JSON edge: hf_quant_config.json
    """Its `quantization` block (older exports keep those keys at the top, as lanes/trtllm.py reads them)."""
    return cfg.get("quantization", cfg)


def exported_quant_algo(checkpoint: Path) -> str | None:
    """The quant_algo of a ModelOpt unified checkpoint, None where `checkpoint` is not one."""
    cfg = _quant_config(checkpoint)
    algo = _block(cfg).get("quant_algo") if cfg is not None else None
    return str(algo) if algo is not None else None


def export_problem(checkpoint: Path) -> str | None:
    """None when `checkpoint` is a unified export this module dequantizes whole, else why not: another
    quantization, or a quantized KV cache (the engine quantizes every key and value; no plain checkpoint does)."""
    return _problem(_quant_config(checkpoint))


def _problem(cfg: dict[str, Any] | None) -> str | None:  # JSON edge: hf_quant_config.json
    if cfg is None:
        return f"not a ModelOpt unified checkpoint (no {UNIFIED_QUANT_CONFIG})"
    quant = _block(cfg)
    if quant.get("quant_algo") not in DEQUANTIZED:
        return f"quant_algo {quant.get('quant_algo')} (dequantized here: {', '.join(sorted(DEQUANTIZED))})"
    if quant.get("kv_cache_quant_algo"):
        return f"its KV cache is quantized ({quant['kv_cache_quant_algo']}), which no plain checkpoint carries"
    return None


def dequantized_checkpoint(checkpoint: Path, *, tokenizer_from: Path, root: Path | None = None,
                           progress: Callable[[str], None] = print,
                           what: str = "the lane's checkpoint", activations: bool = True) -> SimulatedModel:
    """The lane's exported checkpoint as a plain float32 checkpoint (cached by the checkpoint's digest; its
    tokenizer files, else `tokenizer_from`'s); an FP8 or NVFP4 one with its input quantization beside it where
    `activations` (the unit's server computes it: every lane but the reference lane). Raises InputError for a
    quantization this module does not read."""
    config = _quant_config(checkpoint)  # read once: the problem, the key and the group size come from it
    problem = _problem(config)
    quant = read_quantization(checkpoint, "smoke") if problem is None else None
    if config is None or quant is None:
        raise InputError(f"smoke: {checkpoint} is not dequantized: {problem}")
    import torch

    w, t, _ = checkpoint_digests(checkpoint)
    producer = config.get("producer", {})
    acts = activations and quant.quantizes_activations
    key = SimulatedKey(weights_digest=w, tokenizer_digest=t, precision=quant.precision.value,
                       config=json.dumps(config, sort_keys=True), calibration_digest="the lane's (in the checkpoint)",
                       modelopt=f"{producer.get('name', '?')} {producer.get('version', '?')} (export)",
                       torch=torch.__version__, activations="simulated" if acts else "")
    return _materialize(key, root, lambda tmp: _dequantize(checkpoint, tokenizer_from, quant, key, tmp, progress,
                                                            what, acts))


def _dequantize(checkpoint: Path, tokenizer_from: Path, quant: SourceQuantization, key: SimulatedKey, out: Path,
                progress: Callable[[str], None], what: str, activations: bool) -> SimulatedModel:
    from transformers import AutoModelForCausalLM

    t0 = time.monotonic()
    done = write_dequantized(checkpoint, quant, out, torch_dtype="float32", copy_files=_copy_top_level,
                             activations=activations)
    if not any(f.name in TOKENIZER_FILES for f in out.iterdir()):  # its tokenizer files, else the source's
        _copy_top_level(tokenizer_from, out, set(TOKENIZER_FILES))
    loaded: Any = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    info = loaded[1]
    wrong = [*info.get("missing_keys", []), *info.get("unexpected_keys", [])]
    if wrong:
        raise ToolError(f"smoke: the dequantized checkpoint does not load as its model: {sorted(wrong)[:3]}")
    simulated_inputs = simulate_activations(loaded[0], out)  # checks the scales name this model's linears
    seconds = round(time.monotonic() - t0, 1)
    inputs = (f"; the inputs of {simulated_inputs} quantized as the engine does" if simulated_inputs else
              "; inputs not quantized (the unit's server computes the plain weights)"
              if quant.quantizes_activations else "")
    progress(f"smoke: {what} ({quant.precision.value}) dequantized ({done.layers} layers{inputs}; {seconds:.0f} s)")
    return SimulatedModel(folder=out, key=key, source="computed",
                          description=f"{what} ({key.modelopt}), dequantized" + (
                              ", its inputs quantized as the engine does" if simulated_inputs else ""),
                          modules=done.layers, awq_scaled=done.awq_scaled, seconds=seconds)


FROM_EXPORT_WHY = (f"the lane's own quantized checkpoint (ModelOpt's unified export), dequantized, computed in "
                   f"{BUILD_DTYPE_WORDS} (like with like: its calibration, scales and export-time resmoothing are the "
                   "build's; the policy of its compute dtype)")


PREQUANTIZED_WHY = (f"the pre-quantized source's own checkpoint (ModelOpt's unified export), dequantized, computed in "
                    f"{BUILD_DTYPE_WORDS} (like with like: the unit serves that checkpoint, never quantized again)")


def simulated_reference(source: Path, precision: str, ask: ReferenceAsk, settings: ReferenceSettings, *,
                        weights_digest: str | None = None, checkpoint: Path | None = None, dtype: str | None = None,
                        original: Path | None = None) -> tuple[ReferenceSet, ReferenceOutcome]:
    """The answers a `precision` unit is judged against: the simulated model's (simulated on the host CPU,
    calibrated on `ask.cases`; with `checkpoint`, the lane's exported checkpoint dequantized instead), greedy in
    `dtype` (the build's compute dtype; default simulated_dtype(source)) on `ask.device`; cached and published by
    key as any reference. The source's own answers in that dtype (`weights_digest`: the source's, where the caller
    has it), which the `quantization cost` rule judges the simulation against, are computed here too: on a GPU
    before a server takes it. `settings.trust` (evidence/inputs.py): which answers from the store may be used; the
    simulated model (a folder of this host's cache, never read from the store) is recorded in it by its weights
    digest, which also keys its answers. A pre-quantized `source` (build.quantized_source) is itself the checkpoint
    dequantized (`checkpoint` is `source`); the answers of the quantization-cost rule are the unquantized
    `original`'s where one is given (none otherwise: transformers does not run a ModelOpt export). An FP8 or NVFP4
    checkpoint's inputs are quantized as its engine quantizes them where `ask.quantized_inputs`."""
    cases, progress, trust = ask.cases, settings.progress, settings.trust
    dtype = dtype or simulated_dtype(source)
    prequantized = read_quantization(source) is not None
    if checkpoint is not None:
        what = "the pre-quantized source" if prequantized else "the lane's checkpoint"
        sim, why = (dequantized_checkpoint(checkpoint, tokenizer_from=source, progress=progress, what=what,
                                           activations=ask.quantized_inputs),
                    PREQUANTIZED_WHY if prequantized else FROM_EXPORT_WHY)
    else:
        sim, why = simulate(source, precision, cases, dtype=dtype, progress=progress), simulated_why(precision)
    ref, outcome = load_or_compute_reference(sim.folder, ask, settings, dtype=dtype)
    if trust is not None and isinstance(ref.key, ReferenceKey):
        trust.record(BuildInput(kind="simulation", key=sim.key.digest, uri=str(sim.folder),
                                sha256=ref.key.weights_digest, origin="computed" if sim.source == "computed"
                                else "local cache"))
    answers_of = original if prequantized else source
    if answers_of is not None:
        load_or_compute_reference(answers_of, ask, settings, dtype=dtype,
                                  weights_digest=None if prequantized else weights_digest)
    return ref, outcome.model_copy(update={"simulated": sim.label(), "simulated_why": why})


def _compute(source: Path, precision: str, calibration: list[PromptCase], key: SimulatedKey, out: Path, dtype: str,
             progress: Callable[[str], None]) -> SimulatedModel:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    t0 = time.monotonic()
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    model.train(False)  # eval(): transformers leaves PreTrainedModel.eval unannotated
    progress(f"smoke: simulating {precision} ({SIMULATED[precision]}"
             + ("; the weights alone)" if precision in TRTLLM_WEIGHT_ONLY_BITS else
                f"; ModelOpt {key.modelopt}, {len(calibration)} calibration prompts)"))
    if precision in TRTLLM_WEIGHT_ONLY_BITS:
        params, err = _trtllm_weight_only_in_place(model, TRTLLM_WEIGHT_ONLY_BITS[precision], dtype), None
        check = "codes and scales checked"
    else:
        model, params, err = _modelopt(model, source, precision, calibration, progress, t0)
        check = f"logits within {err:.1e} of ModelOpt's"
    model.save_pretrained(out)
    _copy_top_level(source, out, set(TOKENIZER_FILES))  # the source's own tokenizer bytes: the digests match
    save_file({k: v.contiguous() for k, v in params.items()}, str(out / "quantizers.safetensors"))
    modules = sum(k.endswith((".amax", ".per_channel_scale")) for k in params)
    awq = sum(k.endswith(".pre_quant_scale") for k in params)
    seconds = round(time.monotonic() - t0, 1)
    progress(f"smoke: {precision} simulation written ({modules} layers, {awq} AWQ-scaled; {check}; {seconds:.0f} s)")
    return SimulatedModel(folder=out, key=key, source="computed", description=SIMULATED[precision],
                          modules=modules, awq_scaled=awq, seconds=seconds)


def _copy_top_level(folder: Path, out: Path, names: set[str]) -> int:
    """The files of `folder` (not its subfolders) named in `names`, copied byte for byte into `out`; how many."""
    copied = [f for f in folder.iterdir() if f.is_file() and f.name in names]
    for f in copied:
        shutil.copyfile(f, out / f.name)
    return len(copied)


def _trtllm_weight_only_in_place(model: Any, bits: int, dtype: str) -> dict[str, Tensor]:
    """Every linear but the output embedding replaced by TensorRT-LLM's weight-only quantization of it (the codes
    times the stored scale); returns each layer's stored scale. Checked: every row holds at most 2^bits codes."""
    import torch

    head = model.get_output_embeddings()
    scales: dict[str, Tensor] = {}
    with torch.no_grad():
        for name, module in model.named_modules():
            if not isinstance(module, torch.nn.Linear) or module is head:
                continue
            w_eff, scale = trtllm_weight_only(module.weight, bits, dtype)
            codes = w_eff / torch.where(scale == 0, torch.ones_like(scale), scale).reshape(-1, 1)
            if not torch.equal(codes, codes.round()) or codes.abs().max() > (1 << (bits - 1)):
                raise ToolError(f"smoke: {name}: the simulated int{bits} weights are not whole codes of the scale")
            module.weight.copy_(w_eff)
            scales[f"{name}.per_channel_scale"] = scale.clone()
    if not scales:
        raise ToolError("smoke: the model has no linear layer to quantize")
    return scales


def _modelopt(model: PreTrainedModel, source: Path, precision: str, calibration: list[PromptCase],
              progress: Callable[[str], None], t0: float) -> tuple[PreTrainedModel, dict[str, Tensor], float]:
    """ModelOpt's fake quantization of `model`, calibrated on the prompts, folded into a plain copy of the source and
    checked against ModelOpt's own logits: (the plain model, ModelOpt's per-layer parameters, the relative error)."""
    import modelopt.torch.quantization as mtq
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok: Any = AutoTokenizer.from_pretrained(source)
    batches = [tok.apply_chat_template(c.chat(), add_generation_prompt=True, return_tensors="pt", return_dict=True,
                                       truncation=True, max_length=CALIBRATION_TOKENS)["input_ids"]
               for c in calibration]

    def forward_loop(m: nn.Module) -> None:
        with torch.no_grad():
            for i, ids in enumerate(batches, 1):
                m(ids)
                if i % 16 == 0:
                    progress(f"smoke: calibration {i}/{len(batches)} ({time.monotonic() - t0:.0f} s)")

    mtq.quantize(model, config_for(precision), forward_loop)
    with torch.no_grad():
        expected = model(batches[0]).logits
        folded, params = _fold(model)
    del model
    plain: PreTrainedModel = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    plain.train(False)  # eval(): transformers leaves PreTrainedModel.eval unannotated
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
    return plain, params, err


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
