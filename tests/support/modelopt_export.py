"""A tiny ModelOpt export made here (the `simulate` extra, nvidia-modelopt): a pre-quantized source as NVIDIA and a
team's PTQ job publish them (issue 36 item 5)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from enginefoundry.identity import TOKENIZER_FILES
from tests.support.paths import TINY_MODEL


def make_int4_awq_export(tmp: Path, prompts: list[list[dict[str, str]]]) -> tuple[Path, Path]:
    """(the unquantized original, its W4A16_AWQ export) under `tmp`: `widened_tiny_model` quantized with ModelOpt's
    INT4_AWQ_CFG calibrated on `prompts` (chat messages), exported with `export_hf_checkpoint` as hf_ptq.py exports it,
    the tokenizer files beside the weights (hf_ptq.py saves the tokenizer into the export)."""
    from modelopt.torch.export import export_hf_checkpoint

    original = widened_tiny_model(tmp / "original")
    export = tmp / "export"
    export_hf_checkpoint(int4_awq_quantized(original, prompts), export_dir=export)
    for f in original.iterdir():
        if f.name in TOKENIZER_FILES:
            shutil.copy(f, export / f.name)
    return original, export


def make_export(tmp: Path, original: Path, fmt: str, prompts: list[list[dict[str, str]]]) -> Path:
    """`original` quantized with ModelOpt's `fmt` config (FP8_DEFAULT_CFG, NVFP4_DEFAULT_CFG: weights and inputs
    quantized; their calibration runs on the CPU, their export too) on `prompts`, exported as hf_ptq.py exports it
    into `tmp`/`fmt`, the tokenizer files beside it."""
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint

    export = tmp / fmt
    export_hf_checkpoint(modelopt_quantized(original, getattr(mtq, f"{fmt.upper()}_DEFAULT_CFG"), prompts),
                         export_dir=export)
    for f in original.iterdir():
        if f.name in TOKENIZER_FILES:
            shutil.copy(f, export / f.name)
    return export


def widened_tiny_model(dest: Path) -> Path:
    """The tiny model widened so that its linears hold whole blocks of 128, as ModelOpt's int4 export needs (random
    weights, seed 0), with the tiny model's tokenizer files: `dest`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = json.loads((TINY_MODEL / "config.json").read_text())
    cfg.update(hidden_size=128, intermediate_size=256, head_dim=32)
    cfg.pop("transformers_version", None)
    LlamaForCausalLM(LlamaConfig(**cfg)).save_pretrained(dest)
    for f in TINY_MODEL.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            shutil.copy(f, dest / f.name)
    return dest


def int4_awq_quantized(src: Path, prompts: list[list[dict[str, str]]]) -> Any:
    """The model at `src` (float32) quantized with ModelOpt's INT4_AWQ_CFG, calibrated on `prompts` (chat messages)."""
    import modelopt.torch.quantization as mtq

    return modelopt_quantized(src, mtq.INT4_AWQ_CFG, prompts)


def modelopt_quantized(src: Path, config: Any, prompts: list[list[dict[str, str]]]) -> Any:
    """The model at `src` (float32) quantized with the ModelOpt `config`, calibrated on `prompts` (chat messages)."""
    import modelopt.torch.quantization as mtq
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()

    def loop(m: torch.nn.Module) -> None:
        with torch.no_grad():
            for chat in prompts:
                m(tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt",
                                          return_dict=True)["input_ids"])

    mtq.quantize(model, config, loop)
    return model
