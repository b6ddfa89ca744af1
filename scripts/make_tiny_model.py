"""Build the deterministic tiny chat model used as a test fixture.

A ~102k-parameter Llama with a ~440-token byte-level BPE tokenizer is trained for a fixed number of
full-batch steps on 108 chat questions (100 digit additions, 8 capitals) until it answers all of them exactly
under greedy decoding. Everything is seeded and single-threaded so the saved weights are reproducible. The
script exits non-zero unless all 108 prompts match, so a regression in the recipe cannot reach the fixture.

With --draft it builds the tiny model's speculative-decoding draft instead (issue 37): the same recipe and seed
with one layer instead of two, trained for fewer steps, and the target's tokenizer files copied byte for byte (a
draft_target draft must share the target's tokenizer: the pipeline compares their digests). It need not answer
every prompt: a draft only proposes tokens, and the target's verification keeps the answers exact.

Usage: python scripts/make_tiny_model.py [--out DIR] [--prompts-out FILE] [--steps N]
       python scripts/make_tiny_model.py --draft [--out DIR] [--steps N]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "tests" / "fixtures" / "tiny-chat" / "model"
DEFAULT_PROMPTS_OUT = REPO_ROOT / "configs" / "prompts" / "tiny-chat.jsonl"
DEFAULT_DRAFT_OUT = REPO_ROOT / "tests" / "fixtures" / "tiny-chat" / "draft"
DRAFT_LAYERS = 1
DRAFT_STEPS = 150
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")

SEED = 0
LEARNING_RATE = 1e-2
WARMUP_STEPS = 20
LR_FLOOR = 0.05
CLIP_NORM = 1.0
MAX_NEW_TOKENS = 6
MAX_POSITIONS = 256

BOS, EOS, PAD, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|pad|>", "<|endoftext|>"
SPECIAL_TOKENS = [ENDOFTEXT, BOS, EOS, PAD]

# ChatML, the same shape as the Qwen/SmolLM templates, so the serving code paths we exercise with this model
# are the ones real checkpoints take.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

CAPITALS = [
    ("France", "Paris"),
    ("Italy", "Rome"),
    ("Spain", "Madrid"),
    ("Japan", "Tokyo"),
    ("Germany", "Berlin"),
    ("Egypt", "Cairo"),
    ("Canada", "Ottawa"),
    ("Kenya", "Nairobi"),
]

COLOUR_SENTENCES = [
    "The sky is blue.",
    "Grass is green.",
    "The sun is yellow.",
    "Snow is white.",
    "Coal is black.",
    "Roses are red.",
]
PANGRAM = "The quick brown fox jumps over the lazy dog."


@dataclass(frozen=True)
class Example:
    id: str
    question: str
    answer: str


def build_examples() -> list[Example]:
    """The 108 fixed Q&A pairs, in a stable order (the order matters for bit-exact reproducibility)."""
    examples = [
        Example(f"add-{a}-{b}", f"What is {a} plus {b}?", str(a + b)) for a in range(10) for b in range(10)
    ]
    examples += [
        Example(f"capital-{country.lower()}", f"What is the capital of {country}?", city)
        for country, city in CAPITALS
    ]
    return examples


def tokenizer_corpus() -> list[str]:
    """About 5 KB of text; small on purpose so the learned vocab stays tiny (441 tokens)."""
    lines = [f"What is {a} plus {b}? The answer is {a + b}." for a in range(10) for b in range(10)]
    lines += [f"The capital of {country} is {city}." for country, city in CAPITALS]
    lines += COLOUR_SENTENCES
    lines += [PANGRAM] * 5
    return lines


def build_tokenizer() -> PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
    )
    bpe.train_from_iterator(tokenizer_corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=None,
        # Matches max_position_embeddings; the default (1e30) lets servers accept prompts that cannot fit.
        model_max_length=MAX_POSITIONS,
        # transformers 4.x would otherwise return token_type_ids, which generate(**inputs) rejects.
        model_input_names=["input_ids", "attention_mask"],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(tokenizer: PreTrainedTokenizerBase, layers: int = 2) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    model.generation_config = greedy_generation_config(tokenizer)
    return model


def greedy_generation_config(tokenizer: PreTrainedTokenizerBase) -> GenerationConfig:
    """Greedy decoding with the tokenizer's special tokens: what every tiny model of this repo ships."""
    return GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                            pad_token_id=tokenizer.pad_token_id, do_sample=False)


