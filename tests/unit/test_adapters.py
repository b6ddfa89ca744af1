"""LoRA adapters (`model.adapters`, issue 36): the spec's shape, the preflight from adapter_config.json alone against
the real fixture adapters (tests/fixtures/tiny-chat/adapters, trained by scripts/make_tiny_lora.py), and how adapter
units are expanded, keyed, aliased and given lineages."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from enginefoundry.errors import SpecError
from enginefoundry.inputs.adapters import (
    AdapterConfig,
    adapter_problems,
    changed_adapters,
    missing_targets,
    names_base,
    read_adapter_config,
    unit_adapters,
)
from enginefoundry.inputs.sources import SourceSnapshot
from enginefoundry.inputs.units import KeyComponents, SourceDigests, expand_units, key_of, unit_key_components
from enginefoundry.planning.validate import validate_deep
from enginefoundry.records.alias_lineage import unit_lineage
from enginefoundry.records.promotion import alias_stems
from enginefoundry.spec import BuildSpec, parse_spec
from tests.support.paths import CONFIGS, TINY_MODEL

ADAPTERS = TINY_MODEL.parent / "adapters"


def _data(**model: Any) -> dict[str, Any]:  # JSON edge: a spec mapping
    data = yaml.safe_load((CONFIGS / "tiny-lora.yaml").read_text())
    data["model"].update(model)
    return data


def _spec(**model: Any) -> BuildSpec:
    return parse_spec(_data(**model), source="test spec", base_dir=CONFIGS)


def _adapter(name: str, folder: str | Path) -> dict[str, str]:
    return {"name": name, "source": str(folder)}


def test_the_shipped_adapter_spec_parses_with_merge_mode_and_the_default_rank_bound():
    spec = _spec()
    (a,) = spec.model.adapters
    assert a.name == "plus-one" and spec.model.adapter_mode == "merge" and spec.model.max_lora_rank == 64
    assert a.parsed_source(spec.base_path).location == str(ADAPTERS / "plus-one")


@pytest.mark.parametrize(("model", "field", "words"), [
    ({"adapters": [_adapter("a", "x"), _adapter("a", "y")]}, "model", "distinct names; repeated: a"),
    ({"adapters": [_adapter("Bad Name", "x")]}, "model.adapters.0.name", "should match pattern"),
    ({"adapters": [_adapter("a", "ftp://host/x")]}, "model.adapters.0.source", "unknown source scheme 'ftp://'"),
    ({"adapters": [{"name": "a", "source": "x", "rank": 8}]}, "model.adapters.0.rank", "unknown key"),
    ({"adapter_mode": "mix"}, "model.adapter_mode", "'merge' or 'serve'"),
    ({"max_lora_rank": 0}, "model.max_lora_rank", "greater than or equal to 1"),
    ({"max_lora_rank": 5000}, "model.max_lora_rank", "less than or equal to 1024"),
    ({"adapters": [_adapter(f"a{i}", "x") for i in range(33)]}, "model.adapters", "at most 32"),
])
def test_a_malformed_adapter_section_is_refused_naming_the_field(model, field, words):
    with pytest.raises(SpecError) as err:
        _spec(**model)
    assert any(f == field and words in m for f, m in err.value.problems), err.value.problems


def test_the_good_adapter_passes_preflight():
    assert adapter_problems(_spec(), "reference", 1024) == []


def test_a_wrong_base_adapter_is_refused_with_the_field_and_the_fix_and_accepted_once_its_base_is_named():
    spec = _spec(adapters=[_adapter("bad", ADAPTERS / "wrong-base")])
    ((field, message),) = adapter_problems(spec, "reference", 1024)
    assert field == "model.adapters.0"
    assert "trained on base 'tiny-chat-draft'" in message and "set model.adapters.0.base_model" in message
    # A base served from a copy under another name: the spec says what the adapter calls it.
    named = _spec(adapters=[{**_adapter("bad", ADAPTERS / "wrong-base"), "base_model": "tiny-chat-draft"}])
    assert adapter_problems(named, "reference", 1024) == []


def test_a_wrong_rank_adapter_is_refused_until_the_spec_raises_its_bound():
    spec = _spec(adapters=[_adapter("wide", ADAPTERS / "wrong-rank")])
    ((field, message),) = adapter_problems(spec, "reference", 1024)
    assert field == "model.adapters.0" and "LoRA rank 128" in message and "raise model.max_lora_rank" in message
    assert adapter_problems(_spec(adapters=[_adapter("wide", ADAPTERS / "wrong-rank")], max_lora_rank=128),
                            "reference", 1024) == []
    # the lane's own ceiling bounds the spec's
    problems = adapter_problems(_spec(max_lora_rank=128), "reference", 64)
    assert ("model.max_lora_rank", "128 exceeds lane reference's max_lora_rank (64); lower it") in problems


def test_target_modules_the_base_lacks_are_refused(tmp_path: Path):
    other = tmp_path / "other-arch"
    shutil.copytree(ADAPTERS / "plus-one", other)
    cfg = json.loads((other / "adapter_config.json").read_text())
    cfg["target_modules"] = ["q_proj", "query_key_value"]  # a GPT-NeoX / Falcon name
    (other / "adapter_config.json").write_text(json.dumps(cfg))
    ((field, message),) = adapter_problems(_spec(adapters=[_adapter("neox", other)]), "reference", 1024)
    assert field == "model.adapters.0" and "['query_key_value']" in message and "(llama)" in message


def test_target_module_matching_follows_peft():
    modules = {"model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj", "lm_head"}
    cfg = AdapterConfig(peft_type="LORA", target_modules=["q_proj", "down_proj", "c_attn"])
    assert missing_targets(cfg, modules) == ["c_attn"]
    assert missing_targets(AdapterConfig(peft_type="LORA", target_modules=r".*\.q_proj"), modules) == []
    assert missing_targets(AdapterConfig(peft_type="LORA", target_modules=r".*\.c_attn"), modules) == [r".*\.c_attn"]
    assert missing_targets(AdapterConfig(peft_type="LORA", target_modules="all-linear"), modules) == []
    assert AdapterConfig(peft_type="LORA", r=8, rank_pattern={"q_proj": 32}).max_rank == 32


def test_base_names_accept_a_repo_id_a_path_or_the_bare_name():
    names = {"tiny-chat", "model", "org/tiny-chat"}
    assert names_base("org/tiny-chat", names) and names_base("/data/ckpts/tiny-chat/", names)
    assert names_base("tiny-chat", names) and not names_base("org/tiny-chat-draft", names)


def test_a_folder_without_adapter_config_or_with_a_huge_one_is_refused(tmp_path: Path):
    spec = _spec(adapters=[_adapter("none", tmp_path)])
    ((field, message),) = adapter_problems(spec, "reference", 1024)
    assert field == "model.adapters.0.source" and "not a JSON object of at most" in message
    (tmp_path / "adapter_config.json").write_text(" " * (2 << 20) + "{}")
    assert read_adapter_config(spec, spec.model.adapters[0])[0] is None
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "IA3", "r": 4}))
    ((field, message),) = adapter_problems(spec, "reference", 1024)
    assert "peft_type IA3 is not LORA" in message


def test_serve_mode_passes_preflight_on_the_reference_lane_and_stays_refused_where_the_lane_has_no_adapters():
    assert adapter_problems(_spec(adapter_mode="serve"), "reference", 1024) == []
    for mode in ("merge", "serve"):  # lane trtllm: only evidence rows exist, no lora_config is written
        ((field, message),) = adapter_problems(_spec(adapter_mode=mode), "trtllm", None)
        assert field == "model.adapters" and "use lane reference" in message
    with pytest.raises(SpecError) as err:
        validate_deep(_spec(adapters=[_adapter("bad", ADAPTERS / "wrong-base")]))
    assert any(f == "model.adapters.0" for f, _ in err.value.problems)


def test_one_unit_per_adapter_with_its_own_key_alias_stem_and_lineage():
    spec = _spec(adapters=[_adapter("plus-one", ADAPTERS / "plus-one"), _adapter("other", ADAPTERS / "plus-one")])
    units = expand_units(spec)
    assert [u.name for u in units] == ["fp32-tp1+plus-one.chat.cpu", "fp32-tp1+other.chat.cpu"]
    assert alias_stems(spec) == {"fp32-tp1+plus-one.chat.cpu": "cpu-plus-one", "fp32-tp1+other.chat.cpu": "cpu-other"}
    assert unit_lineage(spec, units[0]).digest != unit_lineage(spec, units[1]).digest

    def keys(digests: dict[str, str]) -> list[str]:
        source = SourceDigests(weights="w", tokenizer="t", adapters=digests)
        return [key_of(unit_key_components(spec, u, source, {}, spec.lane_options)) for u in units]

    before = keys({"plus-one": "a1", "other": "b1"})
    after = keys({"plus-one": "a2", "other": "b1"})  # a new revision of one adapter
    assert before[0] != after[0] and before[1] == after[1]
    with pytest.raises(ValueError, match=r"fetch model\.adapters first"):
        keys({})


def test_a_spec_without_adapters_keeps_its_units_and_keys():
    plain = parse_spec(yaml.safe_load((CONFIGS / "tiny-cpu.yaml").read_text()), base_dir=CONFIGS)
    (unit,) = expand_units(plain)
    assert unit.adapter is None and unit.name == "fp32-tp1.chat.cpu"
    components = unit_key_components(plain, unit, SourceDigests(weights="w", tokenizer="t"), {}, plain.lane_options)
    assert "adapter" not in components


def test_serve_mode_is_one_unit_whose_key_takes_every_adapter_digest():
    """adapter_mode serve: one unit (the base's name) serving the base and every adapter; its key has every
    adapter's name and digest, so a new revision of any one is a new key of that unit, and its lineage names the
    served set (not the revisions)."""
    plain = parse_spec(yaml.safe_load((CONFIGS / "tiny-cpu.yaml").read_text()), base_dir=CONFIGS)
    (plain_unit,) = expand_units(plain)
    spec = _spec(adapter_mode="serve", adapters=[_adapter("plus-one", ADAPTERS / "plus-one"),
                                                 _adapter("other", ADAPTERS / "plus-one")])
    (unit,) = expand_units(spec)
    assert unit.adapter is None and unit.name == plain_unit.name == "fp32-tp1.chat.cpu"

    def key(digests: dict[str, str]) -> str:
        return key_of(unit_key_components(spec, unit, SourceDigests(weights="w", tokenizer="t", adapters=digests), {},
                                          spec.lane_options))

    both = SourceDigests(weights="w", tokenizer="t", adapters={"plus-one": "a1", "other": "b1"})
    components = unit_key_components(spec, unit, both, {}, spec.lane_options)
    assert components["adapter"] == {"mode": "serve", "served": {"plus-one": "a1", "other": "b1"}}
    base_key = key_of(unit_key_components(plain, plain_unit, SourceDigests(weights="w", tokenizer="t"), {},
                                          plain.lane_options))
    keys = {base_key, key({"plus-one": "a1", "other": "b1"}), key({"plus-one": "a2", "other": "b1"}),
            key({"plus-one": "a1", "other": "b2"})}
    assert len(keys) == 4  # the base alone, the set, and a new revision of either adapter: four keys
    with pytest.raises(ValueError, match=r"fetch model\.adapters first"):
        key({"plus-one": "a1"})
    assert unit_lineage(spec, unit).digest != unit_lineage(plain, plain_unit).digest  # the served set's own lineage
    assert unit_lineage(spec, unit).digest == unit_lineage(
        _spec(adapter_mode="serve", adapters=[_adapter("plus-one", ADAPTERS / "wrong-rank"),
                                              _adapter("other", ADAPTERS / "plus-one")]), unit).digest


def test_serve_mode_refuses_speculation_and_a_quantized_base_naming_the_field():
    spec = _spec(adapter_mode="serve")
    quantized = {**json.loads((TINY_MODEL / "config.json").read_text()), "quantization_config": {"quant_method": "fp8"}}
    problems = adapter_problems(spec, "reference", 1024, quantized)
    assert [f for f, _ in problems] == ["model.adapter_mode"]
    assert "serve mode's per-adapter gate reference" in problems[0][1]
    speculative = spec.model_copy(update={"speculative": object()})
    assert any(f == "model.adapter_mode" and "does not combine with speculative decoding" in m
               for f, m in adapter_problems(speculative, "reference", 1024))


def test_merging_into_a_pre_quantized_base_is_refused_before_any_adapter_is_fetched():
    """A ModelOpt export names its quantization in hf_quant_config.json (config.json may say nothing): merge mode is
    refused from the fetched base's own quantization, naming the field and the fix."""
    from enginefoundry.errors import InputError
    from enginefoundry.inputs.adapters import fetch_adapters
    from enginefoundry.inputs.quantized_source import SourceQuantization
    from enginefoundry.inputs.sources import fetch
    from enginefoundry.spec.matrix import Precision

    spec = _spec()
    base = fetch(spec.model.parsed_source(spec.base_path), progress=lambda _: None)
    assert fetch_adapters(spec, base, "reference", 1024, lambda _: None)  # the plain base takes the adapter
    quantized = base.model_copy(update={"quantization": SourceQuantization(
        file="hf_quant_config.json", producer="modelopt 0.47.0", quant_algo="W4A16_AWQ", precision=Precision.INT4_AWQ,
        group_size=128)})
    with pytest.raises(InputError) as err:
        fetch_adapters(spec, quantized, "reference", 1024, lambda _: None)
    assert "model.adapter_mode" in str(err.value) and "pre-quantized (W4A16_AWQ" in str(err.value)
    assert "use the unquantized base as model.source" in str(err.value)


def _served_bundle(tmp: Path, adapters: object) -> Path:
    bundle = tmp / "bundle"
    (bundle / "model").mkdir(parents=True)
    (bundle / "adapters" / "plus-one").mkdir(parents=True)
    params = {"device": "cpu", "max_seq_len": 256, "max_batch_size": 4, "adapters": adapters}
    (bundle / "bundle.json").write_text(json.dumps({"params": params}))
    return bundle


def test_a_served_adapter_bundle_ships_the_scoring_server_with_each_adapter_and_a_forged_one_is_refused(
        tmp_path: Path):
    from enginefoundry.errors import InputError
    from enginefoundry.lanes.reference import ReferenceLane

    lane = ReferenceLane()
    bundle = _served_bundle(tmp_path, ["plus-one"])
    for cmd in (lane.serve_command(bundle, "h", 1), lane.named_serve_command(bundle, "h", 1, "tiny-chat"),
                lane.smoke_serve_command(bundle, "h", 1, "tiny-chat", _spec().lane_options)):
        argv = cmd.command.argv
        assert argv[1:3] == ["-m", "enginefoundry.smoke.serve"] and cmd.shipped
        assert argv[argv.index("--adapter") + 1] == f"plus-one={(bundle / 'adapters' / 'plus-one').resolve()}"
        assert "LoRA adapters" in cmd.command.description
    for i, forged in enumerate((["../model"], ["missing"], "plus-one", [], ["plus-one", "plus-one"])):
        with pytest.raises(InputError, match=r"params\.adapters is not a set of adapters this lane bundled"):
            lane.serve_command(_served_bundle(tmp_path / str(i), forged), "h", 1)


def test_plan_describes_the_served_set_on_the_scoring_server():
    from enginefoundry.lanes.reference import ReferenceLane

    spec = _spec(adapter_mode="serve")
    (unit,) = expand_units(spec)
    serve = ReferenceLane().describe(spec, unit)[-1]
    assert "--adapter" in serve.argv and "plus-one=<bundle>/adapters/plus-one" in serve.argv
    assert "transformers serve has no per-request adapter" in serve.description


@pytest.mark.parametrize(("args", "words"), [
    (["--adapter", "plus-one"], "NAME=DIR"),
    (["--adapter", "a=x", "--adapter", "a=y"], "distinct NAME"),
    (["--adapter", "a=x", "--draft", "d"], "cannot be combined"),
    (["--ignore-adapters"], "--ignore-adapters needs --adapter"),
    (["--adapter", "m=x", "--name", "m"], "cannot name an adapter"),
])
def test_the_scoring_server_refuses_bad_adapter_arguments_before_loading_anything(args: list[str], words: str,
                                                                                   capsys: pytest.CaptureFixture[str]):
    from enginefoundry.smoke.serve import main

    with pytest.raises(SystemExit) as exited:
        main(["/nonexistent-model", *args])
    assert exited.value.code == 2 and words in capsys.readouterr().err


def test_served_figures_are_the_difference_of_two_counter_readings_and_reach_the_summary():
    from enginefoundry.bench.report import SweepReport
    from enginefoundry.tasks.bench import served_between

    before = {"tiny-chat": (2, 10, 1.0), "plus-one": (0, 0, 0.0)}
    after = {"tiny-chat": (5, 40, 1.6), "plus-one": (3, 24, 0.9)}
    figures = served_between(before, after, {"tiny-chat": 0.5, "plus-one": 0.5})
    assert figures["tiny-chat"].requests == 3 and figures["tiny-chat"].completion_tokens == 30
    assert figures["tiny-chat"].share == figures["plus-one"].share == 0.5
    assert figures["tiny-chat"].mean_latency_ms == 200.0 and figures["plus-one"].mean_latency_ms == 300.0
    idle = served_between(after, after)["plus-one"]
    assert idle.requests == 0 and idle.share == 0.0 and idle.mean_latency_ms is None
    report = SweepReport(points=[], slo=[], exports=[], duration_s=0.0, served=figures)
    assert report.summary()["bench_served_plus-one_share"] == 0.5
    assert "| plus-one | 3 | 0.500 (0.500) | 24 | 300.0 |" in report.slo_markdown()


def test_the_mix_gives_the_base_what_the_shares_leave_and_repeats_names_in_proportion():
    from enginefoundry.bench.mix import round_robin, served_shares

    even = _spec(adapter_mode="serve")
    assert served_shares(even, "tiny-chat") == {"tiny-chat": 0.5, "plus-one": 0.5}
    assert round_robin(served_shares(even, "tiny-chat")) == ["tiny-chat", "plus-one"]
    mixed = _spec(adapter_mode="serve", adapters=[{**_adapter("a", ADAPTERS / "plus-one"), "traffic_share": 0.6},
                                                  _adapter("b", ADAPTERS / "plus-one")])
    shares = served_shares(mixed, "tiny-chat")
    assert shares == pytest.approx({"tiny-chat": 0.2, "a": 0.6, "b": 0.2})
    names = round_robin(shares)
    assert sorted(names) == ["a", "a", "a", "b", "tiny-chat"] and names[:2] != ["a", "a"]  # 3:1:1, interleaved
    assert round_robin({"x": 0.99, "y": 0.01}).count("y") == 1 and len(round_robin({"x": 0.99, "y": 0.01})) <= 20
    assert round_robin({"x": 1.0, "base": 0.0}) == ["x"]


@pytest.mark.parametrize(("model", "words"), [
    ({"adapter_mode": "merge", "adapters": [{**_adapter("a", ADAPTERS / "plus-one"), "traffic_share": 0.5}]},
     "set adapter_mode: serve"),
    ({"adapter_mode": "serve", "adapters": [{**_adapter("a", ADAPTERS / "plus-one"), "traffic_share": 0.7},
                                            {**_adapter("b", ADAPTERS / "plus-one"), "traffic_share": 0.4}]},
     "add up to 1.1, over 1"),
    ({"adapter_mode": "serve", "adapters": [_adapter("tiny-chat", ADAPTERS / "plus-one")]},
     "would be asked by the base's model name"),
    ({"adapter_mode": "serve", "adapters": [{**_adapter("a", ADAPTERS / "plus-one"), "traffic_share": 0}]},
     "traffic_share"),
])
def test_a_bad_traffic_share_or_an_adapter_named_like_the_base_is_refused(model: dict[str, Any], words: str):
    with pytest.raises(SpecError) as err:
        _spec(**model)
    assert words in str(err.value)


def _fetched(**digests: str) -> dict[str, SourceSnapshot]:
    return {name: SourceSnapshot(uri=f"file:///{name}", kind="local", local_dir=f"/{name}", weights_digest=digest,
                                 tokenizer_digest="", files={}) for name, digest in digests.items()}


@pytest.mark.parametrize("mode", ["merge", "serve"])
def test_a_cluster_worker_fetches_what_its_unit_needs_and_refuses_an_adapter_that_moved(mode: str):
    """Cluster mode (flows/build_unit.py): a merge unit's worker fetches its own adapter, a serve unit's every one;
    the fetched digests must be the ones in the unit's key that the parent sent."""
    spec = _spec(adapter_mode=mode, adapters=[_adapter("plus-one", ADAPTERS / "plus-one"),
                                              _adapter("other", ADAPTERS / "plus-one")])
    digests = {"plus-one": "a1", "other": "b1"}
    for unit in expand_units(spec):
        needed = [a.name for a in unit_adapters(spec, unit.adapter).model.adapters]
        assert needed == ([unit.adapter] if mode == "merge" else ["plus-one", "other"])
        sent = KeyComponents.of(unit_key_components(spec, unit, SourceDigests(weights="w", tokenizer="t",
                                                                              adapters=digests), {}, spec.lane_options))
        assert changed_adapters(sent.adapter, _fetched(**{n: digests[n] for n in needed})) == []
        moved = {**{n: digests[n] for n in needed}, needed[0]: "a2"}  # a new revision after the parent fetched it
        assert changed_adapters(sent.adapter, _fetched(**moved)) == [needed[0]]
        assert changed_adapters(sent.adapter, {}) == sorted(needed)
    plain = parse_spec(yaml.safe_load((CONFIGS / "tiny-cpu.yaml").read_text()), base_dir=CONFIGS)
    assert unit_adapters(plain, None) is plain and changed_adapters(None, {}) == []
