"""Build the tiny chat model's LoRA adapters, the test fixtures of `model.adapters` (issue 36).

Three Hugging Face PEFT adapter folders (adapter_config.json + adapter_model.safetensors), trained with PEFT on the
CPU in seconds, seeded and single-threaded like scripts/make_tiny_model.py:

- `plus-one`: a rank-8 LoRA on every linear layer of tests/fixtures/tiny-chat/model that answers "What is a plus
  b?" with a + b + 1 (capitals unchanged). Its answers differ from the base's on the addition prompts, so a unit
  that serves the base where this adapter was asked for fails the smoke gate against the adapter's own reference.
  The script exits non-zero unless at least MIN_CHANGED of the 100 addition answers changed.
- `wrong-base`: the same recipe on the one-layer draft model (tests/fixtures/tiny-chat/draft); its
  adapter_config.json names that base, so the pipeline refuses it for the tiny model before any download.
- `wrong-rank`: rank 128 on the tiny model's q_proj and v_proj, above the default `model.max_lora_rank` (64),
  trained a few steps.

`base_model_name_or_path` is written as the base's name (`tiny-chat`, `tiny-chat-draft`), as a Hub-trained adapter
names its base's repo id, not the path it was trained from on this machine.

Usage: python scripts/make_tiny_lora.py [--out DIR] [--steps N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tiny_model import (  # the tiny chat model's recipe, beside this script
    DEFAULT_DRAFT_OUT,
    DEFAULT_OUT,
    SEED,
    Example,
    build_batch,
    build_examples,
    generate_answer,
    train,
)

DEFAULT_ADAPTERS_OUT = DEFAULT_OUT.parent / "adapters"
BASE_NAME = "tiny-chat"
DRAFT_NAME = "tiny-chat-draft"
TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
RANK, ALPHA = 8, 16
WRONG_RANK = 128
STEPS = 300
WRONG_RANK_STEPS = 5
MIN_CHANGED = 60  # of the 100 addition answers


def plus_one_examples() -> list[Example]:
    """The adapter's task: additions answered one too high; capitals as the base answers them."""
    out = []
    for ex in build_examples():
        if ex.id.startswith("add-"):
            out.append(Example(ex.id, ex.question, str(int(ex.answer) + 1)))
        else:
            out.append(ex)
    return out


def make_adapter(base_dir: Path, base_name: str, out: Path, rank: int, steps: int,
                 modules: list[str] = TARGET_MODULES) -> None:
    torch.manual_seed(SEED)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=2 * rank if rank != RANK else ALPHA, lora_dropout=0.0,
                        target_modules=modules, bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(base, config)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(f"{out.name}: base {base_dir.name}, rank {rank}, trainable params {trainable:,}", flush=True)
    train(model, build_batch(tokenizer, plus_one_examples()), steps)  # type: ignore[arg-type]
    model.peft_config["default"].base_model_name_or_path = base_name
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    (out / "README.md").unlink(missing_ok=True)  # PEFT's model-card template: nothing the pipeline reads


def changed_answers(adapter_dir: Path, base_dir: Path) -> int:
    """Addition prompts whose greedy answer differs between the base and the base with the saved adapter."""
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    adds = [ex for ex in build_examples() if ex.id.startswith("add-")]
    before = [generate_answer(base, tokenizer, ex.question) for ex in adds]
    merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload().eval()
    after = [generate_answer(merged, tokenizer, ex.question) for ex in adds]
    right = sum(a == str(int(ex.answer) + 1) for a, ex in zip(after, adds, strict=True))
    print(f"{adapter_dir.name}: {right}/100 additions answered a + b + 1", flush=True)
    return sum(a != b for a, b in zip(before, after, strict=True))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_ADAPTERS_OUT, help="folder of the three adapters")
    parser.add_argument("--steps", type=int, default=STEPS, help=f"full-batch training steps (default {STEPS})")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    make_adapter(DEFAULT_OUT, BASE_NAME, args.out / "plus-one", RANK, args.steps)
    make_adapter(DEFAULT_DRAFT_OUT, DRAFT_NAME, args.out / "wrong-base", RANK, args.steps)
    make_adapter(DEFAULT_OUT, BASE_NAME, args.out / "wrong-rank", WRONG_RANK, WRONG_RANK_STEPS, ["q_proj", "v_proj"])
    changed = changed_answers(args.out / "plus-one", DEFAULT_OUT)
    print(f"plus-one changes {changed}/100 addition answers of the base (at least {MIN_CHANGED} needed); "
          f"total wall {time.perf_counter() - started:.1f}s", flush=True)
    return 0 if changed >= MIN_CHANGED else 1


if __name__ == "__main__":
    sys.exit(main())
