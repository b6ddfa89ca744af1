"""Typed payloads between stages (issue 20): key components, source identity, bundle info and serve settings,
lane options. Each typed form must give back the JSON the untyped code wrote: keys, manifests and bundle.json
bytes do not change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from enginefoundry.errors import InputError
from enginefoundry.inputs.sources import SourceIdentity, SourceSnapshot
from enginefoundry.inputs.units import (
    KeyComponents,
    SourceDigests,
    checkpoint_key_components,
    expand_units,
    key_of,
    toolchain_identity,
    unit_key_components,
)
from enginefoundry.lanes.base import BUNDLE_INFO, BundleInfo, ServeSettings
from enginefoundry.lanes.trtllm_engine import EngineServeSettings, engine_serve_argv
from enginefoundry.lanes.trtllm_options import engine_options, resolve_options, trtllm_options
from enginefoundry.spec import load_spec

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("config", ["tiny-cpu.yaml", "llama-3.1-8b-multiarch.yaml"])
def test_typed_key_components_hash_and_record_as_the_json_they_came_from(config: str) -> None:
    spec = load_spec(CONFIGS / config)
    toolchain = toolchain_identity(spec, {"tensorrt_llm": "1.2.1"})
    for unit in expand_units(spec):
        raw = unit_key_components(spec, unit, SourceDigests(weights="w" * 64, tokenizer="t" * 64), toolchain,
                                  spec.lane_options)
        typed = KeyComponents.of(raw)
        assert typed.as_json() == raw and typed.key == key_of(raw)
        # the parameter a worker gets back from the Prefect API: the same key
        assert KeyComponents.of(json.loads(json.dumps(typed.as_json()))).key == key_of(raw)
        assert typed.toolchain.versions == {"tensorrt_llm": "1.2.1"} and typed.target is not None
    for variant in spec.variants:
        raw = checkpoint_key_components(spec, variant, "w" * 64, "t" * 64, toolchain)
        typed = KeyComponents.of(raw)
        assert typed.as_json() == raw and "profile" not in typed.as_json() and typed.key == key_of(raw)


def test_the_build_unit_flow_types_its_json_key_components_at_entry() -> None:
    from enginefoundry.flows.build_unit import unit_components

    assert unit_components({}) is None  # a refusal test sends none: the placement check still runs
    with pytest.raises(InputError, match=r"key_components\.toolchain"):
        unit_components({"format_version": 2, "kind": "unit", "weights_digest": "w", "tokenizer_digest": "t",
                         "lane": "reference", "variant": {}, "calibration": None})


def test_source_identity_is_the_snapshot_without_its_folder() -> None:
    snapshot = SourceSnapshot(uri="hf://org/m@main", kind="hf", local_dir="/cache/m", revision="a" * 40,
                              requested_revision="main", weights_digest="w" * 64, tokenizer_digest="t" * 64,
                              files={"config.json": "c" * 64})
    identity = SourceIdentity.of(snapshot)
    assert "local_dir" not in identity.model_dump()
    assert identity.at("/elsewhere") == snapshot.model_copy(update={"local_dir": "/elsewhere"})


def test_bundle_info_writes_the_bytes_the_lanes_always_wrote_and_reads_old_bundles(tmp_path: Path) -> None:
    legacy = {"lane": "reference", "unit": "u", "params": {"device": "cpu", "dtype": "float32", "max_batch_size": 4},
              "device": {"cpu": "x86_64"}, "serve": {"model_dir": "model"}}
    BundleInfo(lane="reference", unit="u", params=legacy["params"], device=legacy["device"],
               serve=ServeSettings(model_dir="model")).write(tmp_path)
    assert (tmp_path / BUNDLE_INFO).read_text() == json.dumps(legacy, indent=2, sort_keys=True)
    (tmp_path / BUNDLE_INFO).write_text(json.dumps({"params": {"device": "cpu"}}))  # fields are optional on read
    assert BundleInfo.read(tmp_path).serve.health == "/health"
    (tmp_path / BUNDLE_INFO).write_text(json.dumps({"serve": {"yaml_flag": ["not", "a", "string"]}}))
    with pytest.raises(InputError, match=r"serve\.yaml_flag"):
        BundleInfo.read(tmp_path)


def test_engine_serve_settings_keep_the_recorded_values_on_the_command_line() -> None:
    params = {"tp": 2, "pp": 1, "max_batch_size": 8, "max_num_tokens": 512, "kv_cache_free_gpu_memory_fraction": 1,
              "build_argv": ["trtllm-build"]}
    argv = engine_serve_argv("/b/engine", "/b/tokenizer", params, "127.0.0.1", 8000)
    assert argv == engine_serve_argv("/b/engine", "/b/tokenizer", EngineServeSettings.of(params), "127.0.0.1", 8000)
    assert argv[argv.index("--kv_cache_free_gpu_memory_fraction") + 1] == "1"  # not "1.0"
    with pytest.raises(InputError, match=r"params\.tp"):
        EngineServeSettings.of({"pp": 1})


def test_lanes_read_options_as_attributes_with_defaults_filled_in() -> None:
    spec = load_spec(CONFIGS / "llama-3.1-8b-multiarch.yaml")
    opts = trtllm_options(spec.lane_options)
    assert opts is spec.lane_options  # the spec's own typed model, not a copy
    assert opts.warmup_requests == resolve_options("trtllm", spec.lane_options)["warmup_requests"]
    # a raw mapping (a spec copied with model_copy keeps what it was given) is validated into the model
    raw = engine_options({"gemm_plugin": "float16"})
    assert (raw.gemm_plugin, raw.gpt_attention_plugin, raw.use_paged_context_fmha) == ("float16", "auto", True)
    assert trtllm_options(None).warmup_requests == 8 and engine_options(None).triton_dir == "/app"
