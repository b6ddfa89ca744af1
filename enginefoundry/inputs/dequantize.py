"""A ModelOpt export's weights as plain weights, and its activation quantization as forward hooks (issue 36 item 5).

Three layouts of ModelOpt's unified Hugging Face checkpoint (nvidia-modelopt 0.47.0,
modelopt/torch/export/unified_export_hf.py; checked against exports made here with the `simulate` extra):

* W4A16_AWQ: `<linear>.weight` uint8 [out/2, in], two signed 4-bit codes a byte (output rows 2j in the low nibble,
  2j+1 in the high one; quant_utils.py `pack_int4_in_uint8`), `<linear>.weight_scale` [out, in/group],
  `<linear>.pre_quant_scale` [in] (AWQ's scale on the input). Weight-only: the dequantized checkpoint computes what
  the quantized one does.
* FP8 (per tensor): `<linear>.weight` float8_e4m3fn [out, in], `<linear>.weight_scale` and `<linear>.input_scale`
  float32 scalars (quant_utils.py `get_weight_scaling_factor`, `get_activation_scaling_factor`: amax / 448). The
  engine quantizes each input with the static `input_scale` (clamp(x / s) to e4m3, times s).
* NVFP4: `<linear>.weight` uint8 [out, in/2], two e2m1 codes a byte (input element 2k in the low nibble, 2k+1 in the
  high one; qtensor/nvfp4_tensor.py `NVFP4QTensor.quantize`, `e2m1_values`), `<linear>.weight_scale`
  float8_e4m3fn [out, in/16] (one per block of 16 inputs), `<linear>.weight_scale_2` and `<linear>.input_scale`
  float32 scalars (the global scales: amax / (6 · 448)). The engine quantizes each input dynamically, per block of
  16: a block scale rounded to e4m3 from the block's amax / 6 over the global scale, the values rounded to e2m1.

The activation quantization of FP8 and NVFP4 is what no plain checkpoint carries: `write_activations` writes it
beside the dequantized weights (ACTIVATIONS_FILE: each quantized linear's input scale), and `install` puts it back as
a forward pre-hook on each of those linears of a loaded model (the smoke reference's transformers model), so that the
reference computes what an FP8 or NVFP4 engine computes: quantized weights and quantized inputs, 32-bit arithmetic.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from enginefoundry.errors import ToolError

if TYPE_CHECKING:
    from torch import Tensor, nn

# quant_algo → what its activations are: the formats whose inputs an engine quantizes.
ACTIVATION_QUANTIZED = frozenset({"FP8", "NVFP4"})
ACTIVATIONS_FILE = "activation_quantization.json"  # beside a dequantized checkpoint's weights
MAX_ACTIVATIONS_BYTES = 4 << 20  # one scale per linear: a 1,000-layer model is ~150 KiB
E4M3_MAX = 448.0  # float8_e4m3fn's largest finite value
E2M1_MAX = 6.0
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # nvfp4_tensor.py `e2m1_values`, the magnitudes
NVFP4_BLOCK = 16


class ActivationQuantization(BaseModel):
    """A quantized checkpoint's activation quantization: each quantized linear's input scale."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    quant_algo: Literal["FP8", "NVFP4"]
    block_size: int | None = Field(default=None, ge=1, le=1 << 12)  # NVFP4: 16 inputs a block scale
    input_scales: dict[str, float] = Field(max_length=1 << 20)  # module name → scale


# --- weights -----------------------------------------------------------------------------------------------------

def unpack_int4(packed: Tensor) -> Tensor:
    """[out/2, in] uint8 → [out, in] int8 codes in -8..7 (pack_int4_in_uint8's layout, above)."""
    import torch

    nibbles = torch.stack((packed & 0x0F, packed >> 4), dim=1).to(torch.int8)  # [out/2, 2, in]
    codes = torch.where(nibbles >= 8, nibbles - 16, nibbles)
    return codes.reshape(-1, packed.shape[-1])


def unpack_e2m1(packed: Tensor) -> Tensor:
    """[…, in/2] uint8 → […, in] float32 e2m1 values (NVFP4's layout, above: element 2k low, 2k+1 high; bit 3 the
    sign)."""
    import torch

    codes = torch.stack((packed & 0x0F, packed >> 4), dim=-1).reshape(*packed.shape[:-1], -1).long()
    grid = torch.tensor(E2M1_GRID + tuple(-v for v in E2M1_GRID), dtype=torch.float32)
    return grid[codes]


