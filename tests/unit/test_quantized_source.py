"""A pre-quantized source's quantization, read from its own files (enginefoundry/inputs/quantized_source.py): the
ModelOpt layouts (hf_quant_config.json with and without its `quantization` block, the inline config.json form),
the refusals of what it does not read and of hostile files, the contradiction refusal, the keys."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from enginefoundry.errors import SourceError, SpecError
from enginefoundry.inputs.quantized_source import (
    MAX_DEPTH,
    MAX_QUANT_CONFIG_BYTES,
    QUANT_CONFIG,
    lookup_quantization,
    precision_problems,
    quantization_from,
    quantization_problems,
    read_quantization,
    refuse_contradiction,
    spec_quantization_problems,
)
from enginefoundry.inputs.units import (
    KeyComponents,
    SourceDigests,
    checkpoint_key_components,
    expand_units,
    unit_key_components,
)
from enginefoundry.spec import BuildSpec, Precision, parse_spec
from tests.support.paths import CONFIGS, TINY_MODEL

# As nvidia-modelopt 0.47.0's export_hf_checkpoint writes them for INT4_AWQ_CFG (a tiny model, seen here).
HF_QUANT = {"producer": {"name": "modelopt", "version": "0.47.0"},
            "quantization": {"quant_algo": "W4A16_AWQ", "kv_cache_quant_algo": None, "group_size": 128,
                             "has_zero_point": False, "pre_quant_scale": True,
                             "exclude_modules": ["lm_head", "model.embed_tokens"]}}
TOOLCHAIN = {"lane": "reference", "trtllm_version": None, "image_digest": None, "versions": {}}
INLINE = {"ignore": ["lm_head", "model.embed_tokens"], "quant_algo": "W4A16_AWQ",
          "producer": {"name": "modelopt", "version": "0.47.0"}, "quant_method": "modelopt"}


def _checkpoint(tmp: Path, hf_quant: object | None = None, inline: object | None = None) -> Path:
    folder = tmp / "ckpt"
    folder.mkdir()
    config = json.loads((TINY_MODEL / "config.json").read_text())
    if inline is not None:
        config["quantization_config"] = inline
    (folder / "config.json").write_text(json.dumps(config))
    if hf_quant is not None:
        (folder / QUANT_CONFIG).write_text(json.dumps(hf_quant))
    return folder


def _spec(source: Path, *precisions: str) -> BuildSpec:
    data = yaml.safe_load((CONFIGS / "tiny-cpu.yaml").read_text())
    data["model"]["source"] = str(source)
    data["variants"] = [{"precision": p} for p in precisions]
    return parse_spec(data, source="test spec", base_dir=CONFIGS)


def test_modelopt_layouts_are_read_into_the_projects_precisions(tmp_path: Path):
    quant = read_quantization(_checkpoint(tmp_path, HF_QUANT, INLINE))
    assert quant is not None and quant.precision is Precision.INT4_AWQ and quant.quant_algo == "W4A16_AWQ"
    assert (quant.file, quant.producer, quant.group_size, quant.kv_cache_quant_algo) == (
        QUANT_CONFIG, "modelopt 0.47.0", 128, None)
    assert quant.dequantizable
    # The older flat file, the inline form alone, and each algorithm this project names.
    assert quantization_from({"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}, None).precision is Precision.FP8
    inline = quantization_from(None, {"quantization_config": INLINE})
    assert inline is not None and inline.file == "config.json quantization_config" and inline.dequantizable
    nvfp4 = quantization_from({"quantization": {"quant_algo": "NVFP4", "group_size": 16}}, None)
    assert nvfp4 is not None and nvfp4.precision is Precision.NVFP4 and nvfp4.dequantizable
    assert nvfp4.quantizes_activations and not quant.quantizes_activations
    w8 = quantization_from({"quantization": {"quant_algo": "W8A16"}}, None)
    assert w8 is not None and w8.precision is Precision.INT8_WO
    # A KV cache quantized by the export: no plain checkpoint holds it.
    kv = quantization_from({"quantization": {**HF_QUANT["quantization"], "kv_cache_quant_algo": "FP8"}}, None)
    assert kv is not None and not kv.dequantizable and "KV FP8" in kv.label()
    # An unquantized checkpoint.
    assert read_quantization(TINY_MODEL) is None


@pytest.mark.parametrize(("hf_quant", "inline", "said"), [
    ({"quantization": {"quant_algo": "W4A8_AWQ"}}, None,
     "hf_quant_config.json.quantization.quant_algo is W4A8_AWQ: a quantization enginefoundry has no precision for"),
    ({"quantization": {"quant_algo": "MIXED_PRECISION", "quantized_layers": {}}}, None, "is MIXED_PRECISION"),
    ({"quantization": {"quant_algo": None}}, None, "quant_algo is none"),
    ({"quantization": {"quant_algo": ["FP8"]}}, None, "quant_algo is not a name"),
    ({"quantization": "FP8"}, None, "`quantization` is not an object"),
    ({"quantization": {"quant_algo": "FP8", "group_size": -1}}, None, "group_size -1 is not a block size"),
    (None, {"quant_method": "gptq", "bits": 4}, "quant_method is gptq, not a ModelOpt export"),
    (None, {"quant_method": "compressed-tensors"}, "point model.source at the unquantized checkpoint"),
    (None, "fp8", "quantization_config is not an object"),
])
def test_what_it_does_not_read_is_refused_with_the_field_and_the_fix(tmp_path: Path, hf_quant, inline, said):
    folder = _checkpoint(tmp_path, hf_quant, inline)
    with pytest.raises(SourceError, match=r"^model\.source: ") as refused:
        read_quantization(folder)
    assert said in str(refused.value)
    # validate/plan: the same refusal, by field, before any work
    assert [f for f, _ in spec_quantization_problems(_spec(folder, "fp8"))] == ["model.source"]


def test_hostile_files_are_refused_bounded(tmp_path: Path):
    folder = _checkpoint(tmp_path, HF_QUANT)
    path = folder / QUANT_CONFIG
    path.write_bytes(b"{" + b" " * MAX_QUANT_CONFIG_BYTES + b"}")
    with pytest.raises(SourceError, match="more than any checkpoint's"):
        read_quantization(folder)
    deep: object = {"quant_algo": "FP8"}
    for _ in range(MAX_DEPTH + 1):
        deep = {"x": deep}
    path.write_text(json.dumps({"quantization": deep}))
    with pytest.raises(SourceError, match="nests deeper than"):
        read_quantization(folder)
    path.write_text("[" * 100_000 + "]" * 100_000)  # Python's parser recurses: refused, not a crash
    with pytest.raises(SourceError, match=r"not readable JSON|nests deeper"):
        read_quantization(folder)
    path.write_text("[1, 2]")
    with pytest.raises(SourceError, match="is not a JSON object"):
        read_quantization(folder)
    path.unlink()
    os.mkfifo(path)  # a FIFO would block a reader forever
    with pytest.raises(SourceError, match="is not a regular file"):
        read_quantization(folder)


def test_a_precision_that_contradicts_the_checkpoint_is_refused_naming_each_variant(tmp_path: Path):
    folder = _checkpoint(tmp_path, HF_QUANT)
    spec = _spec(folder, "int4_awq", "bf16", "fp8")
    quant = read_quantization(folder)
    problems = dict(precision_problems(spec, quant))
    assert set(problems) == {"variants.1.precision", "variants.2.precision"}
    assert "bf16 contradicts the source's quantization: its hf_quant_config.json says quant_algo W4A16_AWQ " \
           "(int4_awq)" in problems["variants.1.precision"]
    assert "set variants.2.precision: int4_awq" in problems["variants.2.precision"]
    with pytest.raises(SpecError) as refused:
        refuse_contradiction(spec, quant)
    assert [f for f, _ in refused.value.problems] == ["variants.1.precision", "variants.2.precision"]
    refuse_contradiction(_spec(folder, "int4_awq"), quant)  # agreeing: nothing to say
    refuse_contradiction(spec, None)  # an unquantized source: the lane quantizes it
    # FP8 and NVFP4 exports are dequantized into their reference; one with a quantized KV cache is not: refused
    # before work, with the way out.
    assert quantization_problems(_spec(folder, "fp8"), quantization_from({"quant_algo": "FP8"}, None)) == []
    fp8 = quantization_from({"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}, None)
    [(field, message)] = quantization_problems(_spec(folder, "fp8"), fp8)
    assert field == "model.source" and "the smoke gate has no reference for it" in message


def test_the_lookup_reads_a_local_source_and_the_hub_cache_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    folder = _checkpoint(tmp_path, HF_QUANT)
    found = lookup_quantization(_spec(folder, "int4_awq"))
    assert found.known and found.quantization is not None and found.source == str(folder)
    assert not lookup_quantization(_spec(tmp_path / "absent", "int4_awq")).known
    # A Hub source: the files of its pinned revision in the Hugging Face cache, never a download.
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import importlib

    import huggingface_hub.constants

    importlib.reload(huggingface_hub.constants)
    try:
        snap = tmp_path / "hub-cache" / "models--nvidia-test--tiny" / "snapshots" / ("a" * 40)
        shutil.copytree(folder, snap)
        refs = snap.parent.parent / "refs"
        refs.mkdir()
        (refs / "main").write_text("a" * 40)
        data = yaml.safe_load((CONFIGS / "tiny-cpu.yaml").read_text())
        data["model"]["source"] = "hf://nvidia-test/tiny@main"
        data["variants"] = [{"precision": "bf16"}]
        hub = parse_spec(data, source="test spec", base_dir=CONFIGS)
        found = lookup_quantization(hub)
        assert found.known and found.quantization is not None and "Hugging Face cache" in found.source
        assert [f for f, _ in spec_quantization_problems(hub)] == ["variants.0.precision"]
        data["model"]["source"] = "hf://nvidia-test/not-cached@main"
        assert not lookup_quantization(parse_spec(data, source="t", base_dir=CONFIGS)).known
    finally:
        monkeypatch.undo()
        importlib.reload(huggingface_hub.constants)


def test_the_keys_record_the_checkpoints_own_quantization(tmp_path: Path):
    folder = _checkpoint(tmp_path, HF_QUANT)
    spec = _spec(folder, "int4_awq")
    quant = read_quantization(folder)
    assert quant is not None
    [unit] = expand_units(spec)
    plain = unit_key_components(spec, unit, SourceDigests(weights="w", tokenizer="t"), TOOLCHAIN, spec.lane_options)
    prequantized = unit_key_components(spec, unit, SourceDigests(weights="w", tokenizer="t", quantization=quant),
                                       TOOLCHAIN, spec.lane_options)
    assert "source_quantization" not in plain  # an unquantized source keeps the key it always had
    assert prequantized["source_quantization"]["quant_algo"] == "W4A16_AWQ"
    assert KeyComponents.of(prequantized).key != KeyComponents.of(plain).key
    assert KeyComponents.of(prequantized).as_json() == prequantized  # recorded as hashed: explain diffs it
    ckpt = checkpoint_key_components(spec, unit.variant, "w", "t", TOOLCHAIN, quant)
    assert KeyComponents.of(ckpt).source_quantization == quant.key_json()
    other = quant.model_copy(update={"group_size": 64})
    assert KeyComponents.of(checkpoint_key_components(spec, unit.variant, "w", "t", TOOLCHAIN,
                                                      other)).key != KeyComponents.of(ckpt).key


def test_the_smoke_command_refuses_a_pre_quantized_reference_it_cannot_dequantize(tmp_path: Path):
    from enginefoundry.errors import InputError
    from enginefoundry.smoke import SmokeInputs, load_prompt_set, run_smoke
    from enginefoundry.spec import SmokeSpec
    from tests.support.paths import TINY_PROMPTS

    folder = _checkpoint(tmp_path, {"producer": {"name": "modelopt", "version": "0.47.0"},
                                    "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}})
    spec = SmokeSpec(prompts=str(TINY_PROMPTS), max_new_tokens=6, small_sample="warn")
    with pytest.raises(InputError, match=r"is pre-quantized \(FP8 \(fp8, KV FP8.*the gate has no reference"):
        run_smoke(SmokeInputs(spec, load_prompt_set(TINY_PROMPTS), reference_dir=folder, base_url="http://127.0.0.1:9",
                  model_name="tiny", served_tokenizer_dir=None, precision="fp8", progress=lambda _: None))
