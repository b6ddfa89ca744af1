"""Greedy answers of the local Hugging Face reference, the yardstick for every lane."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from enginefoundry.smoke.prompts import PromptCase


class ReferenceAnswer(BaseModel):
    id: str
    text: str
    token_ids: list[int]  # generated tokens, special tokens left out
    # Aligned with token_ids: each token's text as a server reports it, and its log-prob under the
    # model's raw logits (what OpenAI-compatible servers return, before any sampling processors).
    token_texts: list[str] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)


def reference_answers(
    model_dir: Path, cases: list[PromptCase], *, dtype: str, max_new_tokens: int
) -> list[ReferenceAnswer]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}.get(dtype, torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype).eval()
    special = set(tok.all_special_ids)
    out = []
    with torch.no_grad():
        for case in cases:
            ids = tok.apply_chat_template(case.chat(), add_generation_prompt=True, return_tensors="pt",
                                          return_dict=True)
            gen = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tok.pad_token_id, output_logits=True, return_dict_in_generate=True)
            new = gen.sequences[0, ids["input_ids"].shape[1]:].tolist()
            steps = [(t, torch.log_softmax(gen.logits[i][0].float(), dim=-1)[t].item()) for i, t in enumerate(new)]
            kept = [(t, lp) for t, lp in steps if t not in special]
            out.append(ReferenceAnswer(
                id=case.id, text=tok.decode(new, skip_special_tokens=True).strip(),
                token_ids=[t for t, _ in kept], token_texts=[tok.decode([t]) for t, _ in kept],
                token_logprobs=[round(lp, 6) for _, lp in kept],
            ))
    return out
