"""Lane trtllm-engine and triton checks that run the fake toolchain's scripts (processes: moved out of
tests/unit/test_trtllm_lanes.py, the unit tier starts none)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from enginefoundry.errors import InputError, ToolError
from enginefoundry.inputs.toolchain import ToolchainInfo
from enginefoundry.inputs.units import Unit, expand_units
from enginefoundry.lanes import triton
from enginefoundry.lanes.trtllm import TrtllmLane
from enginefoundry.lanes.trtllm_engine import TrtllmEngineLane
from enginefoundry.lanes.trtllm_flags import TRITON_TEMPLATE_KEYS
from enginefoundry.lanes.trtllm_options import resolve_options
from enginefoundry.spec import BuildSpec, load_spec
from tests.support.fill_template import FILL_STAND_IN
from tests.support.paths import CONFIGS

MODEL_CONFIGS = CONFIGS / "model-configs"


def spec_and_units(name: str) -> tuple[BuildSpec, list[Unit]]:
    spec = load_spec(CONFIGS / name)
    return spec, expand_units(spec)


class _PinnedLane(TrtllmEngineLane):
    def __init__(self, version: str | None) -> None:
        super().__init__()
        self._toolchain = ToolchainInfo(tensorrt_llm=version, tensorrt="10.14.1.48", torch="2.9.1", cuda="13.0",
                                        driver="580.159.04",
                                        errors={} if version else {"tensorrt_llm": "ModuleNotFoundError"})


def test_engine_versions_refuse_13_and_its_release_candidates():
    assert _PinnedLane("1.2.1").versions()["tensorrt_llm"] == "1.2.1"
    assert _PinnedLane("1.0.0").versions()["tensorrt"] == "10.14.1.48"
    for bad in ("1.3.0rc0", "1.3.0", "1.4.0rc1"):
        with pytest.raises(ToolError, match=r"#15918.*tensorrt-llm>=1.0,<1.3"):
            _PinnedLane(bad).versions()
    with pytest.raises(ToolError, match=r"cannot import it \(ModuleNotFoundError\).*<1\.3"):
        _PinnedLane(None).versions()


def test_engine_convert_refuses_other_families_and_missing_examples(tmp_path, monkeypatch):
    spec, [unit] = spec_and_units("llama-3-70b-tp2-a100.yaml")
    monkeypatch.delenv("EF_TRTLLM_EXAMPLES_DIR", raising=False)
    src = tmp_path / "hf"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"architectures": ["MixtralForCausalLM"]}))
    with pytest.raises(InputError, match="Llama-family"):
        _PinnedLane("1.2.1").convert(spec, unit.variant, src, tmp_path / "w")
    (src / "config.json").write_text((MODEL_CONFIGS / "llama-3-70b-instruct.json").read_text())
    with pytest.raises(ToolError, match="examples_dir"):
        _PinnedLane("1.2.1").convert(spec, unit.variant, src, tmp_path / "w")


def triton_params(**kw) -> triton.TritonParams:
    spec, [unit] = spec_and_units("llama-3-70b-tp2-a100.yaml")
    opts = resolve_options("trtllm-engine", {**spec.lane_options, **kw})
    return triton.TritonParams.for_unit(unit, opts, engine_dir="/models/u1/engine",
                                        tokenizer_dir="/models/u1/tokenizer", model_dtype="float16")


# The stand-in for tools/fill_template.py is tests/support/fill_template.py; the real script runs in the gpu tests.
PARAM_NAMES = {"engine_dir": "gpt_model_path", "batching_strategy": "gpt_model_type",
               "encoder_engine_dir": "encoder_model_path"}


STRUCTURAL = {"triton_backend", "triton_max_batch_size", "decoupled_mode", "max_queue_delay_microseconds",
              "max_queue_size", "encoder_input_features_data_type", "prompt_embedding_table_data_type",
              "logits_datatype", "preprocessing_instance_count", "postprocessing_instance_count",
              "bls_instance_count"}


def write_template(path: Path, model: str, keys: frozenset[str]) -> None:
    """A config.pbtxt with every documented key: structural ones where Triton parses them, the rest as
    string parameters (as in the real templates)."""
    lines = [f'name: "{model}"', 'backend: "${triton_backend}"' if "triton_backend" in keys else 'backend: "python"',
             "max_batch_size: ${triton_max_batch_size}"]
    if "decoupled_mode" in keys:
        lines.append("model_transaction_policy { decoupled: ${decoupled_mode} }")
    if "max_queue_delay_microseconds" in keys:
        lines.append("dynamic_batching { max_queue_delay_microseconds: ${max_queue_delay_microseconds} "
                     "default_queue_policy { max_queue_size: ${max_queue_size} } }")
    for k in ("encoder_input_features_data_type", "prompt_embedding_table_data_type", "logits_datatype"):
        if k in keys:
            lines.append(f'input {{ name: "{k}" data_type: ${{{k}}} dims: [ -1 ] }}')
    for k in ("preprocessing_instance_count", "postprocessing_instance_count", "bls_instance_count"):
        if k in keys:
            lines.append(f"instance_group [ {{ count: ${{{k}}} kind: KIND_CPU }} ]")
    for k in sorted(keys - STRUCTURAL):
        lines.append(f'parameters: {{ key: "{PARAM_NAMES.get(k, k)}" value: {{ string_value: "${{{k}}}" }} }}')
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture
def triton_tree(tmp_path) -> Path:
    root = tmp_path / "triton_backend"
    for model in triton.MODELS:
        write_template(root / triton.TEMPLATES / model / "config.pbtxt", model, TRITON_TEMPLATE_KEYS[model])
    (root / triton.FILL_TEMPLATE).parent.mkdir(parents=True)
    (root / triton.FILL_TEMPLATE).write_text(FILL_STAND_IN)
    return root


def test_repository_is_built_and_filled(tmp_path, triton_tree):
    params = triton_params()
    repo = tmp_path / "bundle" / "triton_model_repo"
    cmds = triton.build_repository(triton_tree, repo, params, log_dir=tmp_path / "logs")
    assert len(cmds) == 5
    trt = (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    assert 'backend: "tensorrtllm"' in trt and "decoupled: false" in trt and "max_batch_size: 128" in trt
    assert 'key: "gpt_model_path" value: { string_value: "/models/u1/engine" }' in trt
    assert 'key: "gpt_model_type" value: { string_value: "inflight_fused_batching" }' in trt
    assert "data_type: TYPE_FP16" in trt and "max_queue_size: 0" in trt
    required, optional = triton.unfilled(trt)
    assert required == [] and "lora_prefetch_dir" in optional  # optional parameters may stay unset
    assert triton.check_repository(repo, params) == []


def test_values_with_commas_and_colons_survive(tmp_path, triton_tree):
    # fill_template.py splits on "," and then on ":", unescaping each time: ":" needs two levels.
    params = triton_params().model_copy(update={"engine_dir": "/mnt/a,b:c\\d/engine"})
    repo = tmp_path / "repo"
    triton.build_repository(triton_tree, repo, params, log_dir=tmp_path / "logs")
    assert 'string_value: "/mnt/a,b:c\\d/engine"' in (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    assert triton.escape_value("a,b:c\\d") == "a\\,b\\\\:c\\\\\\\\d"


def test_a_key_the_template_lacks_fails_loudly(tmp_path, triton_tree):
    ens = triton_tree / triton.TEMPLATES / "ensemble" / "config.pbtxt"
    write_template(ens, "ensemble", frozenset({"triton_max_batch_size"}))
    with pytest.raises(ToolError, match="fill_template ensemble failed"):
        triton.build_repository(triton_tree, tmp_path / "repo", triton_params(), log_dir=tmp_path / "logs")
    assert "does not exist in the file" in (tmp_path / "logs" / "fill_template-ensemble.log").read_text()


def test_quantized_convert_needs_model_optimizer(tmp_path, monkeypatch):
    monkeypatch.delenv("EF_MODELOPT_DIR", raising=False)
    spec, units = spec_and_units("llama-3.1-8b-multiarch.yaml")
    fp8 = next(u for u in units if u.variant.precision.value == "fp8")
    with pytest.raises(ToolError, match=r"hf_ptq\.py.*modelopt_dir"):
        TrtllmLane().convert(spec, fp8.variant, tmp_path / "hf", tmp_path / "work")
