"""The probe against the fake TensorRT-LLM 1.0/1.1/1.2 toolchains: real child processes (the worker's `python`,
each tool's `--help`), the refusals and the digest, per release, without a GPU."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml

from enginefoundry.errors import ToolError
from enginefoundry.inputs.toolchain import ToolSurface, UnsupportedByRelease
from enginefoundry.inputs.units import expand_units
from enginefoundry.lanes.trtllm import TrtllmLane
from enginefoundry.lanes.trtllm_engine import TrtllmEngineLane
from enginefoundry.spec import BuildSpec, parse_spec

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.fixture
def on_worker(monkeypatch, fake_trtllm):
    """A function release → its folder, with PATH and the fake worker interpreter set up like on a worker."""
    def setup(release: str) -> Path:
        root = fake_trtllm.release_dir(release)
        monkeypatch.setenv("PATH", f"{root / 'bin'}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("EF_FAKE_REAL_PYTHON", sys.executable)
        monkeypatch.setenv("EF_MODELOPT_DIR", str(root / "modelopt"))
        monkeypatch.setenv("EF_TRTLLM_EXAMPLES_DIR", str(root / "examples"))
        return root
    return setup


def engine_spec(release_dir: Path, version: str, **options) -> BuildSpec:
    data = yaml.safe_load((CONFIGS / "llama-3-70b-tp2-a100.yaml").read_text())
    data["toolchain"] = {"trtllm_version": version}
    data["variants"] = [{"precision": "fp16", "tp": 2}, {"precision": "fp8", "tp": 2, "kv_cache_dtype": "fp8"},
                        {"precision": "int8_wo", "tp": 2}]
    data["targets"] = [{"name": "h100", "arch": "sm90", "sku": ["H100"], "gpu_count": 2, "memory_gib": 80}]
    data["lane_options"] = {"gemm_plugin": "auto", "triton_dir": str(release_dir / "triton"), **options}
    return parse_spec(data, base_dir=CONFIGS)


def trtllm_spec(version: str, **options) -> BuildSpec:
    data = yaml.safe_load((CONFIGS / "llama-3.1-8b-multiarch.yaml").read_text())
    data["toolchain"] = {"trtllm_version": version}
    data["lane_options"] = options
    return parse_spec(data, base_dir=CONFIGS)


@pytest.mark.parametrize(("release", "version"), [("1.0", "1.0.0"), ("1.1", "1.1.0"), ("1.2", "1.2.1")])
def test_probe_reads_each_release_and_accepts_what_the_lanes_emit(on_worker, fake_trtllm, release, version):
    root = on_worker(release)
    expected = ToolSurface.model_validate(fake_trtllm.expected_surface(release))
    engine = TrtllmEngineLane(python=str(root / "bin" / "python"))
    spec = engine_spec(root, version)
    surface = engine.surface(spec)
    assert surface.tensorrt_llm == version and surface.modelopt == expected.modelopt
    assert surface.llm_api == expected.llm_api and surface.triton_templates == expected.triton_templates
    for tool in ("trtllm-build", "trtllm-serve", "convert_checkpoint.py", "quantize.py", "fill_template.py"):
        assert surface.tools[tool] == expected.tools[tool], tool
    for unit in expand_units(spec):
        engine.refuse_unsupported(spec, unit)  # every flag, value and template key is accepted
        serve = engine.describe(spec, unit, surface)[-1].argv
        assert serve[serve.index("--backend") + 1] == ("trt" if release == "1.0" else "tensorrt")

    lane = TrtllmLane(python=str(root / "bin" / "python"))
    tspec = trtllm_spec(version)
    tsurface = lane.surface(tspec)
    assert tsurface.tools["hf_ptq.py"] == expected.tools["hf_ptq.py"]
    for unit in expand_units(tspec):
        lane.refuse_unsupported(tspec, unit)
        cmds = lane.describe(tspec, unit, tsurface)
        assert all("calib_seq" not in " ".join(c.argv) for c in cmds)  # ModelOpt < 0.39 everywhere here
        assert any("TLLM_AUTOTUNER_CACHE_PATH" in c.env for c in cmds) is (release != "1.0")


def test_the_digest_differs_between_releases(on_worker):
    digests = set()
    for release in ("1.0", "1.1", "1.2"):
        root = on_worker(release)
        digests.add(TrtllmEngineLane(python=str(root / "bin" / "python")).surface(None).digest())
    assert len(digests) == 3


def test_an_option_key_the_release_lacks_is_refused_naming_it(on_worker):
    root = on_worker("1.1")
    lane = TrtllmLane(python=str(root / "bin" / "python"))
    spec = trtllm_spec("1.1.0", tokens_per_block=64)
    # NVIDIA's 1.1 templates carry kv_cache_config.tokens_per_block (issue 37): an installed 1.1 without it
    lane.surface(spec).llm_api["kv_cache_config"].remove("tokens_per_block")
    with pytest.raises(UnsupportedByRelease) as err:
        lane.refuse_unsupported(spec, expand_units(spec)[0])
    assert err.value.item == "LLM API option kv_cache_config.tokens_per_block"
    assert err.value.release.startswith("TensorRT-LLM 1.1.0") and err.value.fix
    root = on_worker("1.2")
    TrtllmLane(python=str(root / "bin" / "python")).refuse_unsupported(trtllm_spec("1.2.1", tokens_per_block=64),
                                                                        expand_units(spec)[0])


def test_a_build_flag_the_release_lacks_is_refused(on_worker, fake_trtllm):
    root = on_worker("1.0")
    lane = TrtllmEngineLane(python=str(root / "bin" / "python"))
    spec = engine_spec(root, "1.0.0")
    surface = lane.surface(spec)
    trimmed = surface.model_copy(deep=True)
    trimmed.tools["trtllm-build"].flags.remove("use_paged_context_fmha")
    unit = expand_units(spec)[0]
    from enginefoundry.inputs.toolchain import check_against_surface

    with pytest.raises(UnsupportedByRelease, match="trtllm-build --use_paged_context_fmha"):
        check_against_surface(lane.describe(spec, unit, trimmed), trimmed)


def test_the_pin_must_match_the_installed_release(on_worker):
    root = on_worker("1.1")
    lane = TrtllmEngineLane(python=str(root / "bin" / "python"))
    spec = engine_spec(root, "1.2.1")
    with pytest.raises(ToolError, match=r"pins TensorRT-LLM 1\.2\.1 .* has 1\.1\.0"):
        lane.refuse_unsupported(spec, expand_units(spec)[0])


def test_convert_is_refused_before_it_runs_on_another_release(on_worker, tmp_path):
    """The pin check and the flag check come before the conversion's GPU time: the fake tools fail if run."""
    root = on_worker("1.1")
    source = tmp_path / "hf"
    source.mkdir()
    (source / "config.json").write_text((CONFIGS / "model-configs" / "llama-3.1-8b-instruct.json").read_text())
    lane = TrtllmEngineLane(python=str(root / "bin" / "python"))
    spec = engine_spec(root, "1.2.1", examples_dir=str(root / "examples"))
    fp8 = next(v for v in spec.variants if v.precision.value == "fp8")
    with pytest.raises(ToolError, match=r"pins TensorRT-LLM 1\.2\.1 .* has 1\.1\.0"):
        lane.convert(spec, fp8, source, tmp_path / "work")
    assert not (tmp_path / "work" / "logs" / "convert.log").exists()
    ok = engine_spec(root, "1.1.0", examples_dir=str(root / "examples"))
    with pytest.raises(ToolError, match="only --help is implemented"):  # accepted, so it ran (and the fake fails)
        lane.convert(ok, next(v for v in ok.variants if v.precision.value == "fp8"), source, tmp_path / "work")