class Dequantized(BaseModel):
    """What dequantizing a checkpoint did (its tensors are returned beside it)."""

    model_config = ConfigDict(frozen=True)

    layers: int  # linears dequantized
    awq_scaled: int  # of them, with an AWQ pre-quant scale folded in
    activations: ActivationQuantization | None  # FP8, NVFP4: the inputs' quantization, not in the weights


SCALES = {  # quant_algo → the per-linear scale tensors it stores besides the weight
    "W4A16_AWQ": (".weight_scale", ".pre_quant_scale"),
    "FP8": (".weight_scale", ".input_scale"),
    "NVFP4": (".weight_scale", ".weight_scale_2", ".input_scale"),
}


def dequantize(tensors: dict[str, Tensor], quant_algo: str,
               group_size: int | None) -> tuple[dict[str, Tensor], Dequantized]:
    """Every quantized linear of a `quant_algo` checkpoint as its effective float32 weight, every other tensor as
    float32, and what was done (FP8 and NVFP4's input scales as their ActivationQuantization). ToolError for a scale
    this layout does not have or a weight without its scales."""
    import torch

    if quant_algo not in SCALES:
        raise ToolError(f"quant_algo {quant_algo}: not dequantized here ({', '.join(sorted(SCALES))} are)")
    own = SCALES[quant_algo]
    out: dict[str, Tensor] = {}
    inputs: dict[str, float] = {}
    layers = awq = 0
    for name, t in tensors.items():
        if name.endswith(own):
            continue
        if name.endswith(("_scale", "_scale_2", "_quantizer", ".amax")):
            raise ToolError(f"{name}: a quantization parameter {quant_algo} does not have; not dequantized")
        base = name.removesuffix(".weight")
        quantized = t.dtype in (torch.uint8, torch.float8_e4m3fn)
        if not quantized:
            out[name] = t.float()
            continue
        scale = tensors.get(f"{base}.weight_scale")
        if not name.endswith(".weight") or scale is None:
            raise ToolError(f"{name} is quantized but has no {base}.weight_scale")
        if quant_algo == "W4A16_AWQ":
            weight = _int4_awq(name, t, scale, tensors.get(f"{base}.pre_quant_scale"), group_size or 128)
            awq += f"{base}.pre_quant_scale" in tensors
        elif quant_algo == "FP8":
            if t.dtype != torch.float8_e4m3fn or scale.numel() != 1:
                raise ToolError(f"{name}: FP8 (per tensor) stores float8_e4m3fn weights and one scale, not "
                                f"{t.dtype} with {scale.numel()} scales")
            weight = t.float() * scale.float()
        else:
            weight = _nvfp4(name, t, scale, tensors.get(f"{base}.weight_scale_2"), group_size or NVFP4_BLOCK)
        out[name] = weight
        layers += 1
        if quant_algo in ACTIVATION_QUANTIZED:
            s = tensors.get(f"{base}.input_scale")
            if s is None or s.numel() != 1 or not float(s) > 0:
                raise ToolError(f"{base}: {quant_algo} quantizes its input, but it has no positive input_scale")
            inputs[base] = float(s)
    acts = (ActivationQuantization(quant_algo=quant_algo,  # type: ignore[arg-type]  # checked: in ACTIVATION_QUANTIZED
                                   block_size=(group_size or NVFP4_BLOCK) if quant_algo == "NVFP4" else None,
                                   input_scales=inputs) if quant_algo in ACTIVATION_QUANTIZED else None)
    return out, Dequantized(layers=layers, awq_scaled=awq, activations=acts)


def _int4_awq(name: str, packed: Tensor, scale: Tensor, pqs: Tensor | None, group: int) -> Tensor:
    codes = unpack_int4(packed).float()
    groups = scale.float().repeat_interleave(group, dim=1)[:, : codes.shape[1]]
    if groups.shape != codes.shape:
        raise ToolError(f"{name}: scale {tuple(scale.shape)} does not cover codes {tuple(codes.shape)} in groups of "
                        f"{group}")
    weight = codes * groups
    return weight * pqs.float().reshape(1, -1) if pqs is not None else weight


