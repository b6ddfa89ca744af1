"""A GPU reference on a real GPU: reference answers with device="gpu" (device_map="auto"), compared with the CPU
answers of the same model computed on the development host, and the GPU memory left once the reference freed it.

Here (no GPU): copy the tiny model and its prompts into DIR and write DIR/cpu.json, e.g.
    mkdir -p .devref && cp -r tests/fixtures/tiny-chat/model .devref/tiny && cp configs/prompts/tiny-chat.jsonl .devref/
    python -c "...reference_answers(.devref/tiny, cases, dtype=d, max_new_tokens=6) for d in fp32, bf16..."
then on the GPU machine, with pydantic, pydantic-settings and boto3 importable:
    python3 benchmarks/gpu_reference.py .devref
Measured 2026-11-30 on one H200 (torch 2.11.0+cu130, transformers 5.17.0, accelerate 1.15.0): 108/108 answers
with token ids equal to the CPU's in fp32 and in bf16; 32 MiB left allocated after the model was freed (cuBLAS's
workspace, which PyTorch takes from its caching allocator), not the weights."""
import json
import sys
import time
from pathlib import Path

import torch

from enginefoundry.smoke.prompts import load_prompt_set
from enginefoundry.smoke.reference import reference_answers, reference_key

here = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".devref")
cases = load_prompt_set(here / "tiny-chat.jsonl").cases
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0), flush=True)
cpu = json.loads((here / "cpu.json").read_text())
for dtype in ("fp32", "bf16"):
    t0 = time.monotonic()
    answers = reference_answers(here / "tiny", cases, dtype=dtype, max_new_tokens=6, device="gpu")
    wall = time.monotonic() - t0
    ref = {a["id"]: a["token_ids"] for a in cpu[dtype]}
    same = sum(a.token_ids == ref[a.id] for a in answers)
    first = sum(a.token_ids[:1] == ref[a.id][:1] for a in answers)
    print(f"{dtype}: {len(answers)} answers on gpu in {wall:.1f}s; "
          f"token ids equal to the CPU's: {same}/{len(answers)}; "
          f"first token equal: {first}/{len(answers)}; allocated after: {torch.cuda.memory_allocated()} B", flush=True)
key_cpu = reference_key(here / "tiny", cases, dtype="fp32", max_new_tokens=6)
key_gpu = reference_key(here / "tiny", cases, dtype="fp32", max_new_tokens=6, device="gpu")
print("keys differ by device:", key_cpu.digest != key_gpu.digest)
