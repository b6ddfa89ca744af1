"""A source checkpoint that is already quantized (issue 36 item 5): its quantization, read from its own files.

NVIDIA publishes ModelOpt exports on the Hub (`*-FP8`, `*-NVFP4`), and a team's own PTQ job writes the same unified
Hugging Face checkpoint (modelopt/torch/export/unified_export_hf.py, nvidia-modelopt 0.47.0): `hf_quant_config.json`
(`{"producer": {"name": "modelopt", "version": …}, "quantization": {"quant_algo": "W4A16_AWQ",
"kv_cache_quant_algo": null, "group_size": 128, "exclude_modules": […]}}`; older exports keep those keys at the
top) and the same algorithm inline in config.json (`quantization_config: {"quant_method": "modelopt", "quant_algo":
…, "kv_cache_scheme": …, "ignore": […]}`, modelopt/torch/export/convert_hf_config.py
`convert_hf_quant_config_format`). TensorRT-LLM's PyTorch backend reads both (tensorrt_llm/_torch/model_config.py
@008e0af8 `ModelConfig.from_pretrained`: `hf_quant_config.json` first, "the file is authoritative"; an inline
ModelOpt `quantization_config` through `load_hf_quant_config` → `is_modelopt_quant_config`).

Such a source is never quantized again: its precision is the checkpoint's (`ALGO_PRECISION`), a spec variant that
contradicts it is refused before any work (`precision_problems`), and the unit key records the quantization
(`SourceQuantization.key_json`). Its files are hostile input: each is read bounded (a regular file of at most
MAX_QUANT_CONFIG_BYTES, nesting at most MAX_DEPTH levels) into a typed model; an algorithm without a precision here
is refused with the field and the fix.

The formats this project dequantizes on any device (`DEQUANTIZED`: W4A16_AWQ, FP8, NVFP4; inputs/dequantize.py) are
written out here as plain checkpoints: the reference lane serves such a source dequantized, and the smoke gate's
like-with-like reference is the same checkpoint dequantized, FP8 and NVFP4 with their input quantization simulated
(enginefoundry/smoke/simulated.py `dequantized_checkpoint`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from enginefoundry.catalog.precisions import PRECISIONS
from enginefoundry.errors import SourceError, SpecError, ToolError
from enginefoundry.inputs.dequantize import ACTIVATION_QUANTIZED, Dequantized, dequantize, write_activations
from enginefoundry.inputs.model_config import MAX_CONFIG_BYTES
from enginefoundry.schemas.loose import HfModelConfig
from enginefoundry.spec import BuildSpec, Precision, SourceKind

if TYPE_CHECKING:
    from torch import Tensor

QUANT_CONFIG = "hf_quant_config.json"
MODEL_CONFIG = "config.json"
INLINE = "config.json quantization_config"
MAX_QUANT_CONFIG_BYTES = 1 << 20  # a real hf_quant_config.json is under 100 KiB (MIXED_PRECISION lists every layer)
MAX_DEPTH = 16  # a ModelOpt config nests 3 levels (quantization → quantized_layers → layer)
MODELOPT_METHOD = "modelopt"  # config.json quantization_config.quant_method of a ModelOpt export

# ModelOpt's quant_algo (modelopt/torch/export/quant_utils.py `process_layer_quant_config`, nvidia-modelopt 0.47.0)
# → the precision this project names: the catalog's `modelopt_quant_algo` column. Every other algorithm
# (FP8_PER_CHANNEL_PER_TOKEN, W4A8_AWQ, W8A8_SQ_PER_CHANNEL, W4A16_NVFP4, NVFP4_AWQ, W4A8_NVFP4_FP8, W4A8_MXFP4_FP8,
# NVFP4_SVD, MXFP8, MIXED_PRECISION …) has no precision here and is refused.
ALGO_PRECISION: dict[str, Precision] = dict(sorted(  # by name: the compat page lists them in this order
    (row.modelopt_quant_algo, p) for p, row in PRECISIONS.items() if row.modelopt_quant_algo))
# The algorithms whose checkpoint this project dequantizes into plain weights (the reference lane's build, the
# gate's reference; inputs/dequantize.py): W4A16_AWQ is weight-only, so the dequantized checkpoint computes what the
# quantized one does; FP8 and NVFP4 quantize each linear's input too, which the gate's reference simulates.
DEQUANTIZED = frozenset({"W4A16_AWQ", "FP8", "NVFP4"})


class SourceQuantization(BaseModel):
    """A pre-quantized source's quantization, as its own files say."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    file: str  # QUANT_CONFIG or INLINE: where it was read
    producer: str  # "modelopt 0.47.0"
    quant_algo: str
    precision: Precision
    kv_cache_quant_algo: str | None = None
    group_size: int | None = None

    def key_json(self) -> dict[str, Any]:  # JSON edge: the unit key's `source_quantization`
        return self.model_dump(mode="json")

    @property
    def dequantizable(self) -> bool:
        """The checkpoint dequantizes into plain weights (DEQUANTIZED), without a quantized KV cache (no plain
        checkpoint quantizes every key and value)."""
        return self.quant_algo in DEQUANTIZED and not self.kv_cache_quant_algo

    @property
    def quantizes_activations(self) -> bool:
        """An engine of it quantizes each linear's input too (FP8, NVFP4), which its plain weights do not carry."""
        return self.quant_algo in ACTIVATION_QUANTIZED

    def label(self) -> str:
        kv = f", KV {self.kv_cache_quant_algo}" if self.kv_cache_quant_algo else ""
        return f"{self.quant_algo} ({self.precision.value}{kv}; {self.file}, {self.producer})"


