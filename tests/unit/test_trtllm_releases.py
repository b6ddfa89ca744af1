"""Issue 37, item 5: the 1.4 line and the later 1.3 rcs, and the audit's findings, each with its evidence (the registry
entries' refs in enginefoundry/lanes/trtllm_flags.py, docs/trtllm-compat.md)."""

from __future__ import annotations

import importlib.util
import itertools
import json
import re
from pathlib import Path

import pytest
import yaml

from enginefoundry.errors import ToolError
from enginefoundry.inputs.toolchain import ToolSurface, check_against_surface, parse_version
from enginefoundry.inputs.units import expand_units
from enginefoundry.lanes import compat, get_lane
from enginefoundry.lanes.trtllm import autotuner_supported, runtime_config
from enginefoundry.lanes.trtllm_base import require_pinned_release
from enginefoundry.lanes.trtllm_flags import (
    AIC_TEMPLATES,
    ENV,
    LLM_API,
    PRESENT,
    QUANTIZE,
    SERVE,
    TO_BE_PROBED,
    assumed_modelopt,
    flag,
    image_release_problem,
    llm_api_key_paths,
    registry_verdict,
    same_release,
    triton_image_problem,
)
from enginefoundry.planning.plan_report import plan_report
from enginefoundry.planning.preflight import preflight
from enginefoundry.spec import Arch, Precision, parse_spec
from tests.support.paths import CONFIGS, FIXTURES

AIC_KEYS = FIXTURES / "aiconfigurator-templates" / "keys.json"
LLAMA_8B = json.loads((CONFIGS / "model-configs" / "llama-3.1-8b-instruct.json").read_text())


def spec_for(version: str | None, config: str = "llama-3.1-8b-multiarch.yaml", lane: str | None = None, **fields):
    data = yaml.safe_load((CONFIGS / config).read_text())
    data["toolchain"] = {"trtllm_version": version} if version else {}
    if lane:
        data["lane"] = lane
    data.update(fields)
    return parse_spec(data, base_dir=CONFIGS)


def surface(fake_trtllm, release: str) -> ToolSurface:
    return ToolSurface.model_validate(fake_trtllm.expected_surface(release))


# --- the 1.4 line and the 1.3 rcs after rc24: known, and what is not evidenced is to be probed -------------------

@pytest.mark.parametrize("version", ["1.4.0rc1", "1.4.0rc4", "1.3.0rc25", "1.3.0rc29"])
def test_plan_for_a_later_pin_works_and_names_what_is_to_be_probed(version):
    spec = spec_for(version)
    report = plan_report(spec)
    assert report.rows and not report.refused, [r["verdict"] for r in report.rows]
    fp8 = next(u for u in report.commands if u.startswith("fp8"))
    probe = [line for line in report.commands[fp8] if line.startswith("(to be probed on the worker")]
    assert len(probe) == 1 and f"no evidence read for {version}" in probe[0]
    # never presumed: the flag without evidence for the release is named, the ones with evidence are not
    assert "trtllm-serve --extra_llm_api_options" in probe[0] and "LLM API option max_batch_size" in probe[0]
    if version.startswith("1.4"):  # the 1.4.0rc4 docs show --host/--port and TorchLlmArgs' parallel sizes
        assert "--host" not in probe[0] and "tensor_parallel_size" not in probe[0]
    # ModelOpt: no pin recorded for these releases (PR #16829 dropped it): the common hf_ptq flags only
    assert "ModelOpt version unknown until the worker's probe" in " ".join(report.commands[fp8])


def test_the_registry_says_to_be_probed_past_its_evidence_and_absent_only_where_removed():
    serve_yaml = flag(SERVE, "extra_llm_api_options")
    assert serve_yaml.status("1.3.0rc24") == PRESENT and serve_yaml.status("1.3.0rc25") == TO_BE_PROBED
    assert serve_yaml.status("1.4.0rc1") == TO_BE_PROBED
    assert flag(SERVE, "host").status("1.4.0rc4") == PRESENT and flag(SERVE, "host").status("1.4.0") == TO_BE_PROBED
    assert flag(QUANTIZE, "qformat").status("1.4.0rc4") == "absent"  # a removal is evidence for every later release
    page = compat.render()
    assert "| 1.4 rc1 – rc4 |" in page and "? = to be probed" in page
    assert "| `--extra_llm_api_options` | 1.0 – now | ✓ | ✓ | ✓ | ✓ | ? | ? |" in page


