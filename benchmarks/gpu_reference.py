"""A GPU reference on a real GPU: reference answers with device="gpu" (device_map="auto"), compared with the CPU
answers of the same model, and the GPU memory left once the reference freed it.

Here (no GPU), prepare a folder that travels to the GPU machine:
    python benchmarks/gpu_reference.py --cpu .devref     # the tiny model, its prompts, and cpu.json
then on the GPU machine, with pydantic, pydantic-settings and boto3 importable:
    python3 benchmarks/gpu_reference.py .devref
On a machine with two or more GPUs, `--sharded DIR` checks the sharded reference: a Llama-shaped model with random
weights (0.99 B parameters, fp32) loaded with the pipeline's own placement (`load_options("gpu")`), its layers
counted per GPU, and its reference answers on all GPUs compared with those on one GPU (CUDA_VISIBLE_DEVICES=0).
Measured 2026-11-30 on two H200s (same versions): device_map='auto' placed 12 modules on GPU 0 and 14 on GPU 1,
1,895 MiB on each; 108 answers in 29.7 s on both GPUs, 28.0 s on one; token ids equal 108/108.
Measured 2026-11-30 on one H200 (torch 2.11.0+cu130, transformers 5.17.0, accelerate 1.15.0): 108/108 answers
with token ids equal to the CPU's in fp32 and in bf16; 32 MiB left allocated after the model was freed (cuBLAS's
workspace, which PyTorch takes from its caching allocator), not the weights."""

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

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


SHARDED_SHAPE: dict[str, Any] = {
    "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22, "num_attention_heads": 16,
    "num_key_value_heads": 4, "max_position_embeddings": 2048, "tie_word_embeddings": False}


def random_llama(folder: Path) -> Path:
    """A Llama-shaped checkpoint with random weights (seed 0) and the tiny model's tokenizer and chat template."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    model_dir = folder / "random-llama"
    if (model_dir / "config.json").is_file():
        return model_dir
    tok = AutoTokenizer.from_pretrained(REPO / "tests" / "fixtures" / "tiny-chat" / "model")
    config = LlamaConfig(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, **SHARDED_SHAPE)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    print(f"random Llama: {sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters in {model_dir}",
          flush=True)
    return model_dir


def answers_here(model_dir: Path, out: Path) -> None:
    """Reference answers on the visible GPUs, with the pipeline's own code, written to `out`."""
    cases = load_prompt_set(REPO / "configs" / "prompts" / "tiny-chat.jsonl").cases
    t0 = time.monotonic()
    answers = reference_answers(model_dir, cases, dtype="fp32", max_new_tokens=MAX_NEW_TOKENS, device="gpu")
    out.write_text(json.dumps({"seconds": round(time.monotonic() - t0, 1),
                               "answers": {a.id: a.token_ids for a in answers}}))


def sharded(folder: Path) -> None:
    import collections
    import os
    import subprocess

    import torch
    from transformers import AutoModelForCausalLM

    from enginefoundry.smoke.reference import load_options

    gpus = torch.cuda.device_count()
    print("torch", torch.__version__, "GPUs:", gpus, [torch.cuda.get_device_name(i) for i in range(gpus)], flush=True)
    if gpus < 2:
        raise SystemExit("--sharded needs two or more GPUs")
    model_dir = random_llama(folder)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **load_options("gpu"))
    per_device = collections.Counter(str(d) for d in model.hf_device_map.values())  # type: ignore[operator]  # transformers 5.24 types it as a module attribute
    mib = {i: torch.cuda.memory_allocated(i) // 2**20 for i in range(gpus)}
    print(f"placement (device_map={load_options('gpu')['device_map']!r}): modules per device {dict(per_device)}; "
          f"MiB allocated per GPU {mib}", flush=True)
    del model
    torch.cuda.empty_cache()
    runs = {}
    for label, visible in (("all GPUs", ",".join(str(i) for i in range(gpus))), ("one GPU", "0")):
        out = folder / f"answers-{visible.replace(',', '_')}.json"
        subprocess.run([sys.executable, __file__, "--answers", str(out), str(model_dir)], check=True,
                       env={**os.environ, "CUDA_VISIBLE_DEVICES": visible})
        runs[label] = json.loads(out.read_text())
        print(f"{label} (CUDA_VISIBLE_DEVICES={visible}): {len(runs[label]['answers'])} answers in "
              f"{runs[label]['seconds']} s", flush=True)
    a, b = runs["all GPUs"]["answers"], runs["one GPU"]["answers"]
    same = sum(a[k] == b[k] for k in a)
    print(f"sharded vs one GPU: token ids equal {same}/{len(a)}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", default=".devref")
    ap.add_argument("--cpu", action="store_true", help="prepare the folder here (no GPU needed)")
    ap.add_argument("--sharded", action="store_true", help="the sharded reference, on a machine with 2+ GPUs")
    ap.add_argument("--answers", type=Path, help=argparse.SUPPRESS)  # --sharded's child: answers of FOLDER's model
    args = ap.parse_args()
    folder = Path(args.folder)
    if args.answers:
        answers_here(folder, args.answers)
        return 0
    folder.mkdir(parents=True, exist_ok=True)
    (prepare if args.cpu else sharded if args.sharded else compare_on_gpu)(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