def test_the_build_stage_does_not_need_the_convert_tools(on_worker, monkeypatch):
    root = on_worker("1.2")
    monkeypatch.delenv("EF_TRTLLM_EXAMPLES_DIR")  # a build worker that only has the converted checkpoint
    lane = TrtllmEngineLane(python=str(root / "bin" / "python"))
    spec = engine_spec(root, "1.2.1")
    assert "convert_checkpoint.py" not in lane.surface(spec).tools
    for unit in expand_units(spec):
        lane.refuse_unsupported(spec, unit)


def test_a_13_toolchain_runs_the_trtllm_lane_with_triton_and_refuses_the_engine_lane(on_worker, fake_trtllm):
    """The fake 1.3 (no trtllm-build, convert_checkpoint.py, quantize.py, inflight_batcher_llm; the LLM API Triton
    model and the launcher kept): probed in child processes like on a worker."""
    root = on_worker("1.3")
    expected = ToolSurface.model_validate(fake_trtllm.expected_surface("1.3"))
    lane = TrtllmLane(python=str(root / "bin" / "python"))
    spec = trtllm_spec("1.3.0rc20", triton=True, triton_dir=str(root / "triton"))
    surface = lane.surface(spec)
    assert (surface.tensorrt_llm, surface.modelopt) == ("1.3.0rc20", "0.46.0")
    assert surface.triton_templates == expected.triton_templates
    assert surface.tools["trtllm-serve"].choices["backend"] == ["pytorch", "_autodeploy"]
    assert surface.tools["hf_ptq.py"] == expected.tools["hf_ptq.py"]
    for unit in expand_units(spec):
        lane.refuse_unsupported(spec, unit)  # serve flags, LLM API keys, launcher flags and model.yaml keys
        cmds = lane.describe(spec, unit, surface)
        assert cmds[-1].tool == "launch_triton_server.py"
        if unit.variant.precision.is_quantized:
            assert "--calib_seq" in cmds[0].argv and cmds[0].argv[1].endswith("examples/hf_ptq/hf_ptq.py")
    engine = TrtllmEngineLane(python=str(root / "bin" / "python"))
    with pytest.raises(ToolError, match=r"tensorrt-backend-removal.*lane: trtllm"):
        engine.versions()