def test_the_worker_probe_of_a_14_image_decides(fake_trtllm):
    spec = spec_for("1.4.0rc4")
    lane = get_lane("trtllm")
    s14 = surface(fake_trtllm, "1.4")
    for unit in expand_units(spec):
        check_against_surface(lane.planned_work(spec, unit, s14), s14)
    # the autotuner variable has no --help: past its evidence the probe greps the installed autotuner's source
    assert flag(ENV, "TLLM_AUTOTUNER_CACHE_PATH").status("1.4.0rc4") == TO_BE_PROBED
    assert autotuner_supported("1.4.0rc4", s14) and s14.env_reads == {"TLLM_AUTOTUNER_CACHE_PATH": True}
    unread = s14.model_copy(update={"env_reads": {"TLLM_AUTOTUNER_CACHE_PATH": False}})
    assert not autotuner_supported("1.4.0rc4", unread)
    unit = expand_units(spec)[0]
    assert not any("TLLM_AUTOTUNER_CACHE_PATH" in c.env for c in lane.describe(spec, unit, unread))
    assert autotuner_supported("1.2.1", unread)  # within the evidence the registry decides, not the grep


# --- a pin without an rc suffix is not satisfied by a release candidate --------------------------------------------

def test_a_final_pin_is_not_satisfied_by_its_release_candidate():
    assert not same_release("1.2.0", "1.2.0rc8") and not same_release("1.3.0rc24", "1.3.0rc25")
    assert same_release("1.3.0rc24", "1.3.0rc24") and same_release("1.0.3", "1.0.3.2510")
    assert same_release("1.2.0rc6", "1.2.0rc6.post1")
    with pytest.raises(ToolError, match=r"pins TensorRT-LLM 1\.2\.0 and the worker has 1\.2\.0rc8"):
        require_pinned_release("1.2.0", "1.2.0rc8")
    require_pinned_release("1.2.0rc8", "1.2.0rc8")
    problem = image_release_problem("1.3.0", "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc24")
    assert problem and "ships TensorRT-LLM 1.3.0rc24" in problem and "not the pinned 1.3.0:" in problem
    assert parse_version("1.3.0rc24").sort_key < parse_version("1.3.0rc25").sort_key < parse_version("1.3.0").sort_key


# --- the 1.3 ModelOpt pin applies only to the rcs that had it ------------------------------------------------------

def test_the_modelopt_pin_covers_the_rcs_before_its_removal_only():
    assert assumed_modelopt("1.2.1") == "0.37.0" and assumed_modelopt("1.3.0rc11") == "0.37.0"
    assert assumed_modelopt("1.3.0rc22") == "0.37.0"
    for version in ("1.3.0rc23", "1.3.0rc24", "1.3.0rc29", "1.3.0", "1.4.0rc4"):  # PR #16829: the probe decides
        assert assumed_modelopt(version) is None, version
    ptq = get_lane("trtllm").describe(spec_for("1.3.0rc24"), next(
        u for u in expand_units(spec_for("1.3.0rc24")) if u.variant.precision is Precision.FP8))[0]
    assert "ModelOpt version unknown" in ptq.description and "--calib_seq" not in ptq.argv


# --- triton: true on >= 1.3 names an image that serves it --------------------------------------------------------

