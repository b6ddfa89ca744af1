"""A tiny ModelOpt export made here (the `simulate` extra, nvidia-modelopt): a pre-quantized source as NVIDIA and a
team's PTQ job publish them (issue 36 item 5)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from enginefoundry.identity import TOKENIZER_FILES
from tests.support.paths import TINY_MODEL


def make_int4_awq_export(tmp: Path, prompts: list[list[dict[str, str]]]) -> tuple[Path, Path]:
    """(the unquantized original, its W4A16_AWQ export) under `tmp`: the tiny model widened so that its linears hold
    whole blocks of 128 (random weights, seed 0, the tiny tokenizer), quantized with ModelOpt's INT4_AWQ_CFG
    calibrated on `prompts` (chat messages), exported with `export_hf_checkpoint` as hf_ptq.py exports it, the
    tokenizer files beside the weights (hf_ptq.py saves the tokenizer into the export)."""
    import modelopt.torch.quantization as mtq
    import torch
    from modelopt.torch.export import export_hf_checkpoint
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = json.loads((TINY_MODEL / "config.json").read_text())
    cfg.update(hidden_size=128, intermediate_size=256, head_dim=32)
    cfg.pop("transformers_version", None)
    original = tmp / "original"
    LlamaForCausalLM(LlamaConfig(**cfg)).save_pretrained(original)
    for f in TINY_MODEL.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            shutil.copy(f, original / f.name)
    tok = AutoTokenizer.from_pretrained(original)
    model = AutoModelForCausalLM.from_pretrained(original, dtype=torch.float32).eval()

    def loop(m: torch.nn.Module) -> None:
        with torch.no_grad():
            for chat in prompts:
                m(tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt",
                                          return_dict=True)["input_ids"])

    mtq.quantize(model, mtq.INT4_AWQ_CFG, loop)
    export = tmp / "export"
    export_hf_checkpoint(model, export_dir=export)
    for f in original.iterdir():
        if f.name in TOKENIZER_FILES:
            shutil.copy(f, export / f.name)
    return original, export