@pytest.mark.parametrize(("release", "version", "reads"), [("1.0", "1.0.0", False), ("1.4", "1.4.0rc4", True)])
def test_the_probe_reads_the_autotuner_variable_from_the_installed_source(on_worker, release, version, reads):
    """Issue 37: an environment variable has no --help; past the registry's evidence (1.4) the probe greps the
    installed autotuner's source, and the 1.4 worker accepts every unit a 1.4 `plan` renders."""
    root = on_worker(release)
    lane = TrtllmLane(python=str(root / "bin" / "python"))
    spec = trtllm_spec(version)
    surface = lane.surface(spec)
    assert surface.env_reads == {"TLLM_AUTOTUNER_CACHE_PATH": reads} and surface.tensorrt_llm == version
    for unit in expand_units(spec):
        lane.refuse_unsupported(spec, unit)
        cmds = lane.describe(spec, unit, surface)
        assert any("TLLM_AUTOTUNER_CACHE_PATH" in c.env for c in cmds) is reads


@pytest.mark.parametrize(("release", "version"), [("1.0", "1.0.0"), ("1.2", "1.2.1"), ("1.4", "1.4.0rc4")])
def test_the_worker_probe_accepts_the_moe_parallel_units_of_the_qwen3_moe_spec(on_worker, release, version):
    """Issue 37 item 1: the shipped Qwen3-MoE spec's expert-parallel and attention-DP units, probed in child processes
    like on a worker: the installed TorchLlmArgs has moe_expert_parallel_size, moe_tensor_parallel_size and
    enable_attention_dp, so every unit is accepted before any download."""
    root = on_worker(release)
    lane = TrtllmLane(python=str(root / "bin" / "python"))
    data = yaml.safe_load((CONFIGS / "qwen3-30b-a3b-moe.yaml").read_text())
    data["toolchain"] = {"trtllm_version": version}
    spec = parse_spec(data, base_dir=CONFIGS)
    surface = lane.surface(spec)
    assert {"moe_expert_parallel_size", "moe_tensor_parallel_size", "enable_attention_dp"} <= set(
        (surface.llm_api or {})[""])
    units = expand_units(spec)
    assert {u.variant.name for u in units} >= {"bf16-tp8-ep8-adp", "bf16-tp8-ep8", "bf16-tp8-ep4"}
    for unit in units:
        lane.refuse_unsupported(spec, unit)
        keys = {k for c in lane.describe(spec, unit, surface) for k in c.llm_api_keys}
        assert "moe_expert_parallel_size" in keys
    # Its disaggregated variant: the router's --config_file read from `trtllm-serve disaggregated --help` in a child
    # process, each role's transceiver and overlap keys from TorchLlmArgs; a router without the flag is refused.
    assert "config_file" in surface.tools["trtllm-serve disaggregated"].flags
    [disagg] = [u for u in units if u.variant.disaggregated and u.target.name == "h100"]
    assert {"cache_transceiver_config", "disable_overlap_scheduler"} <= {
        k for c in lane.describe(spec, disagg, surface) for k in c.llm_api_keys}
    bare = surface.tools["trtllm-serve disaggregated"].model_copy(update={"flags": ["help"]})
    lane._surfaces = {k: v.model_copy(update={"tools": {**v.tools, "trtllm-serve disaggregated": bare}})
                      for k, v in lane._surfaces.items()}
    with pytest.raises(UnsupportedByRelease, match="trtllm-serve disaggregated --config_file"):
        lane.refuse_unsupported(spec, disagg)
