"""Build the deterministic tiny mixture-of-experts chat model used as a test fixture (issue 37, item 1).

The tiny chat model's recipe (scripts/make_tiny_model.py: the same 108 chat questions, byte-level BPE tokenizer,
seeded full-batch training, single-threaded and deterministic) with a Qwen3-MoE body instead of Llama: 2 layers,
4 routed experts per layer, 2 active per token, hidden 64, expert FFN width 32. It exits non-zero unless the reloaded
model answers all 108 prompts exactly under greedy decoding, so a recipe that stops converging cannot reach the
fixture. The prompt set is the tiny chat model's (configs/prompts/tiny-chat.jsonl): it is not rewritten.

Usage: python scripts/make_tiny_moe_model.py [--out DIR] [--steps N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tiny_model as tiny  # the tiny chat model's recipe, beside this script

DEFAULT_OUT = tiny.REPO_ROOT / "tests" / "fixtures" / "tiny-moe" / "model"
EXPERTS = 4
ACTIVE = 2


def build_model(tokenizer: tiny.PreTrainedTokenizerFast) -> Qwen3MoeForCausalLM:
    config = Qwen3MoeConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,  # dense FFN width: unused, every layer is an MoE layer (decoder_sparse_step 1)
        moe_intermediate_size=32,
        num_experts=EXPERTS,
        num_experts_per_tok=ACTIVE,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,  # type: ignore[call-arg]  # not in the signature of transformers 5.24, read from kwargs (checked: .head_dim == 16)
        max_position_embeddings=tiny.MAX_POSITIONS,
        tie_word_embeddings=True,
        output_router_logits=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(tiny.SEED)
    model = Qwen3MoeForCausalLM(config)
    model.generation_config = tiny.greedy_generation_config(tokenizer)
    return model


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="model output directory")
    parser.add_argument("--steps", type=int, default=400, help="full-batch training steps")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    examples = tiny.build_examples()
    tokenizer = tiny.build_tokenizer()
    model = build_model(tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"vocab {len(tokenizer)}  params {n_params:,}  experts {EXPERTS} ({ACTIVE} active)", flush=True)
    final_loss = tiny.train(model, tiny.build_batch(tokenizer, examples), args.steps)  # type: ignore[arg-type]
    print(f"trained {args.steps} steps, final loss {final_loss:.4f}", flush=True)
    tiny.save(model, tokenizer, args.out)  # type: ignore[arg-type]

    # Evaluate the reloaded files with the Auto* classes the reference lane uses.
    reloaded_tokenizer = AutoTokenizer.from_pretrained(args.out)
    reloaded = AutoModelForCausalLM.from_pretrained(args.out).eval()
    correct = tiny.evaluate(reloaded, reloaded_tokenizer, examples)
    print(f"{correct}/{len(examples)} exact under greedy decoding; {time.perf_counter() - started:.1f}s in all",
          flush=True)
    return 0 if correct == len(examples) else 1


if __name__ == "__main__":
    sys.exit(main())
