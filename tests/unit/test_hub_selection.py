"""Which files of a Hugging Face repo a build fetches: duplicate weight formats skipped by default, the spec's
patterns on hub sources only."""

from __future__ import annotations

import pytest

from enginefoundry.inputs.sources import hf_selection


def test_selection_rules() -> None:
    files = ["config.json", "model.safetensors", "pytorch_model.bin", "original/consolidated.00.pth",
             "original/params.json", "onnx/model.onnx", "model.gguf", "flax_model.msgpack", "tf_model.h5",
             "tokenizer.json"]
    chosen, ignore = hf_selection(files, None, None)
    assert chosen == ["config.json", "model.safetensors", "tokenizer.json"]
    assert ignore[-1] == "*.bin"
    only_bin, _ = hf_selection(["config.json", "pytorch_model.bin"], None, None)
    assert only_bin == ["config.json", "pytorch_model.bin"]  # no safetensors: the .bin is the checkpoint
    allowed, _ = hf_selection(files, ("*.json",), None)
    assert allowed == ["config.json", "tokenizer.json"]
    assert hf_selection(files, None, ())[0] == sorted(files)


def test_patterns_belong_to_hub_sources() -> None:
    from pydantic import ValidationError

    from enginefoundry.spec import ModelSpec

    with pytest.raises(ValidationError, match="hf:// sources"):
        ModelSpec(source="s3://bucket/prefix", name="m", ignore_patterns=["*.pth"])
    hub = ModelSpec(source="hf://org/m@main", name="m", allow_patterns=["*.json"], ignore_patterns=[])
    assert (hub.parsed_source().allow_patterns, hub.parsed_source().ignore_patterns) == (("*.json",), ())
