"""Loaded by `transformers serve` for the benchmark's "max_seq_len too short" build (PYTHONPATH points here).

It gives the server the limit an engine built with a small max_seq_len has: a prompt longer than
EF_MAX_SEQ_LEN is refused, and an answer gets at most EF_MAX_SEQ_LEN − prompt tokens (finish_reason
"length"), as TensorRT-LLM clamps a request to its engine's max_seq_len.
"""

import os

CAP = int(os.environ.get("EF_MAX_SEQ_LEN", "0"))

if CAP > 0:
    from transformers.generation import utils as _gen

    _generate = _gen.GenerationMixin.generate

    def generate(self, inputs=None, generation_config=None, **kwargs):
        ids = inputs if inputs is not None else kwargs.get("input_ids")
        length = int(ids.shape[-1])
        if length >= CAP:
            raise ValueError(f"prompt of {length} tokens does not fit max_seq_len {CAP}")
        if generation_config is not None and generation_config.max_new_tokens is not None:
            generation_config.max_new_tokens = min(generation_config.max_new_tokens, CAP - length)
        return _generate(self, inputs, generation_config=generation_config, **kwargs)

    _gen.GenerationMixin.generate = generate  # type: ignore[method-assign]  # the cap is a patch by design
