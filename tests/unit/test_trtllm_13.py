"""Issue 23, deliverables 1, 2 and 5: TensorRT-LLM 1.3 (the line that removed the engine backend) on the `trtllm`
lane, the engine lane's refusal, the LLM API Triton model for PyTorch-backend bundles, and the corrected registry
rows. Evidence for each expectation: the registry entries' refs (enginefoundry/lanes/trtllm_flags.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from enginefoundry.errors import InputError
from enginefoundry.inputs.toolchain import (
    LLMAPI_TEMPLATE,
    ToolSurface,
    UnsupportedByRelease,
    check_against_surface,
    llmapi_template_keys,
)
from enginefoundry.inputs.units import expand_units
from enginefoundry.lanes import get_lane
from enginefoundry.lanes.trtllm_flags import HF_PTQ, LLMAPI_TRITON, MODELOPT, SERVE, emitted_names, flag
from enginefoundry.planning.plan_report import plan_report
from enginefoundry.spec import BuildSpec, parse_spec

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
FAKE = ROOT / "tests" / "fixtures" / "fake-trtllm"
V13 = "1.3.0rc20"


def spec_for(config: str, lane: str | None = None, version: str = V13, **options) -> BuildSpec:
    data = yaml.safe_load((CONFIGS / config).read_text())
    data["toolchain"] = {"trtllm_version": version}
    if lane:
        data["lane"] = lane
    data["lane_options"] = options
    return parse_spec(data, base_dir=CONFIGS)


def surface_13(fake_trtllm) -> ToolSurface:
    return ToolSurface.model_validate(fake_trtllm.expected_surface("1.3"))


# --- deliverable 1: 1.3 plans on the trtllm lane, is refused on the engine lane ------------------------------------

def test_a_13_spec_plans_on_the_trtllm_lane_with_no_invented_modelopt(fake_trtllm):
    spec = spec_for("llama-3.1-8b-multiarch.yaml")
    assert get_lane("trtllm").validate_options(spec) == []
    report = plan_report(spec)
    assert report.rows and not report.refused
    text = "\n".join(line for cmds in report.commands.values() for line in cmds)
    assert "ModelOpt 0.0" not in text  # main printed a ModelOpt version no release has
    assert "ModelOpt 0.37.0 has no --calib_seq" in text  # the 1.3 pin (MODELOPT_PINS, with its source)
    assert "--export_fmt" not in text  # deprecated from 0.37
    surface = surface_13(fake_trtllm)
    for unit in expand_units(spec):  # what `plan` renders and what the worker renders: both accepted by 1.3
        for rendered in (get_lane("trtllm").describe(spec, unit), get_lane("trtllm").describe(spec, unit, surface)):
            check_against_surface(rendered, surface)


def test_a_release_whose_pin_is_not_recorded_renders_the_common_flags_and_says_so():
    spec = spec_for("llama-3.1-8b-multiarch.yaml", version="1.4.0rc1")
    fp8 = next(u for u in expand_units(spec) if u.variant.precision.value == "fp8")
    ptq = get_lane("trtllm").describe(spec, fp8)[0]
    assert "ModelOpt version unknown until the worker's probe" in ptq.description
    assert "--calib_seq" not in ptq.argv and "ModelOpt 0.0" not in ptq.description


def test_the_worker_renders_the_installed_modelopt_flags_on_13(fake_trtllm):
    spec = spec_for("llama-3.1-8b-multiarch.yaml")
    fp8 = next(u for u in expand_units(spec) if u.variant.precision.value == "fp8")
    ptq = get_lane("trtllm").describe(spec, fp8, surface_13(fake_trtllm))[0]
    assert ptq.tool == HF_PTQ and "--calib_seq" in ptq.argv  # ModelOpt 0.46.0 has it
    assert "--export_fmt" not in ptq.argv  # deprecated from 0.37 and forced to hf
    assert "/examples/hf_ptq/hf_ptq.py" in ptq.argv[1]  # 0.46.0 moved it out of examples/llm_ptq


def test_the_engine_lane_refuses_13_with_the_release_the_change_and_what_to_use():
    spec = spec_for("llama-3-70b-tp2-a100.yaml", gemm_plugin="auto")
    problems = dict(get_lane("trtllm-engine").validate_options(spec))
    why = problems["toolchain.trtllm_version"]
    for needle in ("1.3.0rc20", "a release candidate of 1.3+ counts as 1.3", "tensorrt-backend-removal",
                   "#15918", "#15907", "#15763", "#15767", "#15810", "#16369", "#15760", "lane: trtllm"):
        assert needle in why, needle
    unit = expand_units(spec)[0]
    with pytest.raises(InputError, match=r"toolchain\.trtllm_version: .*lane: trtllm"):
        get_lane("trtllm-engine").describe(spec, unit)  # main rendered trtllm-build for 1.3
    report = plan_report(spec)  # plan runs the lane's refusals: every unit refused with the reason, no traceback
    assert report.refused == len(report.rows)
    assert all("tensorrt-backend-removal" in row["verdict"] for row in report.rows)


def test_the_engine_lane_refuses_a_13_surface_even_without_a_pin(fake_trtllm):
    data = yaml.safe_load((CONFIGS / "llama-3-70b-tp2-a100.yaml").read_text())
    data.pop("toolchain", None)
    data["lane_options"] = {"gemm_plugin": "auto"}
    spec = parse_spec(data, base_dir=CONFIGS)
    with pytest.raises(InputError, match=r"1\.0 – 1\.2\.x, not 1\.3\.0rc20"):
        get_lane("trtllm-engine").describe(spec, expand_units(spec)[0], surface_13(fake_trtllm))


# --- deliverable 5: registry rows that said something the cited release does not ---------------------------------

def test_export_fmt_is_still_parsed_at_modelopt_046():
    entry = flag(HF_PTQ, "export_fmt")
    assert entry.versioned_by == MODELOPT and entry.until is None  # main: until 0.45 ("gone in 0.46.0")
    assert entry.exists_in("0.46.0") and any("43fd41a58d52c4e6e5dec1d1ff5989ecc737ae1a" in r for r in entry.refs)


def test_serve_rows_start_where_the_cli_has_them():
    # The 0.18.2 CLI has --backend pytorch only and no --extra_llm_api_options (docs 0.18.2): not "0.15".
    assert not flag(SERVE, "extra_llm_api_options").exists_in("0.18.2")
    assert not flag(SERVE, "backend=trt").exists_in("0.18.2")
    assert flag(SERVE, "extra_llm_api_options").exists_in("1.0.0")
    # The serve rows cite a commit before --config (#9104), not one after the 1.2 branch point.
    assert all("00209af149e7774406881a37283dce303571eb11" not in r for f in emitted_names(SERVE)
               for r in flag(SERVE, f).refs)


# --- deliverable 2: the LLM API Triton model for trtllm bundles ---------------------------------------------------

def test_a_trtllm_unit_gets_a_triton_launch_checked_against_the_template(fake_trtllm):
    spec = spec_for("llama-3.1-8b-multiarch.yaml", triton=True, triton_dir=str(FAKE / "1.3" / "triton"))
    lane = get_lane("trtllm")
    surface = surface_13(fake_trtllm)
    unit = expand_units(spec)[0]
    launch = lane.describe(spec, unit, surface)[-1]
    assert launch.argv[1].endswith("scripts/launch_triton_server.py") and "--model_repo" in launch.argv
    assert set(launch.template_keys[LLMAPI_TEMPLATE]) <= set(surface.triton_templates[LLMAPI_TEMPLATE])
    check_against_surface([launch], surface)
    trimmed = surface.model_copy(deep=True)
    trimmed.triton_templates[LLMAPI_TEMPLATE].remove("triton_config.decoupled")
    with pytest.raises(UnsupportedByRelease, match=r"Triton template llmapi/tensorrt_llm key \$\{triton_config"):
        check_against_surface([launch], trimmed)
    trimmed.triton_templates = None  # triton_dir is not a backend tree: name the template, not inflight_batcher_llm
    with pytest.raises(UnsupportedByRelease, match=r"Triton template llmapi/tensorrt_llm \(under all_models/\)"):
        check_against_surface([launch], trimmed)


def test_the_repository_is_the_installed_model_with_the_bundle_model_yaml(tmp_path, fake_trtllm):
    from enginefoundry.lanes import triton_llmapi
    from enginefoundry.lanes.trtllm import runtime_config

    tree = FAKE / "1.3" / "triton"
    spec = spec_for("llama-3.1-8b-multiarch.yaml", triton=True, triton_dir=str(tree))
    unit = expand_units(spec)[0]
    cfg = runtime_config(spec, unit)
    body = triton_llmapi.model_yaml(cfg, "/bundle/checkpoint", decoupled=False)
    repo = triton_llmapi.build_repository(tree, tmp_path / "repo", body)
    model = repo / "tensorrt_llm"
    assert (model / "config.pbtxt").read_text() == (tree / "all_models/llmapi/tensorrt_llm/config.pbtxt").read_text()
    assert (model / "1" / "model.py").is_file()
    written = yaml.safe_load((model / "1" / "model.yaml").read_text())
    assert written["triton_config"] == {"max_batch_size": 0, "decoupled": False}
    assert written["model"] == "/bundle/checkpoint" and written["backend"] == "pytorch"
    # Every key model.py passes to LLM() is an LLM API field of the release; the rest are the template's own keys.
    api = surface_13(fake_trtllm).llm_api[""]
    template = set(llmapi_template_keys(tree)[LLMAPI_TEMPLATE])
    for key in written:
        assert key == "triton_config" or key in api, key
    assert {"model", "backend", "triton_config"} <= template
    assert all(flag(LLMAPI_TRITON, k) for k in triton_llmapi.TEMPLATE_KEYS)
    with pytest.raises(Exception, match="no LLM API model"):
        triton_llmapi.build_repository(tmp_path / "empty", tmp_path / "repo2", body)


def test_llmapi_template_keys_read_the_real_shape(tmp_path):
    assert llmapi_template_keys(tmp_path) == {}
    keys = llmapi_template_keys(FAKE / "1.3" / "triton")[LLMAPI_TEMPLATE]
    data = json.loads((FAKE / "1.3" / "surface.json").read_text())
    assert keys == data["triton_templates"]["keys"][LLMAPI_TEMPLATE]
    assert {"triton_config.max_batch_size", "triton_config.decoupled"} <= set(keys)


def test_plugin_flags_cite_the_file_that_defines_them():
    from enginefoundry.lanes.trtllm_flags import TRTLLM_BUILD

    # build.py's parse_arguments has none of these: add_plugin_argument makes them from PluginConfig (plugin.py).
    for name in ("gemm_plugin", "gpt_attention_plugin", "remove_input_padding", "use_paged_context_fmha",
                 "use_fused_mlp", "multiple_profiles", "tokens_per_block"):
        assert "tensorrt_llm/plugin/plugin.py@" in flag(TRTLLM_BUILD, name).refs[0], name
    assert "plugin.py" not in " ".join(flag(TRTLLM_BUILD, "checkpoint_dir").refs)


def test_the_bundle_gets_the_repository_and_its_launch_command(tmp_path):
    lane = get_lane("trtllm")
    tree = FAKE / "1.3" / "triton"
    spec = spec_for("llama-3.1-8b-multiarch.yaml", triton=True, triton_dir=str(tree), triton_bundle_mount="/models/b")
    unit = expand_units(spec)[0]
    from enginefoundry.lanes.trtllm import runtime_config

    bundle = tmp_path / "bundle"
    bundle.mkdir()
    info, cmds = lane._triton_repository(lane.options(spec), bundle, tmp_path / "ckpt", runtime_config(spec, unit))
    assert info is not None and info.model_repo == "triton_model_repo" and info.checkpoint == "/models/b/checkpoint"
    assert cmds[0].argv[-2:] == ["--model_repo", "/models/b/triton_model_repo"] and info.launch == cmds[0].argv
    written = yaml.safe_load((bundle / "triton_model_repo/tensorrt_llm/1/model.yaml").read_text())
    assert written["max_batch_size"] == unit.profile.max_batch_size  # the LLM API option, not Triton batching
    off = spec_for("llama-3.1-8b-multiarch.yaml")
    assert lane._triton_repository(lane.options(off), bundle, tmp_path, {}) == (None, [])


def test_serve_takes_the_yaml_flag_the_probe_found_and_refuses_a_tampered_one(tmp_path, fake_trtllm):
    from enginefoundry.errors import ToolError
    from enginefoundry.lanes.trtllm import serve_yaml_flag

    surface = surface_13(fake_trtllm)
    assert serve_yaml_flag(surface) == "extra_llm_api_options" and serve_yaml_flag(None) == "extra_llm_api_options"
    renamed = surface.model_copy(deep=True)
    renamed.tools["trtllm-serve"].flags.remove("extra_llm_api_options")  # a release that kept only --config
    assert serve_yaml_flag(renamed) == "config"
    ckpt = tmp_path / "checkpoint"
    ckpt.mkdir()
    info = {"checkpoint": {"path": str(ckpt)}, "runtime_config": "llm_api_options.yaml", "autotuner_cache": None}
    for flag_name, ok in (("config", True), ("--max_batch_size 1 --host", False)):
        (tmp_path / "bundle.json").write_text(json.dumps({**info, "serve": {"yaml_flag": flag_name}}))
        if ok:
            assert "--config" in get_lane("trtllm").serve_command(tmp_path, "127.0.0.1", 8000).command.argv
        else:
            with pytest.raises(ToolError, match=r"serve\.yaml_flag"):
                get_lane("trtllm").serve_command(tmp_path, "127.0.0.1", 8000)