def _depth(value: object) -> int:
    """Nesting depth of parsed JSON, without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            todo.extend((v, level + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def read_json_bounded(path: Path, limit: int, where: str) -> HfModelConfig | None:
    """The JSON object in `path`, None where there is no such file. SourceError (naming `where` and the fix) for
    what no checkpoint holds: not a regular file, more than `limit` bytes, not a JSON object, deeper than
    MAX_DEPTH."""
    if not path.exists() and not path.is_symlink():
        return None
    try:
        if not path.is_file():
            raise SourceError(f"{where}: {path.name} is not a regular file; replace it with the exporter's file")
        size = path.stat().st_size
        if size > limit:
            raise SourceError(f"{where}: {path.name} is {size} bytes, more than any checkpoint's ({limit}); "
                              "replace it with the exporter's file")
        with path.open("rb") as f:
            data = json.loads(f.read(limit + 1))
    except (OSError, ValueError, RecursionError) as err:
        raise SourceError(f"{where}: {path.name} is not readable JSON ({type(err).__name__}); replace it with the "
                          "exporter's file") from None
    if not isinstance(data, dict):
        raise SourceError(f"{where}: {path.name} is not a JSON object; replace it with the exporter's file")
    if _depth(data) > MAX_DEPTH:
        raise SourceError(f"{where}: {path.name} nests deeper than {MAX_DEPTH} levels, which no quantization config "
                          "does; replace it with the exporter's file")
    return data


def _text(value: object, limit: int = 200) -> str | None:
    return value[:limit] if isinstance(value, str) and value else None


def quantization_from(hf_quant: HfModelConfig | None, config: HfModelConfig | None,
                      where: str = "model.source") -> SourceQuantization | None:
    """The quantization `hf_quant_config.json` (`hf_quant`) or config.json's `quantization_config` describes; None
    for an unquantized checkpoint. SourceError for a quantization without a precision here (the field, the fix)."""
    inline = config.get("quantization_config") if config else None
    if hf_quant is not None:
        block = hf_quant.get("quantization", hf_quant)
        if not isinstance(block, dict):
            raise SourceError(f"{where}: {QUANT_CONFIG} `quantization` is not an object; replace it with the "
                              "exporter's file")
        producer = hf_quant.get("producer")
        file, algo, kv, group = QUANT_CONFIG, block.get("quant_algo"), block.get("kv_cache_quant_algo"), \
            block.get("group_size")
    elif inline is not None:
        if not isinstance(inline, dict):
            raise SourceError(f"{where}: {INLINE} is not an object; replace it with the exporter's config.json")
        method = inline.get("quant_method")
        if method != MODELOPT_METHOD:
            raise SourceError(
                f"{where}: {INLINE}.quant_method is {_text(method) or repr(method)}, not a ModelOpt export "
                f"(quant_method {MODELOPT_METHOD}, or {QUANT_CONFIG}): enginefoundry reads ModelOpt's unified "
                "checkpoint only; export it with ModelOpt (hf_ptq.py), or point model.source at the unquantized "
                "checkpoint and let the lane quantize it (variants[].precision)")
        producer = inline.get("producer")
        kv_scheme = inline.get("kv_cache_scheme")
        file, algo, group = INLINE, inline.get("quant_algo"), None
        kv = kv_scheme if isinstance(kv_scheme, str) or kv_scheme is None else "set"
    else:
        return None
    name = _text(producer.get("name")) if isinstance(producer, dict) else None
    version = _text(producer.get("version")) if isinstance(producer, dict) else None
    known = ", ".join(f"{a} ({p.value})" for a, p in ALGO_PRECISION.items())
    field = f"{file}{'.quantization' if file == QUANT_CONFIG and hf_quant and 'quantization' in hf_quant else ''}"
    if not isinstance(algo, str) or algo not in ALGO_PRECISION:
        shown = _text(algo) or ("none" if algo is None else "not a name")
        raise SourceError(
            f"{where}: {field}.quant_algo is {shown}: a quantization enginefoundry has no precision for (it reads "
            f"{known}); export the checkpoint as one of those, or point model.source at the unquantized checkpoint "
            "and set variants[].precision")
    if kv is not None and not isinstance(kv, str):
        raise SourceError(f"{where}: {field}.kv_cache_quant_algo is not a name; replace it with the exporter's file")
    if group is not None and (not isinstance(group, int) or isinstance(group, bool) or not 0 < group <= 1 << 16):
        raise SourceError(f"{where}: {field}.group_size {group!r} is not a block size; replace it with the "
                          "exporter's file")
    return SourceQuantization(file=file, producer=f"{name or '?'} {version or '?'}", quant_algo=algo,
                              precision=ALGO_PRECISION[algo], kv_cache_quant_algo=_text(kv), group_size=group)


def read_quantization(folder: Path, where: str = "model.source") -> SourceQuantization | None:
    """The quantization of the checkpoint in `folder` (its hf_quant_config.json, else config.json's
    quantization_config), None for an unquantized one; SourceError as `quantization_from`."""
    return quantization_from(read_json_bounded(folder / QUANT_CONFIG, MAX_QUANT_CONFIG_BYTES, where),
                             read_json_bounded(folder / MODEL_CONFIG, MAX_CONFIG_BYTES, where), where)


class QuantizationLookup(BaseModel):
    """What is known of the spec's source quantization without a download of weights."""

    known: bool  # False: no config file of the source is here yet (an S3 source; a Hub source not in the cache)
    quantization: SourceQuantization | None = None
    source: str = ""  # where it was read