def _nvfp4(name: str, packed: Tensor, scale: Tensor, scale_2: Tensor | None, block: int) -> Tensor:
    import torch

    if packed.dtype != torch.uint8 or scale.dtype != torch.float8_e4m3fn or scale_2 is None or scale_2.numel() != 1:
        raise ToolError(f"{name}: NVFP4 stores uint8 codes, float8_e4m3fn block scales and one weight_scale_2")
    values = unpack_e2m1(packed)
    # Each block's scale times the global one first, as ModelOpt's NVFP4QTensor.dequantize multiplies (bit for bit).
    blocks = (scale.float() * scale_2.float()).repeat_interleave(block, dim=-1)[..., : values.shape[-1]]
    if blocks.shape != values.shape:
        raise ToolError(f"{name}: block scales {tuple(scale.shape)} do not cover {tuple(values.shape)} in blocks of "
                        f"{block}")
    return values * blocks


# --- activations ---------------------------------------------------------------------------------------------------

def write_activations(folder: Path, acts: ActivationQuantization) -> None:
    (folder / ACTIVATIONS_FILE).write_text(acts.model_dump_json(indent=1))


def read_activations(folder: Path) -> ActivationQuantization | None:
    """The activation quantization written beside `folder`'s weights, None where there is none. ToolError for a
    file `write_activations` does not write (bounded read: the folder is a cache entry)."""
    path = folder / ACTIVATIONS_FILE
    if not path.exists():
        return None
    try:
        if not path.is_file() or path.stat().st_size > MAX_ACTIVATIONS_BYTES:
            raise ValueError("not a regular file of at most 4 MiB")
        return ActivationQuantization.model_validate_json(path.read_bytes())
    except (OSError, ValueError, ValidationError) as err:
        raise ToolError(f"{path}: not an activation quantization this project wrote ({type(err).__name__}); delete "
                        "the folder and run again") from None


def quantize_fp8(x: Tensor, scale: float) -> Tensor:
    """x quantized as an FP8 engine quantizes a linear's input: x / scale clamped to ±448, rounded to e4m3, × scale."""
    import torch

    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float().mul(scale).to(x.dtype)


def round_e2m1(x: Tensor) -> Tensor:
    """x (already scaled into ±6) rounded to the nearest e2m1 value, ties to the even code (as a cast rounds)."""
    import torch

    grid = torch.tensor(E2M1_GRID, dtype=torch.float32, device=x.device)
    mag = x.abs().clamp(max=E2M1_MAX)
    idx = (mag.unsqueeze(-1) - grid).abs().argmin(dim=-1)  # the first (even-coded, lower) of two at a tie
    return grid[idx] * x.sign()


def quantize_nvfp4(x: Tensor, global_scale: float, block: int = NVFP4_BLOCK) -> Tensor:
    """x quantized as an NVFP4 engine quantizes a linear's input: per block of `block` along the last axis, the block
    scale (amax / 6 over the global scale) rounded to e4m3, the values over block scale × global scale rounded to
    e2m1, then scaled back. The last axis must hold whole blocks (every NVFP4-quantized linear's does)."""
    import torch

    shape = x.shape
    if shape[-1] % block:
        raise ToolError(f"an NVFP4 input of width {shape[-1]} is not whole blocks of {block}")
    blocks = x.float().reshape(*shape[:-1], -1, block)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    block_scale = (amax / E2M1_MAX / global_scale).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn).float()
    step = block_scale * global_scale
    safe = torch.where(step > 0, step, torch.ones_like(step))
    q = torch.where(step > 0, round_e2m1(blocks / safe) * step, torch.zeros_like(blocks))
    return q.reshape(shape).to(x.dtype)


def install(model: nn.Module, acts: ActivationQuantization) -> int:
    """A forward pre-hook on each linear `acts` names that quantizes its input as the engine does; returns how many.
    ToolError where the model has no module of a name (the scales are not this model's)."""
    modules = dict(model.named_modules())
    missing = [n for n in acts.input_scales if n not in modules]
    if missing:
        raise ToolError(f"the activation quantization names modules this model does not have: {sorted(missing)[:3]}")
    for name, scale in acts.input_scales.items():
        if acts.quant_algo == "FP8":
            modules[name].register_forward_pre_hook(lambda _m, args, s=scale: (quantize_fp8(args[0], s), *args[1:]))
        else:
            block = acts.block_size or NVFP4_BLOCK
            modules[name].register_forward_pre_hook(
                lambda _m, args, s=scale, b=block: (quantize_nvfp4(args[0], s, b), *args[1:]))
    return len(acts.input_scales)


def simulate_activations(model: nn.Module, folder: Path) -> int:
    """The activation quantization written beside `folder`'s weights, installed on `model` (loaded from `folder`):
    how many linears quantize their input, 0 for a plain checkpoint."""
    acts = read_activations(folder)
    return install(model, acts) if acts is not None else 0