def test_triton_on_13_needs_a_tritonrelease_build_of_the_pinned_release(tmp_path):
    def problems(image):
        toolchain = {"trtllm_version": "1.3.0rc24", **({"image": image} if image else {})}
        spec = spec_for(None, lane_options={"triton": True}, toolchain=toolchain)
        return dict(get_lane("trtllm").validate_options(spec))

    for image in (None, "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc24",
                  "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3",
                  "my.registry/tensorrt_llm/tritonrelease:1.3.0rc23"):
        why = problems(image).get("lane_options.triton")
        assert why and "tritonrelease_build IMAGE_TAG=1.3.0rc24" in why, image
        fix = re.search(r"set toolchain\.image: (\S+),", why).group(1)
        assert problems(fix) == {}, fix  # the suggested image is one the lane accepts
    assert problems("registry.example.com:5000/team/tensorrt_llm/tritonrelease:1.3.0rc24") == {}
    assert triton_image_problem("1.2.1", None) is None  # before 1.3 the tritonserver trtllm images serve it


# --- the removal PR of quantize.py -------------------------------------------------------------------------------

def test_quantize_rows_cite_the_pr_that_removed_the_script():
    for name in ("qformat", "calib_size", "tp_size"):
        refs = " ".join(flag(QUANTIZE, name).refs)
        assert "PR #16612" in refs and "#15763" not in refs, name
    assert "PR #16612" in compat.render()


# --- the registry and plan agree on every release (tokens_per_block was ✓ in plan, — in the registry for 1.0/1.1) ---

@pytest.mark.parametrize("version", ["1.0.0", "1.1.0", "1.2.1", "1.3.0rc20"])
def test_plan_and_the_registry_agree_on_what_a_release_has(version, fake_trtllm):
    spec = spec_for(version, lane_options={"tokens_per_block": 64, "enable_block_reuse": False})
    assert flag(LLM_API, "kv_cache_config.tokens_per_block").status(version) == PRESENT
    assert any(AIC_TEMPLATES.format("1.0.0") in r for r in flag(LLM_API, "kv_cache_config.tokens_per_block").refs)
    report = plan_report(spec)
    assert not report.refused, [r["verdict"] for r in report.rows]
    release = ".".join(version.split(".")[:2])
    lane = get_lane("trtllm")
    for unit in expand_units(spec):  # what plan renders, the fake release (from the same evidence) accepts
        work = lane.describe(spec, unit)
        assert registry_verdict(work, version).absent == []
        check_against_surface([c for c in work if c.tool != "hf_ptq.py"], surface(fake_trtllm, release))


def test_an_item_the_registry_says_a_release_lacks_is_refused_at_plan():
    from enginefoundry.lanes import trtllm_flags

    spec = spec_for("1.0.0")
    entry = flag(SERVE, "extra_llm_api_options")
    later = type(entry)(**{**entry.__dict__, "since": "1.1"})
    index = dict(trtllm_flags._EMITTED_INDEX)
    try:
        trtllm_flags._EMITTED_INDEX[(SERVE, "extra_llm_api_options")] = later
        report = plan_report(spec)
    finally:
        trtllm_flags._EMITTED_INDEX.clear()
        trtllm_flags._EMITTED_INDEX.update(index)
    assert report.refused == len(report.rows)
    assert all("TensorRT-LLM 1.0.0 has no trtllm-serve --extra_llm_api_options" in r["verdict"] for r in report.rows)


# --- lane-wide refusals attributed to the units they concern ------------------------------------------------------

def test_a_target_or_profile_refusal_concerns_its_units_only():
    data = yaml.safe_load((CONFIGS / "llama-3.1-8b-multiarch.yaml").read_text())
    data["variants"] = [{"precision": "bf16"}]
    data["targets"] = [{"name": "h100", "arch": "sm90", "sku": [], "gpu_count": 1, "memory_gib": 80},
                       {"name": "cpu", "arch": "cpu", "sku": [], "gpu_count": 0}]
    profile = dict(data["profiles"][0])
    data["profiles"] = [profile, {**profile, "name": "padded", "paged_kv_cache": False}]
    report = plan_report(parse_spec(data, base_dir=CONFIGS))
    verdicts = {r["unit"]: r["verdict"] for r in report.rows}
    for unit, verdict in verdicts.items():
        assert ("targets.1.gpu_count" in verdict) == unit.endswith(".cpu"), unit
        assert ("profiles.1.paged_kv_cache" in verdict) == (".padded." in unit), unit
    ok = [u for u, v in verdicts.items() if v == "ok"]
    assert ok == [f"bf16-tp1.{profile['name']}.h100"]


