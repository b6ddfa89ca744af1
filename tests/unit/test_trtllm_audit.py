"""The audit's findings of issue 23 (deliverable 4), one test each, plus the audit matrix: `plan` and `validate`
answer every spec of lanes × releases × precisions × architectures with a verdict, never a traceback."""

from __future__ import annotations

import importlib.util
import itertools
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from enginefoundry.cli import main
from enginefoundry.errors import SpecError
from enginefoundry.lanes.trtllm_flags import KNOWN_IMAGES, image_release_problem
from enginefoundry.planning.plan_report import plan_report
from enginefoundry.planning.validate import validate_file
from enginefoundry.spec import Arch, Precision, parse_spec
from tests.support.paths import CONFIGS, FIXTURES

FAKE = FIXTURES / "fake-trtllm"
RELEASES = {"1.0": "1.0.0", "1.1": "1.1.0", "1.2": "1.2.1"}
PROMPT_KEY = "prompt_embedding_table_data_type"


def _generate_module():
    spec = importlib.util.spec_from_file_location("fake_generate_audit", FAKE / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _surface(release: str) -> dict:
    return json.loads((FAKE / release / "surface.json").read_text())


def _spec_data(config: str, **fields) -> dict:
    data = yaml.safe_load((CONFIGS / config).read_text())
    data.update(fields)
    return data


def _write(tmp_path: Path, data: dict, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    for key in ("prompts",):  # relative inputs resolve against the spec's folder
        src = CONFIGS / key
        if not (tmp_path / key).exists():
            shutil.copytree(src, tmp_path / key)
    path.write_text(yaml.safe_dump(data))
    return path


# --- finding 1: ${prompt_embedding_table_data_type} in tensorrt_llm_bls ----------------------------------------

def test_the_fixture_templates_carry_the_upstream_key_sets():
    gen = _generate_module()
    for model, facts in gen.TEMPLATE_FACTS.items():
        assert re.search(r"config\.pbtxt@[0-9a-f]{40}$", facts["source"]), model
    for release in RELEASES:
        keys = _surface(release)["triton_templates"]["keys"]
        structural = _surface(release)["triton_templates"]["structural"]
        assert "enable_trt_overlap" in keys["tensorrt_llm"] and "hf_model_path" in keys["preprocessing"]
        bls = keys["tensorrt_llm_bls"]
        if release == "1.0":  # the backend's 1.0 docs/llama.md fills it for neither template
            assert len(bls) == 8 and PROMPT_KEY not in bls and PROMPT_KEY not in keys["tensorrt_llm"]
        else:  # nine keys in release 1.1 and 1.2, a data_type Triton parses
            assert len(bls) == 9 and PROMPT_KEY in structural["tensorrt_llm_bls"]
            assert PROMPT_KEY in structural["tensorrt_llm"]


def test_plan_renders_the_bls_key_for_the_pinned_release():
    spec = parse_spec(_spec_data("llama-3-70b-tp2-a100.yaml"), base_dir=CONFIGS)
    assert spec.toolchain.trtllm_version and not spec.toolchain.trtllm_version.startswith("1.0")
    report = plan_report(spec)
    fills = [c for cmds in report.commands.values() for c in cmds if "tensorrt_llm_bls/config.pbtxt" in c]
    assert fills and all(f"{PROMPT_KEY}:" in c for c in fills)


# --- finding 2: int8_wo / int4_wo on the trtllm lane --------------------------------------------------------

@pytest.mark.parametrize("precision", ["int8_wo", "int4_wo"])
def test_plan_and_validate_refuse_weight_only_on_the_trtllm_lane(tmp_path, capsys, precision):
    data = _spec_data("llama-3.1-8b-multiarch.yaml", variants=[{"precision": precision}])
    report = plan_report(parse_spec(data, base_dir=CONFIGS))
    assert report.refused == len(report.rows) and all(precision in r["verdict"] for r in report.rows)
    with pytest.raises(SpecError) as err:
        validate_file(_write(tmp_path, data))
    assert [p[0] for p in err.value.problems] == ["variants.0.precision"]
    assert main(["plan", str(_write(tmp_path, data))]) == 2
    assert "Traceback" not in capsys.readouterr().err


# --- finding 4: the Triton TRT-LLM images and their releases ------------------------------------------------

# Issue 37: every row from NVIDIA's Triton compatibility matrix (trtllm-python-py3), the only source of what an image
# ships; 25.11 ships 1.0.3 (the matrix's 1.0.3.2510), not the 1.2.0rc2 of the r25.11 backend Dockerfile.
@pytest.mark.parametrize(("tag", "ships"), [("25.09", "1.0.0"), ("25.10", "1.0.0"), ("25.11", "1.0.3"),
                                            ("25.12", "1.1.0")])
def test_the_triton_images_name_their_release(tag, ships):
    image = f"nvcr.io/nvidia/tritonserver:{tag}-trtllm-python-py3"
    release, source = KNOWN_IMAGES[image]
    assert release == ships and "compatibility matrix" in source and f"{tag} → {ships}" in source


def test_images_the_matrix_does_not_list_are_unknown_not_guessed():
    from enginefoundry.lanes.trtllm_flags import UNVERIFIED_IMAGES, image_release

    assert set(KNOWN_IMAGES) == {f"nvcr.io/nvidia/tritonserver:{t}-trtllm-python-py3"
                                 for t in ("25.09", "25.10", "25.11", "25.12")}
    for image in UNVERIFIED_IMAGES:  # the backend Dockerfiles' claims: shown in the docs, never used
        assert image_release(image) is None and image_release_problem("1.2.1", image) is None
    # 25.11 with its Dockerfile's 1.2.0rc2 pinned: refused with the matrix's release
    assert "ships TensorRT-LLM 1.0.3" in image_release_problem(
        "1.2.0rc2", "nvcr.io/nvidia/tritonserver:25.11-trtllm-python-py3")


def test_validate_refuses_a_1_2_1_pin_with_the_25_12_image(tmp_path):
    image = "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"
    assert "ships TensorRT-LLM 1.1.0" in image_release_problem("1.2.1", image)
    assert image_release_problem("1.1.0", image) is None
    data = _spec_data("llama-3.1-8b-multiarch.yaml", toolchain={"trtllm_version": "1.2.1", "image": image})
    with pytest.raises(SpecError) as err:
        validate_file(_write(tmp_path, data))
    assert "toolchain.image" in [p[0] for p in err.value.problems]


# --- finding 5: int4_awq on Blackwell (PyTorch backend) -----------------------------------------------------

def test_the_trtllm_lane_refuses_int4_awq_on_sm120():
    targets = [{"name": "rtx", "arch": "sm120", "sku": [], "gpu_count": 1, "memory_gib": 96},
               {"name": "h100", "arch": "sm90", "sku": ["H100"], "gpu_count": 1, "memory_gib": 80}]
    data = _spec_data("llama-3.1-8b-multiarch.yaml", variants=[{"precision": "int4_awq"}], targets=targets)
    verdicts = {r["target"]: r["verdict"] for r in plan_report(parse_spec(data, base_dir=CONFIGS)).rows}
    assert verdicts["rtx"].startswith("refused") and "quantization.md" in verdicts["rtx"]
    assert verdicts["h100"] == "ok"


# --- finding 6: plan runs the lane-option refusals -----------------------------------------------------------

def test_plan_refuses_an_image_pin_mismatch(capsys, tmp_path):
    data = _spec_data("llama-3.1-8b-multiarch.yaml", toolchain={
        "trtllm_version": "1.2.1", "image": "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"})
    report = plan_report(parse_spec(data, base_dir=CONFIGS))
    assert report.refused == len(report.rows) and all("toolchain.image" in r["verdict"] for r in report.rows)
    assert main(["plan", str(_write(tmp_path, data))]) == 2


def test_plan_refuses_load_by_shard_with_an_int8_kv_cache(tmp_path):
    data = _spec_data("llama-3-70b-tp2-a100.yaml")
    data["lane_options"] = {**(data.get("lane_options") or {}), "load_by_shard": True}
    data["variants"] = [{"precision": "fp16", "tp": 2, "kv_cache_dtype": "int8"}, {"precision": "fp16", "tp": 2}]
    report = plan_report(parse_spec(data, base_dir=CONFIGS))
    # issue 37: refused on the int8 variant's units only, naming the lane option (was: every unit of the spec)
    by_variant = {r["unit"]: r["verdict"] for r in report.rows}
    int8 = [u for u in by_variant if u.startswith(report.rows[0]["unit"].split(".")[0])]
    assert report.refused == len(int8) < len(report.rows)
    for unit, verdict in by_variant.items():
        if unit in int8:
            assert "variants.0.kv_cache_dtype" in verdict and "lane_options.load_by_shard" in verdict
        else:
            assert "load_by_shard" not in verdict
    assert main(["plan", str(_write(tmp_path, data))]) == 2


# --- the audit matrix: never a traceback -------------------------------------------------------------------

MATRIX_LANES = {"reference": "tiny-cpu.yaml", "trtllm": "llama-3.1-8b-multiarch.yaml",
                "trtllm-engine": "llama-3-70b-tp2-a100.yaml"}
MATRIX_RELEASES = (None, "1.0.0", "1.1.0", "1.2.1", "1.3.0")


def matrix_data(lane: str, release: str | None) -> dict:
    data = _spec_data(MATRIX_LANES[lane])
    data["lane"] = lane
    data["toolchain"] = {"trtllm_version": release} if release else {}
    data["variants"] = [{"precision": p.value} for p in Precision]
    data["targets"] = [{"name": a.value, "arch": a.value, "sku": [], "gpu_count": 0 if a is Arch.CPU else 1,
                        **({} if a is Arch.CPU else {"memory_gib": 80})} for a in Arch]
    return data


@pytest.mark.parametrize(("lane", "release"), list(itertools.product(MATRIX_LANES, MATRIX_RELEASES)))
def test_plan_and_validate_never_raise_a_traceback(tmp_path, capsys, lane, release):
    path = _write(tmp_path, matrix_data(lane, release))
    for command in ("plan", "validate"):
        code = main([command, str(path), "--json"])
        out = capsys.readouterr()
        assert code in (0, 2), (command, code, out.err[-2000:])
        assert "Traceback" not in out.err and "rerun with --verbose" not in out.err, out.err[-2000:]
