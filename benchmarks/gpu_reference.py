"""A GPU reference on a real GPU: reference answers with device="gpu" (device_map="auto"), compared with the CPU
answers of the same model, and the GPU memory left once the reference freed it.

Here (no GPU), prepare a folder that travels to the GPU machine:
    python benchmarks/gpu_reference.py --cpu .devref     # the tiny model, its prompts, and cpu.json
then on the GPU machine, with pydantic, pydantic-settings and boto3 importable:
    python3 benchmarks/gpu_reference.py .devref
Measured 2026-11-30 on one H200 (torch 2.11.0+cu130, transformers 5.17.0, accelerate 1.15.0): 108/108 answers
with token ids equal to the CPU's in fp32 and in bf16; 32 MiB left allocated after the model was freed (cuBLAS's
workspace, which PyTorch takes from its caching allocator), not the weights."""

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from enginefoundry.smoke.prompts import load_prompt_set  # noqa: E402
from enginefoundry.smoke.reference import reference_answers, reference_key  # noqa: E402

DTYPES = ("fp32", "bf16")
MAX_NEW_TOKENS = 6


def prepare(folder: Path) -> None:
    """Copy the tiny model and its prompts into `folder` and write the CPU answers to cpu.json."""
    shutil.copytree(REPO / "tests" / "fixtures" / "tiny-chat" / "model", folder / "tiny", dirs_exist_ok=True)
    shutil.copy(REPO / "configs" / "prompts" / "tiny-chat.jsonl", folder / "tiny-chat.jsonl")
    cases = load_prompt_set(folder / "tiny-chat.jsonl").cases
    out = {d: [{"id": a.id, "token_ids": a.token_ids}
               for a in reference_answers(folder / "tiny", cases, dtype=d, max_new_tokens=MAX_NEW_TOKENS)]
           for d in DTYPES}
    (folder / "cpu.json").write_text(json.dumps(out))
    print(f"{folder}: {', '.join(f'{len(v)} {d} answers' for d, v in out.items())} on cpu")


def compare_on_gpu(folder: Path) -> None:
    import torch

    cases = load_prompt_set(folder / "tiny-chat.jsonl").cases
    print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0), flush=True)
    cpu = json.loads((folder / "cpu.json").read_text())
    for dtype in DTYPES:
        t0 = time.monotonic()
        answers = reference_answers(folder / "tiny", cases, dtype=dtype, max_new_tokens=MAX_NEW_TOKENS, device="gpu")
        wall = time.monotonic() - t0
        ref = {a["id"]: a["token_ids"] for a in cpu[dtype]}
        same = sum(a.token_ids == ref[a.id] for a in answers)
        first = sum(a.token_ids[:1] == ref[a.id][:1] for a in answers)
        print(f"{dtype}: {len(answers)} answers on gpu in {wall:.1f}s; "
              f"token ids equal to the CPU's: {same}/{len(answers)}; first token equal: {first}/{len(answers)}; "
              f"allocated after: {torch.cuda.memory_allocated()} B", flush=True)
    key_cpu = reference_key(folder / "tiny", cases, dtype="fp32", max_new_tokens=MAX_NEW_TOKENS)
    key_gpu = reference_key(folder / "tiny", cases, dtype="fp32", max_new_tokens=MAX_NEW_TOKENS, device="gpu")
    print("keys differ by device:", key_cpu.digest != key_gpu.digest)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", default=".devref")
    ap.add_argument("--cpu", action="store_true", help="prepare the folder here (no GPU needed)")
    args = ap.parse_args()
    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    (prepare if args.cpu else compare_on_gpu)(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