# --- fix hints that the lane accepts -------------------------------------------------------------------------------

PRECISION = re.compile(r"\b(" + "|".join(p.value for p in Precision) + r")\b")


@pytest.mark.parametrize("lane", ["trtllm", "trtllm-engine"])
def test_every_precision_fix_names_precisions_the_lane_accepts_there(lane):
    config = "llama-3-70b-tp2-a100.yaml" if lane == "trtllm-engine" else "llama-3.1-8b-multiarch.yaml"
    archs = [a for a in Arch if a is not Arch.CPU]
    targets = [{"name": a.value, "arch": a.value, "sku": [], "gpu_count": 8, "memory_gib": 80} for a in archs]
    options = {"gemm_plugin": "auto"} if lane == "trtllm-engine" else {}
    spec = spec_for("1.2.1", config, lane=lane, lane_options=options, targets=targets,
                    variants=[{"precision": p.value} for p in Precision])
    engine = get_lane(lane)
    refused_variants = {f.split(".")[1] for f, _ in engine.validate_options(spec) if f.startswith("variants.")}
    checked = 0
    for unit in expand_units(spec):
        for check in engine.preflight_checks(spec, unit, None):
            if check.ok or check.name != "precision_arch":
                continue
            named = set(PRECISION.findall(check.fix.split(" or restrict")[0]))
            assert named, check.fix
            for name in named:
                other = spec.model_copy(update={"variants": [unit.variant.model_copy(
                    update={"precision": Precision(name)})]})
                [alt] = [u for u in expand_units(other) if u.target.name == unit.target.name
                         and u.profile.name == unit.profile.name]
                assert not [f for f, _ in engine.validate_options(other) if f.startswith("variants.")], (name, check)
                assert all(c.ok for c in engine.preflight_checks(other, alt, None) if c.name == "precision_arch"), \
                    (unit.name, name, check.fix)
                checked += 1
    assert checked > 10 and refused_variants is not None


def test_the_image_fix_never_offers_a_release_the_lane_refuses():
    problem = image_release_problem("1.2.1", "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc24", "trtllm-engine")
    assert "pin trtllm_version: 1.3.0rc24" not in problem and "tensorrt-llm/release:1.2.1" in problem
    assert "pin trtllm_version: 1.3.0rc24" in image_release_problem(
        "1.2.1", "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc24", "trtllm")


# --- every LLM-API key the lane emits is in NVIDIA's template of the release, or backed by other evidence ---------

