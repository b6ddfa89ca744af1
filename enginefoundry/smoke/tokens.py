"""Token ids as the smoke stage reads them from a Hugging Face tokenizer (transformers.PreTrainedTokenizerBase): of a
text, and of a chat templated for generation. transformers types what these calls return as a union (a string, ids,
or a BatchEncoding, by the keyword arguments); here they are narrowed once, to the ids."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def text_ids(tok: PreTrainedTokenizerBase, text: str) -> list[int]:
    """`text`'s token ids, without special tokens."""
    return [int(t) for t in tok(text, add_special_tokens=False)["input_ids"]]


def chat_prompt_ids(tok: PreTrainedTokenizerBase, chat: list[dict[str, str]]) -> list[int]:
    """The ids of `chat` templated for generation (the prompt a served model is given)."""
    encoded = tok.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)
    if not isinstance(encoded, Mapping):  # return_dict=True: a BatchEncoding (a mapping)
        raise TypeError(f"the tokenizer's chat template returned {type(encoded).__name__}, not its encoding")
    return [int(t) for t in encoded["input_ids"]]
