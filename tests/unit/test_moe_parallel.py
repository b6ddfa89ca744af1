"""Issue 37, item 1: MoE parallelism on lane trtllm (moe_ep, moe_tp, attention_dp), its world-size rules, the expert
count, the memory estimate that knows total vs active parameters, and the refusals of the lanes that cannot do it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from enginefoundry.errors import SpecError
from enginefoundry.inputs.model_shape import ModelShape
from enginefoundry.inputs.toolchain import ToolSurface, UnsupportedByRelease, check_against_surface
from enginefoundry.inputs.units import SourceDigests, Unit, expand_units, unit_key_components
from enginefoundry.lanes import get_lane
from enginefoundry.lanes.trtllm import runtime_config
from enginefoundry.lanes.trtllm_disagg import key_status
from enginefoundry.lanes.trtllm_flags import ABSENT, LLM_API, PRESENT, TO_BE_PROBED, flag, registry_verdict
from enginefoundry.planning.plan_report import plan_report
from enginefoundry.planning.preflight import estimate_memory, preflight
from enginefoundry.planning.validate import validate_file
from enginefoundry.spec import Variant, parse_spec
from tests.support.paths import CONFIGS, FIXTURES

QWEN_SPEC = CONFIGS / "qwen3-30b-a3b-moe.yaml"
QWEN = json.loads((CONFIGS / "model-configs" / "qwen3-moe-30b-a3b.json").read_text())
LLAMA_8B = json.loads((CONFIGS / "model-configs" / "llama-3.1-8b-instruct.json").read_text())
MOE_KEYS = ("moe_expert_parallel_size", "moe_tensor_parallel_size", "enable_attention_dp")
GIB = 1024**3


def qwen_spec(variants: list[dict] | None = None, lane: str | None = None, **fields) -> object:
    data = yaml.safe_load(QWEN_SPEC.read_text())
    if variants is not None:
        data["variants"] = variants
    if lane is not None:
        data["lane"] = lane
        data.pop("lane_options", None)
        data["toolchain"] = {"trtllm_version": "1.2.1"}
    data.update(fields)
    return parse_spec(data, base_dir=CONFIGS)


def unit_of(spec, variant: int = 0, target: str = "h100") -> Unit:
    name = spec.variants[variant].name
    return next(u for u in expand_units(spec) if u.variant.name == name and u.target.name == target)


def problems(spec) -> dict[str, str]:
    return dict(get_lane(spec.lane).validate_options(spec))


# --- the spec fields and the LLM API keys they emit ---------------------------------------------------------------

def test_a_variant_names_its_moe_shape_and_keeps_its_key_without_one():
    assert Variant(tp=8, moe_ep=8, attention_dp=True).name == "bf16-tp8-ep8-adp"
    assert Variant(tp=8, moe_ep=4, moe_tp=2).name == "bf16-tp8-ep4"  # moe_tp = tp / moe_ep is the default
    assert Variant(tp=8, moe_ep=2, moe_tp=2).name == "bf16-tp8-ep2-moetp2"
    assert Variant(tp=8, moe_ep=4).moe_tp_size == 2 and Variant(tp=8).moe_tp_size == 8
    # a variant written before the fields existed hashes as it did: no MoE field in its key
    plain = Variant(tp=2).key_json()
    assert not set(plain) & {"moe_ep", "moe_tp", "attention_dp"}
    assert Variant(tp=2, moe_ep=2).key_json()["moe_ep"] == 2
    spec = qwen_spec()
    digests = SourceDigests(weights="w", tokenizer="t")
    keys = {unit_key_components(spec, u, digests, {})["variant"].get("attention_dp") for u in expand_units(spec)}
    assert keys == {True, None}


def test_the_runtime_yaml_writes_the_moe_keys_only_for_a_variant_that_sets_them():
    spec = qwen_spec()
    cfg = runtime_config(spec, unit_of(spec, 0))
    assert {k: cfg[k] for k in MOE_KEYS} == {"moe_expert_parallel_size": 8, "moe_tensor_parallel_size": 1,
                                             "enable_attention_dp": True}
    cfg = runtime_config(spec, unit_of(spec, 2))  # tp 8, moe_ep 4, moe_tp 2
    assert (cfg["moe_expert_parallel_size"], cfg["moe_tensor_parallel_size"]) == (4, 2)
    assert "enable_attention_dp" not in cfg
    plain = qwen_spec([{"precision": "bf16", "tp": 8}])
    assert not set(MOE_KEYS) & set(runtime_config(plain, unit_of(plain)))


def test_every_moe_key_carries_its_release_range_and_upstream_evidence():
    for key in MOE_KEYS:
        entry = flag(LLM_API, key)
        assert entry.since == "1.0" and entry.until is None and entry.status("1.2.1") == PRESENT
        refs = " ".join(entry.refs)
        assert "extra_engine_args.1.0.0.yaml.j2" in refs and "extra_engine_args.1.3.0rc23.yaml.j2" in refs
        assert "llm_args.py@fcd3f316" in refs and "mapping.py@b35ac1b6" in refs and "1.4.0rc4" in refs
        assert entry.status("1.4.0rc4") == PRESENT and entry.status("1.4.0") == TO_BE_PROBED
    # NVIDIA's templates carry the three keys for every release they cover (tests/fixtures/aiconfigurator-templates)
    releases = json.loads((FIXTURES / "aiconfigurator-templates" / "keys.json").read_text())["releases"]
    assert all(set(MOE_KEYS) <= set(keys) for keys in releases.values())


# --- the world-size rules, refused with the field and the fix, at validate and plan --------------------------------

@pytest.mark.parametrize(("variant", "field", "fix"), [
    ({"tp": 8, "moe_ep": 4, "moe_tp": 4}, "variants.0.moe_tp", "set moe_tp: 2"),
    ({"tp": 8, "moe_ep": 3, "moe_tp": 2}, "variants.0.moe_tp", "moe_ep in [1, 2, 4, 8]"),
    ({"tp": 4, "moe_ep": 8}, "variants.0.moe_ep", "use moe_ep in [1, 2, 4], or raise tp to a multiple of 8"),
    ({"tp": 1, "attention_dp": True}, "variants.0.attention_dp", "set tp ≥ 2"),
])
def test_a_world_size_rule_is_refused_naming_the_field_and_the_fix(variant, field, fix):
    spec = qwen_spec([{"precision": "bf16", **variant}])
    found = problems(spec)
    assert field in found and fix in found[field] and "mapping.py" in found[field], found
    report = plan_report(spec, ["h100"])
    assert report.refused == 1 and field in report.rows[0]["verdict"] and fix in report.rows[0]["verdict"]
    assert report.commands[report.rows[0]["unit"]] == ["(not rendered: the lane refuses this unit, see its verdict)"]


def test_validate_reports_the_moe_refusals_by_field_before_any_download(tmp_path: Path):
    data = yaml.safe_load(QWEN_SPEC.read_text())
    data["variants"] = [{"precision": "bf16", "tp": 8, "moe_ep": 8}, {"precision": "bf16", "tp": 4, "moe_ep": 3},
                        {"precision": "bf16", "tp": 1, "attention_dp": True}]
    data["smoke"]["prompts"] = str(CONFIGS / "prompts" / "general.jsonl")
    (tmp_path / "model-configs").mkdir()
    (tmp_path / "model-configs" / "qwen3-moe-30b-a3b.json").write_text(json.dumps(QWEN))
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError) as err:
        validate_file(path)
    fields = [f for f, _ in err.value.problems]
    assert "variants.1.moe_ep" in fields and "variants.2.attention_dp" in fields
    assert not any(f.startswith("variants.0") or "bf16-tp8-ep8." in f for f in fields)


# --- the expert count (config.json, read as the search reads it) --------------------------------------------------

def test_an_expert_count_moe_ep_does_not_divide_is_refused_at_preflight():
    spec = qwen_spec([{"precision": "bf16", "tp": 6, "moe_ep": 3}],
                     targets=[{"name": "h100", "arch": "sm90", "gpu_count": 8, "memory_gib": 80}])
    assert not problems(spec)  # the world-size rules hold: tp 6 = moe_ep 3 × moe_tp 2
    report = preflight(spec, unit_of(spec), QWEN, None)
    (check,) = [c for c in report.checks if c.name == "experts_divisible"]
    assert not check.ok and "128 experts are not divisible by moe_ep 3" in check.message
    assert check.fix == "moe_ep in [1, 2] for tp 6"
    ok = qwen_spec()
    (check,) = [c for c in preflight(ok, unit_of(ok), QWEN, None).checks if c.name == "experts_divisible"]
    assert check.ok and "16 per rank" in check.message


def test_moe_ep_on_a_dense_model_is_refused_and_without_a_config_it_is_noted():
    spec = qwen_spec([{"precision": "bf16", "tp": 2, "moe_ep": 2}])
    (check,) = [c for c in preflight(spec, unit_of(spec), LLAMA_8B, None).checks if c.name == "experts_divisible"]
    assert not check.ok and "dense model" in check.message and "remove moe_ep and moe_tp" in check.fix
    report = preflight(spec, unit_of(spec), None, None)
    assert any("expert count is not checked" in n for n in report.notes)


# --- lanes without MoE parallelism -------------------------------------------------------------------------------

@pytest.mark.parametrize("lane", ["reference", "trtllm-engine"])
@pytest.mark.parametrize(("variant", "field"), [({"moe_ep": 2}, "moe_ep"), ({"moe_tp": 1}, "moe_tp"),
                                                ({"attention_dp": True}, "attention_dp")])
def test_a_lane_without_moe_parallelism_refuses_the_field_with_the_fix(lane, variant, field):
    targets = ([{"name": "cpu", "arch": "cpu", "gpu_count": 0}] if lane == "reference"
               else [{"name": "h100", "arch": "sm90", "gpu_count": 2, "memory_gib": 80}])
    spec = qwen_spec([{"precision": "bf16", **variant}], lane=lane, targets=targets)
    found = problems(spec)
    assert f"variants.0.{field}" in found, found
    assert f"remove {field} from the variant" in found[f"variants.0.{field}"]
    assert "use lane trtllm" in found[f"variants.0.{field}"]


def test_the_reference_lane_accepts_the_moe_model_with_tp_1():
    spec = qwen_spec([{"precision": "bf16"}], lane="reference", targets=[{"name": "cpu", "arch": "cpu",
                                                                           "gpu_count": 0}])
    assert not problems(spec)


# --- the memory estimate: total vs active, experts over moe_ep × moe_tp, attention over tp unless attention DP ----

def test_the_shape_counts_total_and_active_parameters_of_an_moe_model():
    shape = ModelShape.from_config(QWEN)
    assert shape.num_experts == 128 and shape.experts_per_token == 8 and shape.moe_intermediate_size == 768
    assert shape.param_count() == pytest.approx(30.5e9, rel=0.01)  # Qwen3-30B-A3B: 30.5B total
    assert shape.active_param_count() == pytest.approx(3.3e9, rel=0.03)  # 3.3B activated
    dense = ModelShape.from_config(LLAMA_8B)
    assert dense.active_param_count() == dense.param_count() and dense.params()["experts"] == 0


def test_the_memory_estimate_splits_experts_by_moe_ep_and_replicates_attention_under_attention_dp():
    spec = qwen_spec()
    shape = ModelShape.from_config(QWEN)
    parts = shape.params()
    adp = estimate_memory(spec, unit_of(spec, 0), shape, 80 * GIB)  # tp 8, moe_ep 8, attention DP
    tp = estimate_memory(spec, unit_of(spec, 1), shape, 80 * GIB)  # tp 8, moe_ep 8
    ep4 = estimate_memory(spec, unit_of(spec, 2), shape, 80 * GIB)  # tp 8, moe_ep 4 × moe_tp 2
    experts = parts["experts"] * 2 // 8
    assert adp.expert_weights_bytes_per_gpu == tp.expert_weights_bytes_per_gpu == experts
    assert ep4.weights_bytes_per_gpu == tp.weights_bytes_per_gpu  # the experts split over 8 ranks either way
    rest = (parts["attention"] + parts["mlp"] + parts["norms"] + parts["lm_head"] + parts["embedding"]) * 2
    assert adp.weights_bytes_per_gpu == int(rest + experts)  # attention DP: the rest on every rank
    assert tp.weights_bytes_per_gpu == int(rest / 8 + experts)
    assert adp.weights_bytes_total == tp.weights_bytes_total == pytest.approx(shape.param_count() * 2, rel=1e-6)
    assert adp.params == shape.param_count() and adp.active_params == shape.active_param_count()
    # every rank's KV cache holds all 4 KV heads of its own requests under attention DP (1 of 4 with tp 8)
    assert adp.kv_bytes_per_token_per_gpu == 4 * tp.kv_bytes_per_token_per_gpu
    dense = estimate_memory(spec, unit_of(spec, 1), ModelShape.from_config(LLAMA_8B), 80 * GIB)
    assert dense.active_params is None and dense.expert_weights_bytes_per_gpu is None


def test_the_memory_estimate_refuses_what_does_not_fit_and_names_the_moe_shape_in_the_plan():
    spec = qwen_spec([{"precision": "bf16", "tp": 2, "moe_ep": 2, "attention_dp": True}],
                     targets=[{"name": "h100", "arch": "sm90", "sku": ["H100"], "gpu_count": 2, "memory_gib": 24}])
    report = plan_report(spec)
    assert report.refused == 1 and "weights need" in report.rows[0]["verdict"]
    rows = {r["unit"]: r for r in plan_report(qwen_spec()).rows}
    assert rows["bf16-tp8-ep8-adp.chat.h100"]["tp×pp"] == "8×1 ep8×moe_tp1 attention DP"
    assert "30.5B params (3.4B active)" in rows["bf16-tp8-ep8-adp.chat.h100"]["memory estimate"]


# --- the shipped Qwen3-MoE spec: EP / attention-DP units on H100 and H200, every item with evidence ----------------

def test_the_shipped_qwen3_moe_spec_plans_ep_and_attention_dp_units_on_h100_and_h200():
    shipped = CONFIGS / "model-configs" / "qwen3-moe-30b-a3b.json"
    fixture = FIXTURES / "model-configs" / "qwen3-30b-a3b" / "config.json"
    assert hashlib.sha256(shipped.read_bytes()).hexdigest() == hashlib.sha256(fixture.read_bytes()).hexdigest() \
        == "2850ddb3bf7aecad20b611e2d44f3077fc8193f4827c93beddd4c02ad63c2297"
    spec = qwen_spec()
    report = plan_report(spec)
    # 4 aggregated variants and 1 disaggregated (its roles with attention DP and expert parallelism) × 2 targets
    assert not report.refused and len(report.rows) == 10, [r["verdict"] for r in report.rows]
    disagg = [r for r in report.rows if "disagg" in r["unit"]]
    assert [r["tp×pp"] for r in disagg] == ["disaggregated: P 2×tp1pp1dp2 etp1ep2 bs8 + D 1×tp1pp1dp4 etp1ep4 "
                                            "bs128"] * 2
    assert {r["target"] for r in report.rows} == {"h100", "h200"}
    lane = get_lane("trtllm")
    seen: set[str] = set()
    for unit in expand_units(spec):
        work = lane.describe(spec, unit)
        keys = {k for c in work for k in c.llm_api_keys}
        seen |= keys
        verdict = registry_verdict(work, "1.2.1")
        assert not verdict.absent and not verdict.to_be_probed  # every item has evidence for 1.2.1
        for key in keys:  # registered, with its range and evidence (KeyError otherwise); a disaggregated unit's
            # transceiver and overlap keys in lane trtllm's disaggregated registry, the rest in EMITTED
            entry, status = key_status(LLM_API, key, "1.2.1")
            assert entry.refs and status != ABSENT, key
    assert set(MOE_KEYS) <= seen


def test_past_the_evidence_the_moe_keys_are_to_be_probed_and_the_probe_decides(fake_trtllm):
    spec = qwen_spec(toolchain={"trtllm_version": "1.4.0"})
    report = plan_report(spec, ["h100"])
    unit = report.rows[0]["unit"]
    probe = [line for line in report.commands[unit] if line.startswith("(to be probed on the worker")]
    assert len(probe) == 1 and all(f"LLM API option {k}" in probe[0] for k in MOE_KEYS)
    lane = get_lane("trtllm")
    u = unit_of(spec, 0)
    s14 = ToolSurface.model_validate(fake_trtllm.expected_surface("1.4"))
    check_against_surface(lane.planned_work(spec, u, s14), s14)  # the 1.4 fake's TorchLlmArgs has them
    fields = dict(s14.llm_api or {})
    fields[""] = [f for f in fields[""] if f != "enable_attention_dp"]
    without = s14.model_copy(update={"llm_api": fields})
    with pytest.raises(UnsupportedByRelease, match="enable_attention_dp"):
        check_against_surface(lane.planned_work(spec, u, without), without)


def test_shared_experts_and_dense_layers_count_as_active_and_the_lane_option_names_the_variant_field():
    # a DeepSeek-shaped config: 1 dense layer of 3, 8 routed experts (2 active) and 1 shared expert per MoE layer
    cfg = {"num_hidden_layers": 3, "hidden_size": 16, "num_attention_heads": 2, "intermediate_size": 64,
           "moe_intermediate_size": 8, "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1,
           "first_k_dense_replace": 1, "vocab_size": 100}
    shape = ModelShape.from_config(cfg)
    parts = shape.params()
    assert (shape.num_experts, shape.dense_layers, shape.shared_intermediate_size) == (8, 1, 8)
    assert parts["experts"] == 2 * 8 * 3 * 16 * 8  # 2 MoE layers × 8 experts × gated FFN 16 → 8
    assert parts["mlp"] == 3 * 16 * 64 + 2 * (3 * 16 * 8 + 16 * 8)  # the dense layer; shared experts and routers
    assert shape.active_param_count() == shape.param_count() - parts["experts"] * 6 // 8
    # the LLM API names written as lane options are refused with the variant field to set instead
    for option, field in (("moe_expert_parallel_size", "moe_ep"), ("moe_tensor_parallel_size", "moe_tp"),
                          ("enable_attention_dp", "attention_dp")):
        with pytest.raises(SpecError, match=rf"not a lane option: set it as variants\[\]\.{field}"):
            qwen_spec(lane_options={option: 8})