def _aic_generate():
    spec = importlib.util.spec_from_file_location("aic_generate", AIC_KEYS.parent / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _non_template_evidence(key: str) -> list[str]:
    return [r for r in flag(LLM_API, key).refs if "extra_engine_args" not in r and compat._REF.search(r)
            and re.search(r"docs \d|@[0-9a-f]{7}|#\d+|facts §", r)]


def test_every_emitted_key_is_in_the_release_template_or_has_other_evidence():
    releases = json.loads(AIC_KEYS.read_text())["releases"]
    assert len(releases) >= 15 and "1.3.0rc23" in releases
    full = {"tokens_per_block": 32, "enable_block_reuse": True, "enable_chunked_prefill": True, "cuda_graphs": True}
    checked = 0
    # a MoE-parallel variant too (issue 37 item 1): moe_expert/tensor_parallel_size, enable_attention_dp
    spec = spec_for("1.2.1", lane_options=full, variants=[
        {"precision": "bf16", "kv_cache_dtype": "fp8", "tp": 2, "moe_ep": 2, "attention_dp": True}])
    keys = llm_api_key_paths(runtime_config(spec, expand_units(spec)[0]))  # the same keys for every release
    assert "kv_cache_config.tokens_per_block" in keys and "cuda_graph_config.enable_padding" in keys
    assert {"moe_expert_parallel_size", "moe_tensor_parallel_size", "enable_attention_dp"} <= set(keys)
    for release, template in releases.items():
        if parse_version(release).release < (1, 0, 0):
            continue  # the lanes need 1.0+
        for key in keys:
            if key not in template:
                assert _non_template_evidence(key), f"{key} emitted for {release}: not in its template, no evidence"
            checked += 1
    assert checked > 100
    # the evidence is read from the template files themselves when the predictor's venv is here (CI has it)
    site = sorted((Path(__file__).resolve().parents[2] / ".venv-predict").glob("lib/python3*/site-packages"))
    if site and (site[0] / _aic_generate().TEMPLATES).is_dir():
        assert _aic_generate().render(site[0]) == json.loads(AIC_KEYS.read_text()), "run the generate.py beside it"


SPECULATIVE = [{"algorithm": "mtp", "num_nextn_predict_layers": 1},
               {"algorithm": "ngram", "max_matching_ngram_size": 2},
               {"algorithm": "eagle3", "draft": "hf://org/eagle3@v", "one_model": True},
               {"algorithm": "draft_target", "draft": "hf://org/draft@v"}]


def test_every_speculative_key_is_in_the_release_template_or_has_other_evidence():
    """The keys of each algorithm's speculative_config, for every release whose template AIConfigurator ships and
    that the registry does not refuse the algorithm on: MTP's (decoding_type, num_nextn_predict_layers) are in the
    templates from 1.0.0; the rest, and every decoding_type value, cite a release-named source besides."""
    releases = json.loads(AIC_KEYS.read_text())["releases"]
    checked = in_template = 0
    for release, template in releases.items():
        if parse_version(release).release < (1, 0, 0):
            continue
        for section in SPECULATIVE:
            spec = spec_for(release, speculative=section, variants=[{"precision": "bf16"}])
            cmds = get_lane("trtllm").describe(spec, expand_units(spec)[0])
            if registry_verdict(cmds, release).absent:
                assert section["algorithm"] == "draft_target" and parse_version(release).release < (1, 3, 0)
                continue
            keys = [k for k in llm_api_key_paths(runtime_config(spec, expand_units(spec)[0], release))
                    if k.startswith("speculative_config")]
            for key in keys:
                in_template += key in template
                if key not in template:
                    assert _non_template_evidence(key), f"{key} emitted for {release}: not in its template, no evidence"
                checked += 1
    assert checked > 100 and in_template > 30


def test_a_key_without_template_or_evidence_is_caught():
    from enginefoundry.lanes import trtllm_flags

    releases = json.loads(AIC_KEYS.read_text())["releases"]
    assert "dtype" not in releases["1.0.0"] and _non_template_evidence("dtype")
    entry = flag(LLM_API, "dtype")
    bare = type(entry)(**{**entry.__dict__, "refs": (trtllm_flags.REF_LLM_API,)})
    index = dict(trtllm_flags._EMITTED_INDEX)
    try:
        trtllm_flags._EMITTED_INDEX[(LLM_API, "dtype")] = bare
        assert _non_template_evidence("dtype") == []
    finally:
        trtllm_flags._EMITTED_INDEX.clear()
        trtllm_flags._EMITTED_INDEX.update(index)


def test_preflight_and_plan_agree_for_the_matrix_of_releases():
    """No traceback, and plan's refusals are exactly the registry's, for every release column of the compat page."""
    for version, precision in itertools.product(compat.TRTLLM_RELEASES.values(), ("bf16", "fp8")):
        spec = spec_for(version, variants=[{"precision": precision}])
        for unit in expand_units(spec)[:2]:
            report = preflight(spec, unit, LLAMA_8B, None)
            absent = registry_verdict(get_lane("trtllm").describe(spec, unit), version).absent
            assert bool(absent) == any(c.name == "release_registry" and not c.ok for c in report.checks)
