#!/usr/bin/env python3
"""Make, on a GPU host, a model of a real shape for the pipeline's GPU run: Llama-3.2-1B's (or -3B's) layers from a
seeded random initialisation, with the tiny chat model's tokenizer, trained briefly on the tiny chat set so that its
greedy answers are decided (random weights give near-flat logits, where any rounding flips a token and the gate
would judge noise). Weights cannot travel (the device tool carries 64 MiB), so they are made where they run.

    python3 scripts/make_gpu_model.py --shape llama-3.2-1b --out .gpu-run/model [--steps 300]
    python3 scripts/make_gpu_model.py --broken-from .gpu-run/model --out .gpu-run/broken   # one broken variant

The shapes are the published configs' (meta-llama/Llama-3.2-1B-Instruct and -3B-Instruct config.json: hidden
2048/3072, intermediate 8192, 16/28 layers, 32/24 heads, 8 KV heads, head_dim 64/128, llama3 RoPE θ 500000 × 32)
with the tiny tokenizer's 444-token vocabulary instead of 128,256 (the embedding is the only layer that differs).
configs/model-configs/llama-3.2-1b-shape.json is this script's config, for the predictor (`enginefoundry search`).
The broken variants (`--broken-from`, `--fault`) keep the model answering, of the kind the gate must reject:
`attn-noise-mid`, the gate benchmark's fault of that name (docs/smoke-gate.md), and the milder `o-proj-x1.5`.
Prints one JSON line at the end (shape, parameters, seconds, greedy exact matches out of 108).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerBase,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tiny_model import EOS, SEED, build_examples, prompt_ids  # the tiny model's own recipe

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tests" / "fixtures" / "tiny-chat" / "model"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
MAX_POSITIONS = 8192  # the llama3 RoPE scaling's original context; the tokenizer's model_max_length follows

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192, "rope_theta": 500000.0}
SHAPES: dict[str, dict[str, Any]] = {
    "llama-3.2-1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64},
    "llama-3.2-3b": {"hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28,
                     "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128},
}


def load_tokenizer(folder: Path) -> PreTrainedTokenizerBase:
    tok: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(folder)
    return tok


def model_config(shape: str, tokenizer: PreTrainedTokenizerBase) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tokenizer), max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-5,
        tie_word_embeddings=True, rope_parameters=dict(LLAMA3_ROPE),
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, **SHAPES[shape])


def batch(tokenizer: PreTrainedTokenizerBase, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows = []
    for ex in build_examples():
        prompt = prompt_ids(tokenizer, ex.question)
        target = tokenizer(ex.answer + EOS, add_special_tokens=False)["input_ids"]
        rows.append((prompt + target, [-100] * len(prompt) + target))
    width = max(len(ids) for ids, _ in rows)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([r + [pad] * (width - len(r)) for r, _ in rows], device=device)
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in rows], device=device)
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r, _ in rows], device=device)
    return ids, mask, labels


def train(model: LlamaForCausalLM, data: tuple[torch.Tensor, torch.Tensor, torch.Tensor], steps: int,
          lr: float, target_loss: float = 0.0) -> tuple[float, int]:
    """Train until `steps` or, after the warm-up, the first step whose loss is at most `target_loss`: (loss, steps
    run). A model trained to a loss of 0 (the lent H100's first run: 200 steps, final loss 0.00000) is certain of every
    answer token, so its log-probs are 0 at every precision and the gate's log-prob rules have nothing to measure."""
    ids, mask, labels = data
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * max(0.05, 1 - s / steps))
    model.train()
    loss_value = float("nan")
    step = 0
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=ids.is_cuda):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_value = float(loss.item())
        if step % 25 == 0 or step == steps - 1:
            print(f"step {step:4d}  loss {loss_value:.4f}", flush=True)
        if step >= 20 and loss_value <= target_loss:
            print(f"step {step:4d}  loss {loss_value:.4f} <= {target_loss}: stopped", flush=True)
            break
    model.eval()
    return loss_value, step + 1


def exact_matches(model_dir: Path, device: str) -> int:
    tok = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()  # type: ignore[arg-type]
    correct = 0
    for ex in build_examples():
        ids = torch.tensor([prompt_ids(tok, ex.question)], device=device)
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=6, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        correct += isinstance(text, str) and text.strip() == ex.answer
    return correct