def lookup_quantization(spec: BuildSpec) -> QuantizationLookup:
    """The spec's source quantization from files here: a local source's own, a Hub source's in the Hugging Face
    cache at the pinned revision. SourceError for a quantization this project does not read."""
    src = spec.model.parsed_source(spec.base_path)
    if src.kind is SourceKind.LOCAL:
        folder = Path(src.location)
        if not (folder / MODEL_CONFIG).is_file():
            return QuantizationLookup(known=False)
        return QuantizationLookup(known=True, quantization=read_quantization(folder), source=str(folder))
    if src.kind is SourceKind.HF:
        from huggingface_hub import try_to_load_from_cache

        rev = src.revision or "main"
        config = try_to_load_from_cache(src.location, MODEL_CONFIG, revision=rev)
        if not isinstance(config, str):
            return QuantizationLookup(known=False)
        quant = try_to_load_from_cache(src.location, QUANT_CONFIG, revision=rev)
        # A cached "no such file" (huggingface_hub's _CACHED_NO_EXIST) is not a str: the export has none.
        hf_quant = read_json_bounded(Path(quant), MAX_QUANT_CONFIG_BYTES, "model.source") if isinstance(
            quant, str) else None
        found = quantization_from(hf_quant, read_json_bounded(Path(config), MAX_CONFIG_BYTES, "model.source"))
        return QuantizationLookup(known=True, quantization=found, source=f"{src.location}@{rev} (Hugging Face cache)")
    return QuantizationLookup(known=False)


def precision_problems(spec: BuildSpec, quant: SourceQuantization | None) -> list[tuple[str, str]]:
    """Every variant whose precision contradicts the source's own quantization, as (field, message with the fix)."""
    if quant is None:
        return []
    return [(f"variants.{i}.precision",
             f"{v.precision.value} contradicts the source's quantization: its {quant.file} says quant_algo "
             f"{quant.quant_algo} ({quant.precision.value}), and a pre-quantized checkpoint is served as it is, never "
             f"quantized again; set variants.{i}.precision: {quant.precision.value}, or point model.source at the "
             "unquantized checkpoint")
            for i, v in enumerate(spec.variants) if v.precision is not quant.precision]


def refuse_contradiction(spec: BuildSpec, quant: SourceQuantization | None) -> None:
    """SpecError naming every problem of `quantization_problems` (the fetch calls it once the config files are here,
    before the weights)."""
    problems = quantization_problems(spec, quant)
    if problems:
        raise SpecError(problems, spec.name)


