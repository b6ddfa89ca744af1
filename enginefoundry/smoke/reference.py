"""Greedy answers of the local Hugging Face reference, the yardstick for every lane."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from enginefoundry.smoke.prompts import PromptCase


class ReferenceAnswer(BaseModel):
    id: str
    text: str
    token_ids: list[int]


def reference_answers(
    model_dir: Path, cases: list[PromptCase], *, dtype: str, max_new_tokens: int
) -> list[ReferenceAnswer]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}.get(dtype, torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype).eval()
    out = []
    with torch.no_grad():
        for case in cases:
            ids = tok.apply_chat_template(case.chat(), add_generation_prompt=True, return_tensors="pt",
                                          return_dict=True)
            gen = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tok.pad_token_id)
            new = gen[0, ids["input_ids"].shape[1]:].tolist()
            out.append(ReferenceAnswer(id=case.id, text=tok.decode(new, skip_special_tokens=True).strip(),
                                       token_ids=[t for t in new if t not in tok.all_special_ids]))
    return out
