"""NVIDIA's headline pre-quantized sources (issue 36 item 5): an FP8 and an NVFP4 ModelOpt export, made here with the
`simulate` extra, are read, dequantized exactly as ModelOpt dequantizes them, and judged against a reference that
quantizes each linear's input as the engine does: for FP8, the same logits as ModelOpt's own fake quantization (which
runs on the CPU); for NVFP4, whose fake quantization needs CUDA, the weights and the input quantization each equal to
ModelOpt's own NVFP4 quantizer. Lane trtllm plans them without hf_ptq; the reference lane plans and runs the FP8 one
(its weights dequantized, its inputs as transformers computes them) and the real gate passes it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from enginefoundry.identity import TOKENIZER_FILES
from enginefoundry.inputs.dequantize import ACTIVATIONS_FILE, dequantize, quantize_nvfp4, read_activations
from enginefoundry.inputs.quantized_source import read_quantization
from enginefoundry.inputs.sources import fetch
from enginefoundry.inputs.units import expand_units
from enginefoundry.lanes import get_lane
from enginefoundry.lanes.base import Command, ServeCommand
from enginefoundry.model_server import free_port, serving
from enginefoundry.planning.plan_report import plan_report
from enginefoundry.smoke import load_prompt_set
from enginefoundry.spec import BuildSpec, parse_spec
from enginefoundry.tasks.smoke import smoke_reference, smoke_test
from tests.support.paths import CONFIGS, REPO, TINY_PROMPTS

pytest.importorskip("modelopt", reason="the `simulate` extra (nvidia-modelopt) is not installed")

# ModelOpt's FP8 fake quantization against the dequantized export with its inputs quantized here: the same formats,
# the same scales; what differs is the order of float32 operations.
MAX_RELATIVE_LOGIT_ERROR = 1e-3


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:  # JSON edge: paths and the FP8 model
    """The widened tiny model, the logits of its FP8 ModelOpt model (fake-quantized) and its FP8 and NVFP4 exports
    (≈5 s)."""
    from modelopt.torch.export import export_hf_checkpoint

    from tests.support.modelopt_export import make_export, modelopt_quantized, widened_tiny_model

    tmp = tmp_path_factory.mktemp("modelopt-fp")
    prompts = [c.chat() for c in load_prompt_set(TINY_PROMPTS).cases[:4]]
    original = widened_tiny_model(tmp / "original")
    import modelopt.torch.quantization as mtq

    fp8_model = modelopt_quantized(original, mtq.FP8_DEFAULT_CFG, prompts)
    fp8_logits = _logits(fp8_model, original)  # before the export, which replaces the model's weights by its codes
    export_hf_checkpoint(fp8_model, export_dir=tmp / "fp8")
    for f in original.iterdir():
        if f.name in TOKENIZER_FILES:
            (tmp / "fp8" / f.name).write_bytes(f.read_bytes())
    return {"original": original, "fp8": tmp / "fp8", "fp8_logits": fp8_logits, "prompts": prompts,
            "nvfp4": make_export(tmp, original, "nvfp4", prompts)}


def _tensors(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def _logits(model: Any, folder: Path) -> Any:
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok("the quick brown fox jumps over the lazy dog, twice", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return model(ids).logits


def test_the_fp8_reference_computes_what_modelopts_own_fake_quantization_computes(made: dict[str, Any],
                                                                                  tmp_path: Path):
    from transformers import AutoModelForCausalLM

    from enginefoundry.inputs.dequantize import simulate_activations
    from enginefoundry.smoke.simulated import dequantized_checkpoint

    quant = read_quantization(made["fp8"])
    assert quant is not None and (quant.quant_algo, quant.precision.value) == ("FP8", "fp8")
    assert quant.dequantizable and quant.quantizes_activations
    theirs = made["fp8_logits"]
    ref = dequantized_checkpoint(made["fp8"], tokenizer_from=made["original"], root=tmp_path, progress=lambda _: None)
    acts = read_activations(ref.folder)
    assert acts is not None and acts.quant_algo == "FP8" and len(acts.input_scales) == ref.modules == 14
    model = AutoModelForCausalLM.from_pretrained(ref.folder).eval()
    assert simulate_activations(model, ref.folder) == 14
    scale = theirs.abs().max()
    assert ((_logits(model, ref.folder) - theirs).abs().max() / scale) < MAX_RELATIVE_LOGIT_ERROR
    # Without the inputs quantized (what the reference lane serves), the logits are not ModelOpt's: the check bites.
    plain = dequantized_checkpoint(made["fp8"], tokenizer_from=made["original"], root=tmp_path,
                                   progress=lambda _: None, activations=False)
    assert plain.key.digest != ref.key.digest and not (plain.folder / ACTIVATIONS_FILE).exists()
    unquantized_inputs = AutoModelForCausalLM.from_pretrained(plain.folder).eval()
    assert ((_logits(unquantized_inputs, plain.folder) - theirs).abs().max() / scale) > 10 * MAX_RELATIVE_LOGIT_ERROR


def test_nvfp4_weights_and_inputs_are_what_modelopts_nvfp4_quantizer_makes(made: dict[str, Any]):
    import torch
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

    quant = read_quantization(made["nvfp4"])
    assert quant is not None and (quant.quant_algo, quant.group_size) == ("NVFP4", 16) and quant.dequantizable
    original = _tensors(made["original"])
    tensors, done = dequantize(_tensors(made["nvfp4"]), quant.quant_algo, quant.group_size)
    assert done.layers == 14 and done.activations is not None and done.activations.block_size == 16
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight"):
        q, scale, scale_2 = NVFP4QTensor.quantize(original[name], 16)
        expected = q.dequantize(dtype=torch.float32, scale=scale, double_scale=scale_2, block_sizes={-1: 16})
        assert torch.equal(tensors[name], expected), name
    # An input quantized as the engine quantizes it: ModelOpt's quantizer with the export's global input scale.
    torch.manual_seed(0)
    x = torch.randn(3, 5, 128) * 4
    s = torch.tensor(done.activations.input_scales["model.layers.0.self_attn.q_proj"])
    q, scale, _ = NVFP4QTensor.quantize(x, 16, weights_scaling_factor_2=s)
    expected = q.dequantize(dtype=torch.float32, scale=scale, double_scale=s, block_sizes={-1: 16})
    ours = quantize_nvfp4(x, float(s))
    assert torch.allclose(ours, expected, rtol=0, atol=1e-6 * float(x.abs().max())), (ours - expected).abs().max()
    assert not torch.equal(ours, x)


def _spec(tmp: Path, source: Path, precision: str, base: str = "tiny-cpu.yaml") -> BuildSpec:
    data = yaml.safe_load((CONFIGS / base).read_text())
    data["model"] = {"source": str(source), "name": "tiny-prequant"}
    data["variants"] = [{"precision": precision}]
    data["smoke"] = {"prompts": str(TINY_PROMPTS), "max_new_tokens": 6, "small_sample": "warn"}
    data["publish"]["store"] = (tmp / "store").as_uri()
    if base != "tiny-cpu.yaml":
        data["targets"] = [t for t in data["targets"] if t["arch"] == "sm90"][:1]
    return parse_spec(data, source="test spec", base_dir=CONFIGS)


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_both_lanes_plan_the_export_without_a_second_quantization(made: dict[str, Any], tmp_path: Path, fmt: str):
    algo = fmt.upper()
    ref_report = plan_report(_spec(tmp_path, made[fmt], fmt))
    [row] = ref_report.rows
    assert row["verdict"] == "ok" and row["reference"].startswith(f"the pre-quantized {fmt} source, dequantized")
    [commands] = ref_report.commands.values()
    assert f"dequantize {algo}" in commands[0] and not any("hf_ptq" in c for c in commands)
    assert "its inputs quantized" not in row["reference"]  # lane reference serves the dequantized weights
    spec = _spec(tmp_path, made[fmt], fmt, base="llama-3.1-8b-multiarch.yaml")
    trt_report = plan_report(spec)
    assert all(r["reference"].startswith(f"the pre-quantized {fmt} source, dequantized, its inputs quantized as the "
                                         "engine's") for r in trt_report.rows), trt_report.rows
    for commands in trt_report.commands.values():
        assert "convert (no PTQ)" in commands[0] and algo in commands[0], commands
        assert not any("hf_ptq" in c for c in commands), commands
    assert get_lane("trtllm").quantizes_activations and not get_lane("reference").quantizes_activations
    # A precision that contradicts the export is refused with the fix, as for every pre-quantized source.
    other = "nvfp4" if fmt == "fp8" else "fp8"
    [bad] = plan_report(_spec(tmp_path, made[fmt], other)).rows
    assert "contradicts the source's quantization" in json.dumps(bad), bad


def test_the_fp8_export_runs_on_the_reference_lane_and_the_gate_passes_it(made: dict[str, Any], tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("EF_REFERENCE_CACHE", str(tmp_path / "refs"))
    monkeypatch.setenv("EF_CACHE_DIR", str(tmp_path / "cache"))
    spec = _spec(tmp_path, made["fp8"], "fp8")
    snapshot = fetch(spec.model.parsed_source(spec.base_path), progress=lambda _: None)
    assert snapshot.quantization is not None and snapshot.quantization.quant_algo == "FP8"
    lane = get_lane(spec.lane)
    [unit] = expand_units(spec)
    converted = lane.convert(spec, unit.variant, Path(snapshot.local_dir), tmp_path / "work")
    ckpt = Path(converted.checkpoint_dir)
    assert converted.params["prequantized"]["quant_algo"] == "FP8"
    assert "inputs not quantized" in converted.params["dequantized"]
    assert read_quantization(ckpt) is None and not (ckpt / ACTIVATIONS_FILE).exists()
    built = lane.build(spec, unit, ckpt, tmp_path / "work")
    cmd = lane.smoke_serve_command(Path(built.bundle_dir), "127.0.0.1", free_port(), spec.model.name,
                                   spec.lane_options)
    cmd.command.env["PYTHONPATH"] = str(REPO)
    ref, outcome = smoke_reference.fn(spec, snapshot.local_dir, snapshot.weights_digest, precision="fp8",
                                      checkpoint_dir=str(ckpt))
    assert outcome.simulated is not None and "its inputs quantized" not in outcome.simulated
    with serving(cmd, tmp_path / "server.log", timeout_s=120) as ep:
        gated = smoke_test.fn(spec, ep, snapshot.local_dir, str(tmp_path / "report"), precision="fp8",
                              weights_digest=snapshot.weights_digest, reference=(ref, outcome))
    assert gated.passed, gated.verdict.reason
    assert gated.verdict.reference_why is not None
    assert gated.verdict.reference_why.startswith("the pre-quantized source's own checkpoint")


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_a_trtllm_unit_is_judged_against_its_own_export_with_its_inputs_quantized(made: dict[str, Any], fmt: str,
                                                                                  tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch):
    """Lane trtllm quantizes an unquantized source with hf_ptq.py into the same unified export: its fp8 and nvfp4
    units are judged against that export dequantized, inputs quantized (like with like, the spread measured), not
    the fp32 source; an engine computing the export in fp16 with its inputs quantized (the scoring server honours
    the folder's input quantization) passes."""


    from enginefoundry.planning import dequantizes

    monkeypatch.setenv("EF_REFERENCE_CACHE", str(tmp_path / "refs"))
    monkeypatch.setenv("EF_CACHE_DIR", str(tmp_path / "cache"))
    data = yaml.safe_load((CONFIGS / "llama-3.1-8b-multiarch.yaml").read_text())
    data["model"] = {"source": str(made["original"]), "name": "tiny"}
    data["variants"] = [{"precision": fmt}]
    data["targets"] = [t for t in data["targets"] if t["arch"] == "sm90"][:1]
    data["smoke"] = {"prompts": str(TINY_PROMPTS), "max_new_tokens": 6, "small_sample": "warn"}
    data["publish"]["store"] = (tmp_path / "store").as_uri()
    spec = parse_spec(data, source="test spec", base_dir=CONFIGS)
    assert dequantizes(spec, fmt)
    rows = plan_report(spec).rows
    assert rows and all(r["reference"].startswith(f"the lane's {fmt} checkpoint, dequantized") for r in rows), rows

    ref, outcome = smoke_reference.fn(spec, str(made["original"]), precision=fmt, checkpoint_dir=str(made[fmt]))
    assert outcome.simulated is not None and "its inputs quantized as the engine does" in outcome.simulated
    assert outcome.simulated_why is not None and outcome.simulated_why.startswith("the lane's own quantized")
    engine, broken = _engine(outcome.model_dir, tmp_path / "engine"), _engine(outcome.model_dir, tmp_path / "broken",
                                                                               norm_scale=1.5)
    assert (engine / ACTIVATIONS_FILE).is_file()
    with _scoring_server(engine, tmp_path) as ep:
        report = smoke_test.fn(spec, ep, str(made["original"]), str(tmp_path / "report"), precision=fmt,
                               reference=(ref, outcome))
    with _scoring_server(broken, tmp_path) as ep:  # its final norm scaled by 1.5: a broken build of the same export
        rejected = smoke_test.fn(spec, ep, str(made["original"]), str(tmp_path / "report-broken"), precision=fmt,
                                 reference=(ref, outcome))
    assert not rejected.passed, rejected.verdict.reason
    assert report.passed, report.verdict.reason
    assert report.spread is not None
    assert report.verdict.reference_why is not None
    assert report.verdict.reference_why.startswith("the lane's own quantized checkpoint")


def _engine(folder: str, dst: Path, norm_scale: float = 1.0) -> Path:
    """The dequantized export in fp16, as an engine of the fp32 tiny model computes it (its input quantization kept
    beside it); optionally its final norm scaled."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(folder, dst, ignore=shutil.ignore_patterns(".simulated.json"))
    tensors = {k: v.to(torch.float16) for k, v in load_file(dst / "model.safetensors").items()}
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * norm_scale
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def _scoring_server(model: Path, tmp: Path) -> Any:
    cmd = ServeCommand(command=Command(argv=[sys.executable, "-m", "enginefoundry.smoke.serve", str(model), "--port",
                                             str(free_port()), "--name", "tiny"],
                                       env={"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)},
                                       description="enginefoundry scoring server"),
                       model_name="tiny", tokenizer_dir=str(model))
    return serving(cmd, tmp / f"{model.name}.log", timeout_s=120)
