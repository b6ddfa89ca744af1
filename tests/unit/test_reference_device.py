"""smoke.reference_device: gpu loads the source through accelerate's device_map="auto" (the unit's GPUs on its
worker). No GPU here: the decision and the artifact's identity are tested, and the device_map path itself
runs for real, where accelerate places every layer on the CPU and must give the CPU path's answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from enginefoundry.smoke import reference as refmod
from enginefoundry.smoke.prompts import load_prompt_set
from enginefoundry.smoke.reference import (
    ReferenceAsk,
    ReferenceSettings,
    load_options,
    load_or_compute_reference,
    reference_answers,
)
from tests.support.paths import TINY_MODEL, TINY_PROMPTS

CASES = load_prompt_set(TINY_PROMPTS).cases[:3]


def test_only_a_gpu_reference_is_sharded_by_device_map():
    assert load_options("gpu") == {"device_map": "auto"} and load_options("cpu") == {}


def test_the_device_map_path_gives_the_cpu_paths_answers_where_accelerate_finds_no_gpu():
    cpu = reference_answers(TINY_MODEL, CASES, dtype="fp32", max_new_tokens=6)
    mapped = reference_answers(TINY_MODEL, CASES, dtype="fp32", max_new_tokens=6, device="gpu")
    assert [a.text for a in mapped] == [a.text for a in cpu] == [c.expected for c in CASES]


def test_a_gpu_reference_is_computed_with_its_device_and_kept_apart_from_the_cpu_one(tmp_path: Path):
    asked: list[str] = []

    def compute(model_dir, cases, *, dtype, max_new_tokens, device="cpu", progress=None):
        asked.append(device)
        return reference_answers(model_dir, cases, dtype=dtype, max_new_tokens=max_new_tokens)

    before = refmod.COMPUTE_COUNT["n"]
    settings = ReferenceSettings(cache_dir=tmp_path, progress=lambda _: None)
    gpu, o_gpu = load_or_compute_reference(TINY_MODEL, ReferenceAsk(CASES, 6, "gpu"), settings, dtype="bf16",
                                           compute=compute)
    cpu, o_cpu = load_or_compute_reference(TINY_MODEL, ReferenceAsk(CASES, 6), settings, dtype="bf16", compute=compute)
    assert asked == ["gpu", "cpu"] and refmod.COMPUTE_COUNT["n"] == before + 2
    assert gpu.key.device == "gpu" and cpu.key.device is None and o_gpu.key != o_cpu.key
    assert o_gpu.device == "gpu" and " on gpu (computed)" in o_gpu.label() and " on gpu" not in o_cpu.label()


def test_the_spread_refuses_a_model_accelerate_offloaded_to_disk(monkeypatch, tmp_path):
    """The spread's wider pass loads in that dtype (device_map places what it will hold) and rounds the weights in
    place; a weight accelerate left on the meta device (offloaded to disk) is refused with the fix, not cast."""
    import torch
    from transformers import AutoModelForCausalLM

    from enginefoundry.errors import ToolError
    from enginefoundry.smoke.prompts import load_prompt_set
    from enginefoundry.smoke.reference import ReferenceKey, ReferenceSet, compute_spread
    from tests.support.paths import TINY_MODEL, TINY_PROMPTS

    real = AutoModelForCausalLM.from_pretrained
    seen: dict = {}

    def offloaded(*args, **kwargs):
        seen.update(kwargs)
        model = real(*args, **kwargs)
        model.lm_head.weight = torch.nn.Parameter(torch.empty_like(model.lm_head.weight, device="meta"))
        return model

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", offloaded)
    cases = load_prompt_set(TINY_PROMPTS).cases[:2]
    key = ReferenceKey(weights_digest="w" * 64, tokenizer_digest="t" * 64, prompts_digest="p" * 64, dtype="bf16",
                       max_new_tokens=4, generator="g")
    ref = ReferenceSet(key=key, answers=[])
    with pytest.raises(ToolError, match=r"smoke\.reference_device: cpu"):
        compute_spread(TINY_MODEL, cases, ref)
    assert seen["dtype"] is torch.float32  # bf16 weights, loaded for their float32 pass