def spec_quantization_problems(spec: BuildSpec) -> list[tuple[str, str]]:
    """What `validate`, `plan` and `run` refuse before any download: a source quantization this project does not
    read (`model.source`), a variant precision that contradicts it."""
    try:
        found = lookup_quantization(spec)
    except SourceError as err:
        return [("model.source", str(err).removeprefix("model.source: "))]
    problems = quantization_problems(spec, found.quantization)
    return problems + unquantized_problems(spec, found)


def unquantized_problems(spec: BuildSpec, found: QuantizationLookup) -> list[tuple[str, str]]:
    """`model.unquantized` where the source is known not to be pre-quantized, or names a quantized checkpoint (a
    local one, read here)."""
    original = spec.model.parsed_unquantized(spec.base_path)
    if original is None:
        return []
    if found.known and found.quantization is None:
        return [("model.unquantized", "the source is not pre-quantized (no hf_quant_config.json, no ModelOpt "
                                      "quantization_config): the lane quantizes it and the gate judges the cost "
                                      "itself; remove model.unquantized")]
    if original.kind is SourceKind.LOCAL and (Path(original.location) / MODEL_CONFIG).is_file():
        try:
            quant = read_quantization(Path(original.location), "model.unquantized")
        except SourceError as err:
            return [("model.unquantized", str(err).removeprefix("model.unquantized: "))]
        if quant is not None:
            return [("model.unquantized", f"{original.location} is quantized too ({quant.label()}); point it at the "
                                          "unquantized checkpoint the export was made from")]
    return []


def quantization_problems(spec: BuildSpec, quant: SourceQuantization | None) -> list[tuple[str, str]]:
    """What a source of quantization `quant` cannot be built from: a variant precision that contradicts it, a
    quantization the smoke gate has no reference for (it judges a pre-quantized source against the checkpoint
    dequantized)."""
    problems = precision_problems(spec, quant)
    if quant is not None and not quant.dequantizable:
        problems.append(("model.source", (
            f"the source is pre-quantized ({quant.label()}), and the smoke gate has no reference for it: it judges a "
            f"pre-quantized source against the checkpoint dequantized, which it does for "
            f"{', '.join(sorted(DEQUANTIZED))} exports without a quantized KV cache; use such an export, or point "
            "model.source at the unquantized checkpoint and let the lane quantize it")))
    return problems


def spec_quantization(spec: BuildSpec) -> SourceQuantization | None:
    """The source quantization known here without a download (None: unquantized, or not known yet)."""
    try:
        return lookup_quantization(spec).quantization
    except SourceError:
        return None


def write_dequantized(checkpoint: Path, quant: SourceQuantization, out: Path, *, torch_dtype: str,
                      copy_files: Callable[[Path, Path, set[str]], int], activations: bool) -> Dequantized:
    """`checkpoint` (an export of a DEQUANTIZED format) as a plain Hugging Face checkpoint in `out`, its weights in
    `torch_dtype`: config.json without its quantization_config, model.safetensors, generation_config.json and the
    tokenizer files copied by `copy_files(src, dst, names)`. With `activations`, an FP8 or NVFP4 export's input
    quantization is written beside them (inputs/dequantize.py ACTIVATIONS_FILE: the smoke reference computes it);
    without, the checkpoint computes unquantized inputs (what a server of plain weights computes). Returns what was
    dequantized."""
    import torch
    from safetensors.torch import load_file, save_file

    from enginefoundry.identity import TOKENIZER_FILES

    if not quant.dequantizable:
        raise ToolError(f"{checkpoint}: {quant.label()} is not dequantized here (dequantized: "
                        f"{', '.join(sorted(DEQUANTIZED))}, without a quantized KV cache)")
    tensors: dict[str, Tensor] = {}
    for f in sorted(checkpoint.glob("*.safetensors")):
        tensors.update(load_file(f))
    plain, done = dequantize(tensors, quant.quant_algo, quant.group_size)
    if not done.layers:
        raise ToolError(f"{checkpoint} has no quantized weight to dequantize ({quant.label()})")
    config = read_json_bounded(checkpoint / MODEL_CONFIG, MAX_CONFIG_BYTES, str(checkpoint)) or {}
    config.pop("quantization_config", None)
    config["dtype"] = config["torch_dtype"] = torch_dtype
    out.mkdir(parents=True, exist_ok=True)
    (out / MODEL_CONFIG).write_text(json.dumps(config, indent=2))
    dtype = getattr(torch, torch_dtype)
    save_file({k: v.to(dtype).contiguous() for k, v in plain.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    if activations and done.activations is not None:
        write_activations(out, done.activations)
    copy_files(checkpoint, out, {"generation_config.json", *TOKENIZER_FILES})
    return done