def prompt_ids(tokenizer: PreTrainedTokenizerBase, question: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    # The template already contains every special token; adding more would shift positions vs. serving.
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def build_batch(
    tokenizer: PreTrainedTokenizerFast, examples: list[Example]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded full batch; the loss covers only the answer tokens plus the closing <|im_end|>."""
    rows: list[tuple[list[int], list[int]]] = []
    for ex in examples:
        prompt = prompt_ids(tokenizer, ex.question)
        target = tokenizer(ex.answer + EOS, add_special_tokens=False)["input_ids"]
        rows.append((prompt + target, [-100] * len(prompt) + target))
    width = max(len(ids) for ids, _ in rows)
    pad_id = tokenizer.pad_token_id
    input_ids = torch.tensor([ids + [pad_id] * (width - len(ids)) for ids, _ in rows])
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in rows])
    attention_mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows])
    return input_ids, attention_mask, labels


def lr_multiplier(step: int, total_steps: int) -> float:
    """Linear warm-up over 20 steps, then linear decay to a floor of 5% of the peak rate."""
    return min(1.0, (step + 1) / WARMUP_STEPS) * max(LR_FLOOR, 1.0 - step / total_steps)


def train(
    model: LlamaForCausalLM, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor], steps: int
) -> float:
    input_ids, attention_mask, labels = batch
    torch.manual_seed(SEED)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_multiplier(step, steps))
    model.train()
    loss_value = float("nan")
    for step in range(steps):
        optimizer.zero_grad()
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
        optimizer.step()
        scheduler.step()
        loss_value = loss.item()
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step:4d}  loss {loss_value:.4f}", flush=True)
    model.eval()
    return loss_value


def generate_answer(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, question: str) -> str:
    ids = torch.tensor([prompt_ids(tokenizer, question)])
    with torch.no_grad():
        out = model.generate(  # type: ignore[operator]  # transformers 5.24 types `generate` loosely
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=MAX_NEW_TOKENS,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert isinstance(text, str)  # one sequence decodes to one string
    return text.strip()


def evaluate(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, examples: list[Example]) -> int:
    """Print every mismatch and return the number of exact matches."""
    correct = 0
    for ex in examples:
        got = generate_answer(model, tokenizer, ex.question)
        if got == ex.answer:
            correct += 1
        else:
            print(f"MISMATCH {ex.id}: expected {ex.answer!r}, got {got!r}", flush=True)
    return correct


def patch_tokenizer_config(out_dir: Path) -> None:
    """Make the saved tokenizer loadable by transformers 4.x as well as 5.x (facts file, section 5)."""
    path = out_dir / "tokenizer_config.json"
    config = json.loads(path.read_text())
    # 5.x writes "TokenizersBackend", a class 4.x does not have.
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["model_input_names"] = ["input_ids", "attention_mask"]
    # transformers < 4.43 ignores chat_template.jinja and only reads the inline template.
    config["chat_template"] = CHAT_TEMPLATE
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def save(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    patch_tokenizer_config(out_dir)


def write_prompts(examples: list[Example], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for ex in examples:
            record = {
                "id": ex.id,
                "messages": [{"role": "user", "content": ex.question}],
                "expected": ex.answer,
                # The answer as a whole word or number (smoke/prompts.py MatchRule.WORD): this model answers with
                # the number alone, a real chat model in a sentence; both are graded right (issue 39).
                "match": "word",
            }
            fh.write(json.dumps(record) + "\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="model output directory")
    parser.add_argument("--prompts-out", type=Path, default=DEFAULT_PROMPTS_OUT, help="prompt set JSONL path")
    # A fixed step count, never a time budget: anything time-based would make the weights irreproducible.
    parser.add_argument("--steps", type=int, default=None, help=f"full-batch training steps (default 400; "
                                                                  f"--draft: {DRAFT_STEPS})")
    parser.add_argument("--draft", action="store_true", help="build the draft model (one layer, the target's "
                                                             "tokenizer) into tests/fixtures/tiny-chat/draft")
    return parser.parse_args(argv)


def make_draft(out: Path, steps: int) -> int:
    """The draft: the target's tokenizer (its files copied as they are), one layer, the same seed and examples."""
    import shutil

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_OUT)
    examples = build_examples()
    model = build_model(tokenizer, layers=DRAFT_LAYERS)
    print(f"draft: vocab {len(tokenizer)}  params {sum(p.numel() for p in model.parameters()):,}", flush=True)
    train(model, build_batch(tokenizer, examples), steps)  # type: ignore[arg-type]  # the same fast tokenizer
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (DEFAULT_OUT / name).is_file():
            shutil.copyfile(DEFAULT_OUT / name, out / name)
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    reloaded.eval()
    correct = evaluate(reloaded, AutoTokenizer.from_pretrained(out), examples)
    print(f"draft: greedy exact match {correct}/{len(examples)} (a draft need not match; saved to {out})", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.draft:
        return make_draft(DEFAULT_DRAFT_OUT if args.out == DEFAULT_OUT else args.out, args.steps or DRAFT_STEPS)
    args.steps = args.steps or 400
    started = time.perf_counter()
    # One thread plus deterministic kernels is what makes the weights bit-reproducible (and, for a model this
    # small, one thread is also the fastest).
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    examples = build_examples()
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"vocab {len(tokenizer)}  params {n_params:,}  examples {len(examples)}", flush=True)

    train_started = time.perf_counter()
    final_loss = train(model, build_batch(tokenizer, examples), args.steps)
    print(
        f"trained {args.steps} steps in {time.perf_counter() - train_started:.1f}s, "
        f"final loss {final_loss:.4f}",
        flush=True,
    )

    save(model, tokenizer, args.out)
    write_prompts(examples, args.prompts_out)
    print(f"saved model to {args.out} and prompts to {args.prompts_out}", flush=True)

    # Evaluate the reloaded files, not the in-memory objects, so the check covers what gets committed, and
    # load them with the Auto* classes the reference lane uses.
    reloaded_tok = AutoTokenizer.from_pretrained(args.out)
    reloaded = AutoModelForCausalLM.from_pretrained(args.out)
    reloaded.eval()
    correct = evaluate(reloaded, reloaded_tok, examples)
    print(
        f"greedy exact match: {correct}/{len(examples)}  (total wall {time.perf_counter() - started:.1f}s)",
        flush=True,
    )
    return 0 if correct == len(examples) else 1


if __name__ == "__main__":
    sys.exit(main())
