"""How far ModelOpt's exported int4_awq checkpoint (what a TensorRT-LLM engine serves) is from ModelOpt's in-memory
fake-quantized model (what `smoke --reference-precision simulated` simulates for int4_awq): per layer kind, the
largest weight difference relative to the layer's largest weight, and the logits on one prompt.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python benchmarks/awq_export_drift.py --model qwen2.5-coder-0.5b \
        --prompts 4

The export resmooths linears that share an input (q/k/v, gate/up: one pre-quant scale, folded into the norm before
them) and requantizes them (modelopt/torch/export/unified_export_hf.py `requantize_resmooth_fused_llm_layers`,
0.47.0); the checkpoint is read back with enginefoundry.smoke.simulated.dequantized_checkpoint.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import gate_models  # noqa: E402

from enginefoundry.smoke.prompts import load_prompt_set  # noqa: E402
from enginefoundry.smoke.simulated import _fold, dequantized_checkpoint  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b", help=f"one of {', '.join(gate_models.SOURCES)}")
    ap.add_argument("--prompts", type=int, default=4, help="calibration prompts (benchmarks/gate_prompts.jsonl)")
    args = ap.parse_args()

    import modelopt.torch.quantization as mtq
    import torch
    from modelopt.torch.export import export_hf_checkpoint
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gate_models.source_dir(args.model)
    cases = load_prompt_set(REPO / "benchmarks" / "gate_prompts.jsonl").cases[: args.prompts]
    tok: Any = AutoTokenizer.from_pretrained(src)
    batches = [tok.apply_chat_template(c.chat(), add_generation_prompt=True, return_tensors="pt",
                                       return_dict=True)["input_ids"] for c in cases]
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    t0 = time.monotonic()
    mtq.quantize(model, mtq.INT4_AWQ_CFG, lambda m: [m(b) for b in batches])
    print(f"calibrated on {len(batches)} prompts in {time.monotonic() - t0:.0f} s", flush=True)
    with torch.no_grad():
        fake_logits = model(batches[0]).logits
        folded, _ = _fold(model)
    with tempfile.TemporaryDirectory() as tmp:
        export_hf_checkpoint(model, export_dir=Path(tmp) / "export")
        del model
        deq = dequantized_checkpoint(Path(tmp) / "export", tokenizer_from=src, root=Path(tmp) / "deq",
                                     progress=print)
        weights = load_file(deq.folder / "model.safetensors")
        exported = set(load_file(Path(tmp) / "export" / "model.safetensors"))
        plain = AutoModelForCausalLM.from_pretrained(deq.folder, dtype=torch.float32).eval()
        with torch.no_grad():
            export_logits = plain(batches[0]).logits
    worst: dict[str, float] = defaultdict(float)
    moved: set[str] = set()
    for name, w in folded.items():
        kind = name.split(".")[-2]
        if name.removesuffix(".weight") + ".pre_quant_scale" not in exported:
            moved.add(kind)  # its input scale went into the norm before it: not comparable weight by weight
            continue
        worst[kind] = max(worst[kind], float((weights[name] - w).abs().max() / w.abs().max()))
    print(f"{'layer kind':<12} largest |export - fake quant| / largest |w|")
    for kind, d in sorted(worst.items()):
        print(f"{kind:<12} {d:.2e}")
    print(f"resmoothed (their shared input scale moved into the norm before them, requantized): {sorted(moved)}")
    rel = float((export_logits - fake_logits).abs().max() / fake_logits.abs().max())
    agree = float((export_logits.argmax(-1) == fake_logits.argmax(-1)).float().mean())
    print(f"logits on the first prompt: largest difference {rel:.3f} of the largest logit; argmax agreement "
          f"{agree:.3f} over {fake_logits.shape[1]} positions")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