def copy_tokenizer(out: Path) -> None:
    for name in TOKENIZER_FILES:
        shutil.copy2(TINY / name, out / name)
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["model_max_length"] = MAX_POSITIONS
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def make(shape: str, out: Path, steps: int, lr: float, device: str, target_loss: float) -> dict[str, object]:
    started = time.perf_counter()
    tokenizer = load_tokenizer(TINY)
    torch.manual_seed(SEED)
    torch.cuda.manual_seed_all(SEED)
    model = LlamaForCausalLM(model_config(shape, tokenizer)).to(device)  # type: ignore[arg-type]
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id,
                                               eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id, do_sample=False)
    params = sum(p.numel() for p in model.parameters())
    print(f"{shape}: {params:,} parameters on {device}", flush=True)
    loss, ran = train(model, batch(tokenizer, device), steps, lr, target_loss)
    tmp = out.with_name(out.name + ".part")
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(tmp)
    copy_tokenizer(tmp)
    if out.exists():
        shutil.rmtree(out)
    tmp.replace(out)
    del model
    torch.cuda.empty_cache()
    return {"shape": shape, "parameters": params, "steps": ran, "final_loss": round(loss, 5),
            "exact_of_108": exact_matches(out, device), "seconds": round(time.perf_counter() - started, 1)}


FAULTS = ("attn-noise-mid", "o-proj-x1.5")
DTYPES = ("fp32", "bf16")  # what a copy's weights are stored (and so served: the scoring server loads dtype "auto") in


def broken(source: Path, out: Path, fault: str = "attn-noise-mid", dtype: str = "fp32") -> dict[str, object]:
    """A broken copy of `source`, one fault at mid depth. `attn-noise-mid` is the gate benchmark's fault of that name
    (benchmarks/gate_models.py `_attn_noise`: the layer's q/k/v/o projections plus gaussian noise of 0.5 × each
    tensor's std, seeded by the layer); `o-proj-x1.5` scales that layer's o_proj by 1.5 (milder: on the H100 on
    2026-12-06 it passed the fp32 gate, docs/scale.md); `none` is the healthy control. `dtype` bf16 stores every
    weight (after the fault) in bfloat16, as a 16-bit build of the model would hold it."""
    import torch
    from safetensors.torch import load_file, save_file

    tmp = out.with_name(out.name + ".part")
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(source, tmp)
    config = json.loads((source / "config.json").read_text())
    layer = config["num_hidden_layers"] // 2
    prefix = f"model.layers.{layer}.self_attn."
    g = torch.Generator().manual_seed(layer)
    changed: list[str] = []
    for path in sorted(tmp.glob("*.safetensors")):
        tensors = load_file(path)
        names = sorted(k for k in tensors if k.startswith(prefix) and k.endswith("proj.weight"))
        if fault == "none":
            names = []
        elif fault == "o-proj-x1.5":
            names = [k for k in names if k.endswith("o_proj.weight")]
        for k in names:
            w = tensors[k].float()
            edited = w * 1.5 if fault == "o-proj-x1.5" else w + 0.5 * w.std() * torch.randn(w.shape, generator=g)
            tensors[k] = edited.to(tensors[k].dtype)
            changed.append(k)
        if dtype == "bf16":
            tensors = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in tensors.items()}
        if names or dtype == "bf16":
            save_file(tensors, path, metadata={"format": "pt"})
    if not changed and fault != "none":
        raise SystemExit(f"no attention projection of layer {layer} in {source}")
    if dtype == "bf16":
        config["torch_dtype"] = config["dtype"] = "bfloat16"
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if out.exists():
        shutil.rmtree(out)
    tmp.replace(out)
    return {"broken_from": str(source), "fault": fault, "dtype": dtype, "tensors": changed}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.2-1b")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--target-loss", type=float, default=0.05,
                    help="stop once the loss is at most this (0: run every step); a model certain of every token "
                         "leaves the gate's log-prob rules nothing to measure")
    ap.add_argument("--broken-from", type=Path, help="write a broken copy of this model folder instead")
    ap.add_argument("--fault", choices=(*FAULTS, "none"), default=FAULTS[0],
                    help="the broken copy's fault (default %(default)s; none: a healthy copy)")
    ap.add_argument("--dtype", choices=DTYPES, default="fp32", help="the copy's weights (default %(default)s)")
    args = ap.parse_args()
    if args.broken_from:
        print(json.dumps(broken(args.broken_from, args.out, args.fault, args.dtype)), flush=True)
        return 0
    if not torch.cuda.is_available():
        print("no CUDA device: this script makes the GPU run's model on the GPU host", file=sys.stderr)
        return 1
    print(json.dumps(make(args.shape, args.out, args.steps, args.lr, "cuda", args.target_loss)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
