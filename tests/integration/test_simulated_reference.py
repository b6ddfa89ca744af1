"""A quantized unit judged against the quantization tool's simulated model (enginefoundry/smoke/simulated.py):
TensorRT-LLM's weight-only quantizer (int8_wo, int4_wo) or ModelOpt's fake quantization (int4_awq), written as a
plain checkpoint, served and judged by the real gate (issue 24). The tiny fixture model; ModelOpt for real (the
`simulate` extra) where a test needs it."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from enginefoundry.errors import InputError, ToolError
from enginefoundry.lanes.base import Command, ServeCommand
from enginefoundry.model_server import free_port, serving
from enginefoundry.smoke import SmokeInputs, load_prompt_set, run_smoke
from enginefoundry.smoke.simulated import SIMULATED, _fold, config_for, simulate, simulated_key, trtllm_weight_only
from enginefoundry.spec import SmokeSpec
from enginefoundry.spec.checks import SIMULATED_PRECISIONS
from tests.support.paths import REPO, TINY_MODEL, TINY_PROMPTS


def _needs_modelopt() -> None:
    pytest.importorskip("modelopt", reason="the `simulate` extra (nvidia-modelopt) is not installed")


def test_the_simulation_is_the_tools_quantization_written_as_a_plain_checkpoint(tmp_path: Path):
    import subprocess

    cases = load_prompt_set(TINY_PROMPTS).cases
    exited = subprocess.Popen(["true"])  # a process that has exited: its pid is dead (and not reused this soon)
    exited.wait()
    killed = tmp_path / f"{simulated_key(TINY_MODEL, 'int4_wo', cases).digest}.partial-{exited.pid}"
    killed.mkdir()
    (killed / "model.safetensors").write_bytes(b"half a simulation")  # what a kill -9 leaves
    sim = simulate(TINY_MODEL, "int4_wo", cases, root=tmp_path, progress=lambda _: None)
    assert not killed.exists()  # cleared before the simulation starts
    assert sim.source == "computed" and sim.modules == 14 and sim.awq_scaled == 0  # 2 layers × 7 projections
    src, got = load_file(TINY_MODEL / "model.safetensors"), load_file(sim.folder / "model.safetensors")
    q = got["model.layers.0.self_attn.q_proj.weight"]
    assert all(len(torch.unique(row)) <= 16 for row in q)  # int4 per output channel: 16 levels a row at most
    assert not torch.equal(q, src["model.layers.0.self_attn.q_proj.weight"])
    for name in ("model.embed_tokens.weight", "model.norm.weight", "model.layers.1.input_layernorm.weight"):
        assert torch.equal(got[name], src[name])  # only the linear projections are quantized
    assert (sim.folder / "tokenizer.json").read_bytes() == (TINY_MODEL / "tokenizer.json").read_bytes()
    again = simulate(TINY_MODEL, "int4_wo", cases, root=tmp_path, progress=lambda _: None)
    assert again.source == "local cache" and again.key == sim.key
    assert not list(tmp_path.glob("*partial*"))
    # Max calibration reads the weights alone: another prompt set finds the same simulation; AWQ's prompts are keyed.
    assert simulate(TINY_MODEL, "int4_wo", cases[:3], root=tmp_path, progress=lambda _: None).source == "local cache"
    assert simulated_key(TINY_MODEL, "int4_awq", cases) != simulated_key(TINY_MODEL, "int4_awq", cases[:3])


def test_the_weight_only_simulation_is_tensorrt_llms_arithmetic(tmp_path: Path):
    """symmetric_quantize (cutlass_preprocessors.cpp): steps of max/2^(bits-1), ties away from zero, clipped to the
    signed range (the largest weight to 7 steps at 4 bits), the step stored in the model dtype."""
    w = torch.tensor([[1.0, -0.5, 0.0625, 0.3, -0.0625], [0.0, 0.0, 0.0, 0.0, 0.0]])
    got, scale = trtllm_weight_only(w, 4)
    # step 1/8: codes 8 → 7 (clipped), -4, 0.5 → 1 and -0.5 → -1 (away from zero, not to even), 2.4 → 2
    assert got[0].tolist() == [0.875, -0.5, 0.125, 0.25, -0.125] and scale.tolist() == [0.125, 0.0]
    assert got[1].tolist() == [0.0] * 5  # an all-zero channel stays zero
    got8, _ = trtllm_weight_only(w[:1], 8)
    assert got8[0, 0].item() == 127 / 128  # the full int8 range: max/128, the largest weight clipped to 127

    cases = load_prompt_set(TINY_PROMPTS).cases
    sim = simulate(TINY_MODEL, "int8_wo", cases, root=tmp_path, progress=lambda _: None)
    src, out = load_file(TINY_MODEL / "model.safetensors"), load_file(sim.folder / "model.safetensors")
    name = "model.layers.1.mlp.down_proj.weight"
    # The fp32 tiny model's engine computes in fp16: its weights and scales are fp16's, not bf16's.
    assert torch.equal(out[name], trtllm_weight_only(src[name].float(), 8, "fp16")[0])
    assert not torch.equal(out[name], trtllm_weight_only(src[name].float(), 8, "bf16")[0])
    assert "lm_head.weight" not in out or torch.equal(out["lm_head.weight"], src["lm_head.weight"].float())
    assert sim.key.modelopt == "not used" and "per_channel_scale" in " ".join(
        load_file(sim.folder / "quantizers.safetensors"))


def test_awq_scales_fold_into_the_weights_and_an_activation_quantizer_is_refused(tmp_path: Path):
    _needs_modelopt()
    import modelopt.torch.quantization as mtq
    from transformers import AutoModelForCausalLM

    cases = load_prompt_set(TINY_PROMPTS).cases[:4]
    sim = simulate(TINY_MODEL, "int4_awq", cases, root=tmp_path, progress=lambda _: None)  # logits checked
    assert sim.awq_scaled == sim.modules > 0
    assert "pre_quant_scale" in " ".join(load_file(sim.folder / "quantizers.safetensors"))
    assert set(SIMULATED) == set(SIMULATED_PRECISIONS) and config_for("int4_wo") != config_for("int8_wo")

    w8a8 = AutoModelForCausalLM.from_pretrained(TINY_MODEL, dtype=torch.float32)
    mtq.quantize(w8a8, mtq.INT8_DEFAULT_CFG, lambda m: m(torch.tensor([[1, 5, 9]])))
    with pytest.raises(ToolError, match="quantizes its input"):
        _fold(w8a8)


def _serve(model: Path, tmp: Path):
    port = free_port()
    argv = [sys.executable, "-m", "enginefoundry.smoke.serve", str(model), "--port", str(port), "--name", "tiny"]
    cmd = ServeCommand(command=Command(argv=argv, env={"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)},
                                       description="enginefoundry scoring server"),
                       model_name="tiny", tokenizer_dir=str(model))
    return serving(cmd, tmp / f"{model.name}.log", timeout_s=120)


def _engine_build(sim_folder: Path, dst: Path, *, norm_scale: float = 1.0) -> Path:
    """The simulated weights stored in fp16, as a weight-only engine of the fp32 tiny model computes
    (convert_checkpoint.py makes an fp32 source fp16); optionally the final norm scaled."""
    dst.mkdir()
    for f in sim_folder.iterdir():
        if f.name not in (".simulated.json", "quantizers.safetensors"):
            shutil.copy2(f, dst / f.name)
    tensors = {k: v.to(torch.float16) for k, v in load_file(dst / "model.safetensors").items()}
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * norm_scale
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def test_a_quantized_unit_is_judged_against_its_simulation(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("EF_REFERENCE_CACHE", str(tmp_path / "refs"))
    monkeypatch.setenv("EF_CACHE_DIR", str(tmp_path / "cache"))
    prompts = load_prompt_set(TINY_PROMPTS)
    spec = SmokeSpec(prompts=str(TINY_PROMPTS), max_new_tokens=6, small_sample="warn")
    sim = simulate(TINY_MODEL, "int4_wo", prompts.cases, progress=lambda _: None)

    def judge(model: Path):
        with _serve(model, tmp_path) as ep:
            return run_smoke(SmokeInputs(spec, prompts, reference_dir=TINY_MODEL, base_url=ep.base_url,
                             model_name=ep.model_name, served_tokenizer_dir=model, precision="int4_wo",
                             progress=lambda _: None, simulated=True))

    healthy = judge(_engine_build(sim.folder, tmp_path / "int4_wo"))
    assert healthy.passed, healthy.verdict.reason
    # The fp32 tiny model's weight-only engine computes in fp16: so do its simulation and the spread.
    assert "simulated int4_wo" in healthy.verdict.reference_why and healthy.reference.dtype == "fp16"
    assert healthy.spread is not None and healthy.spread.precision == "fp16"  # measured on the simulation
    assert sim.key.config == simulated_key(TINY_MODEL, "int4_wo", prompts.cases, "fp16").config
    assert healthy.policy is not None and healthy.policy.family.value == "16-bit"
    rules = {r.name: r for r in healthy.verdict.rules}
    assert "quantization cost" in rules and "the simulated int4_wo model" in rules["quantization cost"].detail
    assert healthy.tokenizer_match is True

    # The final norm × 0.25: flatter logits (the tiny model is very sure of its tokens), the same greedy text.
    broken = judge(_engine_build(sim.folder, tmp_path / "int4_wo-norm", norm_scale=0.25))
    assert not broken.passed
    assert "teacher-forced log-prob distance" in [r.name for r in broken.verdict.failed]


def test_by_default_a_weight_only_unit_is_judged_like_with_like_and_fp8_against_the_quantization_spread(
        tmp_path: Path, monkeypatch):
    """Issue 39, at default settings (no `simulated`): an int8_wo unit is judged against its quantizer's simulation
    with the spread's tight bounds; an fp8 unit, which has no reference of its precision, against the fp32 source
    with bounds derived from the quantization spread (the source's weights rounded as fp8), and the verdict says so;
    `no_like_reference: refuse` refuses the fp8 unit before the endpoint is asked."""
    monkeypatch.setenv("EF_REFERENCE_CACHE", str(tmp_path / "refs"))
    monkeypatch.setenv("EF_CACHE_DIR", str(tmp_path / "cache"))
    prompts = load_prompt_set(TINY_PROMPTS)
    spec = SmokeSpec(prompts=str(TINY_PROMPTS), max_new_tokens=6, small_sample="warn")
    sim = simulate(TINY_MODEL, "int8_wo", prompts.cases, progress=lambda _: None)
    with _serve(_engine_build(sim.folder, tmp_path / "int8_wo"), tmp_path) as ep:
        def judge(precision: str, smoke: SmokeSpec = spec):
            return run_smoke(SmokeInputs(smoke, prompts, reference_dir=TINY_MODEL, base_url=ep.base_url,
                             model_name=ep.model_name, served_tokenizer_dir=None, precision=precision,
                             progress=lambda _: None))

        int8 = judge("int8_wo")
        fp8 = judge("fp8")
    assert int8.passed, int8.verdict.reason
    assert int8.verdict.reference_why.startswith("the quantization tool's simulated int8_wo model of the source")
    assert int8.spread is not None and int8.spread.reference_key == int8.reference.key
    assert fp8.reference.dtype == "fp32" and fp8.spread is not None
    assert fp8.spread.precision == "fp8-rounded weights in fp16 against fp32"
    assert "a weaker reference; bounds derived from the quantization spread" in fp8.verdict.reference_why
    rules = {r.name: r for r in fp8.verdict.rules}
    assert "measured at fp8-rounded weights in fp16 against fp32" in rules["teacher-forced log-prob distance"].detail
    assert rules["teacher-forced top-1 agreement"].kind == "divergence"  # judged, not only reported
    # Task accuracy against the fp8-rounded source; the rounding's own cost against the fp32 source is a rule apart.
    assert " vs the fp8-rounded source " in rules["task accuracy"].detail
    assert rules["quantization cost"].detail.startswith("the fp8-rounded source ")
    assert "vs the fp32 source" in rules["quantization cost"].detail
    assert (tmp_path / "refs" / f"{fp8.reference.key}.qspread-fp8-fp16-v1.json").is_file()
    refuse = SmokeSpec(prompts=str(TINY_PROMPTS), max_new_tokens=6, small_sample="warn", no_like_reference="refuse")
    with pytest.raises(InputError, match=r"smoke\.no_like_reference: refuse: a fp8 unit has no reference"):
        run_smoke(SmokeInputs(refuse, prompts, reference_dir=TINY_MODEL, base_url="http://127.0.0.1:9",
                              model_name="tiny",
                  served_tokenizer_dir=None, precision="fp8", progress=lambda _: None))


def test_a_precision_without_a_simulation_is_refused_before_the_endpoint_is_asked():
    spec = SmokeSpec(prompts=str(TINY_PROMPTS), max_new_tokens=6, small_sample="warn")
    with pytest.raises(InputError, match="fp8 is not simulated"):
        run_smoke(SmokeInputs(spec, load_prompt_set(TINY_PROMPTS), reference_dir=TINY_MODEL, base_url="http://127.0.0.1:9",
                  model_name="tiny", served_tokenizer_dir=None, precision="fp8", progress=lambda _: None,
                  simulated=True))


def test_the_smoke_command_says_which_precisions_it_simulates(tmp_path: Path):
    import subprocess

    argv = [sys.executable, "-m", "enginefoundry.cli", "smoke", "--endpoint", "http://127.0.0.1:9",
            "--served-model", "tiny", "--reference", str(TINY_MODEL), "--prompts", str(TINY_PROMPTS),
            "--precision", "nvfp4", "--reference-precision", "simulated", "--small-sample", "warn"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(tmp_path)})
    assert proc.returncode == 2, proc.stderr  # bad input: nothing judged, no traceback
    assert "nvfp4 is not simulated" in proc.stderr and "Traceback" not in proc.stderr
    assert "int4_awq, int4_wo, int8_wo" in proc.stderr


def test_the_pipelines_stages_judge_a_quantized_unit_against_its_simulation(tmp_path: Path, monkeypatch):
    """`smoke.reference_precision: simulated` in a spec: the reference stage simulates and computes both references
    (the simulation's and the source's for the quantization-cost rule); the smoke stage judges with them."""
    import yaml

    from enginefoundry.spec import parse_spec
    from enginefoundry.tasks.smoke import smoke_reference, smoke_test
    from tests.support.paths import CONFIGS

    monkeypatch.setenv("EF_REFERENCE_CACHE", str(tmp_path / "refs"))
    monkeypatch.setenv("EF_CACHE_DIR", str(tmp_path / "cache"))
    data = yaml.safe_load((CONFIGS / "tiny-cpu.yaml").read_text())
    data["smoke"].update(reference_precision="simulated", max_new_tokens=6, small_sample="warn",
                         prompts=str(TINY_PROMPTS))
    data["publish"]["store"] = (tmp_path / "store").as_uri()
    spec = parse_spec(data, source="test spec", base_dir=CONFIGS)

    ref, outcome = smoke_reference.fn(spec, str(TINY_MODEL), precision="int8_wo")
    assert outcome.simulated is not None and "simulated int8_wo" in outcome.simulated
    # Issue 39: the simulated model lies under the reference cache the user chose, not the default cache root.
    assert outcome.dtype == "fp16" and Path(outcome.model_dir).parent == tmp_path / "refs" / "simulated"
    assert outcome.label().startswith(f"fp16 reference {outcome.key[:12]} of simulated int8_wo (TensorRT-LLM's ")
    published = sorted(p.name for p in (tmp_path / "store").rglob("*.json"))
    assert len([n for n in published if "spread" not in n]) == 2  # the simulation's answers and the source's

    build = _engine_build(Path(outcome.model_dir), tmp_path / "int8_wo")
    with _serve(build, tmp_path) as ep:
        report = smoke_test.fn(spec, ep, str(TINY_MODEL), str(tmp_path / "report"), precision="int8_wo",
                               reference=(ref, outcome))
    assert report.passed, report.verdict.reason
    assert report.reference.key == outcome.key and report.verdict.reference_why.startswith(
        "the quantization tool's simulated int8_wo model of the source")
    assert report.spread is not None and report.spread.reference_key == outcome.key  # measured on the simulation
    assert "quantization cost" in [r.name for r in report.verdict.rules]
    assert "| why that reference | the quantization tool's simulated int8_wo" in \
        (tmp_path / "report" / "smoke.md").read_text()


def _exported_int4_awq(tmp: Path, cases) -> tuple[Path, Path, dict]:
    """A model whose linears ModelOpt can export as int4 (tests.support.modelopt_export.widened_tiny_model), quantized
    with INT4_AWQ_CFG and exported as hf_ptq.py exports it: (source, checkpoint, the fake-quant model's folded weights
    before the export)."""
    from modelopt.torch.export import export_hf_checkpoint

    from tests.support.modelopt_export import int4_awq_quantized, widened_tiny_model

    src = widened_tiny_model(tmp / "wide")
    model = int4_awq_quantized(src, [c.chat() for c in cases[:4]])
    with torch.no_grad():
        folded, _ = _fold(model)
    export_hf_checkpoint(model, export_dir=tmp / "export")
    return src, tmp / "export", folded


def test_the_lanes_int4_awq_checkpoint_dequantizes_to_modelopts_weights(tmp_path: Path):
    """ModelOpt's packing read back exactly; a layer the export does not resmooth equals ModelOpt's own model."""
    _needs_modelopt()
    from modelopt.torch.export.quant_utils import pack_int4_in_uint8

    from enginefoundry.inputs.dequantize import unpack_int4
    from enginefoundry.smoke.simulated import dequantized_checkpoint, export_problem, exported_quant_algo

    codes = torch.randint(-8, 8, (6, 256)).float()
    assert torch.equal(unpack_int4(pack_int4_in_uint8(codes, torch.ones(6, 2), 128)).float(), codes)

    src, export, folded = _exported_int4_awq(tmp_path, load_prompt_set(TINY_PROMPTS).cases)
    assert exported_quant_algo(export) == "W4A16_AWQ" and exported_quant_algo(src) is None
    assert export_problem(export) is None and "no hf_quant_config.json" in (export_problem(src) or "")
    import json

    kv = tmp_path / "kv-fp8"
    shutil.copytree(export, kv)
    cfg = json.loads((kv / "hf_quant_config.json").read_text())
    cfg["quantization"]["kv_cache_quant_algo"] = "FP8"
    (kv / "hf_quant_config.json").write_text(json.dumps(cfg))
    assert "KV cache is quantized (FP8)" in (export_problem(kv) or "")  # the engine's KV: no plain checkpoint
    deq = dequantized_checkpoint(export, tokenizer_from=src, root=tmp_path / "deq", progress=lambda _: None)
    assert deq.modules == 14 and deq.key.precision == "int4_awq"
    weights = load_file(deq.folder / "model.safetensors")
    for name in ("model.layers.0.self_attn.o_proj.weight", "model.layers.1.mlp.down_proj.weight"):
        assert torch.allclose(weights[name], folded[name], rtol=0, atol=1e-6 * float(folded[name].abs().max()))
    assert (deq.folder / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()
    assert dequantized_checkpoint(export, tokenizer_from=src, root=tmp_path / "deq").source == "local cache"


def test_the_pipelines_stages_judge_a_trtllm_int4_awq_unit_against_its_dequantized_checkpoint(tmp_path: Path,
                                                                                            monkeypatch):
    _needs_modelopt()
    import yaml

    from enginefoundry.spec import parse_spec
    from enginefoundry.tasks.smoke import smoke_reference, smoke_test
    from tests.support.paths import CONFIGS

    monkeypatch.setenv("EF_REFERENCE_CACHE", str(tmp_path / "refs"))
    monkeypatch.setenv("EF_CACHE_DIR", str(tmp_path / "cache"))
    src, export, _ = _exported_int4_awq(tmp_path, load_prompt_set(TINY_PROMPTS).cases)
    data = yaml.safe_load((CONFIGS / "llama-3.1-8b-multiarch.yaml").read_text())  # lane trtllm
    data["variants"] = [{"precision": "int4_awq"}]
    data["smoke"] = {"prompts": str(TINY_PROMPTS), "reference_precision": "simulated", "max_new_tokens": 6,
                     "small_sample": "warn"}
    data["publish"]["store"] = (tmp_path / "store").as_uri()
    spec = parse_spec(data, source="test spec", base_dir=CONFIGS)

    ref, outcome = smoke_reference.fn(spec, str(src), precision="int4_awq", checkpoint_dir=str(export))
    assert outcome.simulated is not None and "the lane's checkpoint" in outcome.simulated
    assert outcome.simulated_why is not None and outcome.simulated_why.startswith("the lane's own quantized")
    with _serve(_engine_build(Path(outcome.model_dir), tmp_path / "int4_awq"), tmp_path) as ep:
        report = smoke_test.fn(spec, ep, str(src), str(tmp_path / "report"), precision="int4_awq",
                               reference=(ref, outcome))
    assert report.passed, report.verdict.reason
    assert report.verdict.reference_why.startswith("the lane's own quantized checkpoint (ModelOpt's unified export)")
    assert report.spread is not None and report.policy is not None and report.policy.family.value == "16-bit"

    plain = smoke_reference.fn(spec, str(src), precision="int4_awq", checkpoint_dir=str(src))  # not an export
    assert plain[1].simulated is None and plain[1].dtype == "fp32"


def test_the_smoke_command_refuses_a_checkpoint_that_is_no_export(tmp_path: Path):
    import subprocess

    argv = [sys.executable, "-m", "enginefoundry.cli", "smoke", "--endpoint", "http://127.0.0.1:9",
            "--served-model", "tiny", "--reference", str(TINY_MODEL), "--prompts", str(TINY_PROMPTS),
            "--precision", "int4_awq", "--reference-precision", "simulated", "--small-sample", "warn",
            "--quantized-checkpoint", str(TINY_MODEL)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(tmp_path)})
    assert proc.returncode == 2, proc.stderr  # before the endpoint is asked: nothing listens on port 9
    assert "is not read: not a ModelOpt unified checkpoint" in proc.stderr and "Traceback" not in proc.stderr


def _stored_as(dtype: torch.dtype, dst: Path, *, norm_scale: float = 1.0) -> Path:
    """The tiny model with its weights stored (and so served) in `dtype`; optionally its final norm scaled."""
    shutil.copytree(TINY_MODEL, dst)
    tensors = {k: v.to(dtype) for k, v in load_file(dst / "model.safetensors").items()}
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * norm_scale
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def test_a_16_bit_unit_against_an_explicit_fp32_reference_is_bounded_by_its_casts_spread(tmp_path: Path,
                                                                                          monkeypatch):
    """smoke.reference_precision: fp32 for a bf16 unit: the bounds come from the spread of the source's weights cast to
    bf16 against the fp32 reference, not the 16-bit family's table (0.15, 20 × a healthy copy's distance on the lent
    H100, docs/scale.md). A healthy bf16 copy passes; one whose final norm is scaled by 0.5
    is rejected by it, where the table's limit would have let it through."""
    monkeypatch.setenv("EF_REFERENCE_CACHE", str(tmp_path / "refs"))
    monkeypatch.setenv("EF_CACHE_DIR", str(tmp_path / "cache"))
    prompts = load_prompt_set(TINY_PROMPTS)
    spec = SmokeSpec(prompts=str(TINY_PROMPTS), max_new_tokens=6, small_sample="warn", reference_precision="fp32")

    def judge(model: Path):
        with _serve(model, tmp_path) as ep:
            return run_smoke(SmokeInputs(spec, prompts, reference_dir=TINY_MODEL, base_url=ep.base_url,
                             model_name=ep.model_name, served_tokenizer_dir=model, precision="bf16",
                             progress=lambda _: None))

    healthy = judge(_stored_as(torch.bfloat16, tmp_path / "bf16"))
    assert healthy.passed, healthy.verdict.reason
    assert healthy.reference.dtype == "fp32" and healthy.spread is not None
    assert healthy.spread.precision == "bf16-cast weights against fp32"
    assert "bounds derived from the spread of the source cast to bf16" in healthy.verdict.reference_why
    tf = {r.name: r for r in healthy.verdict.rules}["teacher-forced log-prob distance"]
    assert "measured at bf16-cast weights against fp32" in tf.detail
    limit = healthy.spread.max_mean_abs_diff
    assert limit < 0.15  # tighter than the 16-bit family's table
    assert (tmp_path / "refs" / f"{healthy.reference.key}.qspread-bf16-bf16-v1.json").is_file()

    broken = judge(_stored_as(torch.bfloat16, tmp_path / "bf16-norm", norm_scale=0.5))
    failed = [r.name for r in broken.verdict.failed]
    assert "teacher-forced log-prob distance" in failed, broken.verdict.reason
    teacher = broken.teacher_forced
    assert teacher is not None and teacher.mean_abs_diff is not None
    assert limit < teacher.mean_abs_diff < 0.15  # the table would have passed it
