"""The build spec: the shipped configs load, and every bad input names its field and the fix."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from enginefoundry.catalog.schemes import store_forms
from enginefoundry.errors import SpecError
from enginefoundry.inputs.units import expand_units
from enginefoundry.spec import Precision, load_spec, parse_source_uri, parse_spec
from tests.support.paths import REPO

TINY = yaml.safe_load((REPO / "configs" / "tiny-cpu.yaml").read_text())


def _problems(data: dict) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    return dict(info.value.problems)


def test_shipped_configs_load_with_the_asked_matrix():
    tiny = load_spec(REPO / "configs" / "tiny-cpu.yaml")
    assert tiny.lane == "reference" and [u.name for u in expand_units(tiny)] == ["fp32-tp1.chat.cpu"]
    assert tiny.publish.store.startswith("file://") and tiny.tracking.mlflow_uri.startswith("sqlite:///")

    big = load_spec(REPO / "configs" / "llama-3-70b-tp2-a100.yaml")
    (unit,) = expand_units(big)
    assert (unit.variant.precision, unit.variant.tp) == (Precision.FP16, 2)
    p = unit.profile
    assert (p.max_batch_size, p.max_input_len, p.max_seq_len) == (128, 4096, 6144)
    assert p.kv_cache_free_gpu_memory_fraction == 0.8 and p.paged_kv_cache and p.remove_input_padding
    assert unit.target.arch.value == "sm80" and unit.target.gpu_count == 2

    multi = load_spec(REPO / "configs" / "llama-3.1-8b-multiarch.yaml")
    pairs = {(u.variant.precision.value, u.target.arch.value) for u in expand_units(multi)}
    assert pairs == {("bf16", "sm80"), ("bf16", "sm89"), ("bf16", "sm90"), ("fp8", "sm89"), ("fp8", "sm90")}


def test_every_problem_is_reported_at_once_with_its_path():
    data = copy.deepcopy(TINY)
    data["model"]["sourse"] = "typo"
    data["profiles"][0]["max_input_len"] = 512  # ≥ max_seq_len 256
    data["benchmark"]["concurrency"] = []
    problems = _problems(data)
    assert "unknown key" in problems["model.sourse"]
    assert "max_input_len (512) must be < max_seq_len (256)" in problems["profiles.0"]
    assert "benchmark.concurrency" in problems


@pytest.mark.parametrize(("raw", "fragment"), [
    ("hf://not a repo", "expected hf://org/name[@revision]"),
    ("hf://org/name@", "empty revision"),
    ("gs://bucket/x", "unknown source scheme 'gs://'"),
    ("s3://bucket", "expected s3://bucket/prefix/"),
])
def test_malformed_source_uris_say_what_is_accepted(raw, fragment):
    with pytest.raises(ValueError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        parse_source_uri(raw)
    data = copy.deepcopy(TINY)
    data["model"]["source"] = raw
    assert fragment in _problems(data)["model.source"]


def test_hf_uri_keeps_revision_and_defaults_to_main():
    assert parse_source_uri("hf://org/name@v1.0").revision == "v1.0"
    assert parse_source_uri("hf://org/name").revision == "main"


def test_unknown_lane_and_store_scheme_are_refused():
    data = copy.deepcopy(TINY)
    data["lane"] = "vllm"
    data["publish"] = {"store": "ftp://b/p"}
    problems = _problems(data)
    assert "lane 'vllm' is unknown" in problems["lane"]
    assert f"use {store_forms()}" in problems["publish.store"]  # the catalog's schemes: s3://… or file://…
    assert "s3://bucket/prefix" in store_forms() and "file://path" in store_forms()


def test_missing_file_and_bad_yaml(tmp_path: Path):
    with pytest.raises(SpecError, match="does not exist"):
        load_spec(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(bad)


def test_relative_inputs_resolve_from_the_spec_folder():
    spec = load_spec(REPO / "configs" / "tiny-cpu.yaml")
    assert spec.resolve_path(spec.smoke.prompts) == REPO / "configs" / "prompts" / "tiny-chat.jsonl"
    assert spec.model.parsed_source(spec.base_path).location == str(REPO / "tests" / "fixtures" / "tiny-chat" / "model")


def test_removed_trtllm_flag_in_a_profile_names_its_release_and_replacement():
    data = copy.deepcopy(TINY)
    data["profiles"][0]["max_output_len"] = 128
    msg = _problems(data)["profiles.0.max_output_len"]
    assert "removed in TensorRT-LLM 0.12" in msg and "max_seq_len" in msg


def test_a_scenario_longer_than_a_profile_is_refused_naming_the_field():
    """A 5000-token scenario on a 128-token profile used to validate (and fail at the server after the build)."""
    import yaml

    from enginefoundry.errors import SpecError
    from enginefoundry.spec import parse_spec
    from tests.support.paths import CONFIGS

    data = yaml.safe_load((CONFIGS / "tiny-cpu.yaml").read_text())
    data["benchmark"]["scenarios"][0]["input_tokens_mean"] = 5000
    with pytest.raises(SpecError) as err:
        parse_spec(data)
    expected = "5000 exceeds profile chat's max_input_len (128); lower it or raise the profile's limit"
    assert ("benchmark.scenarios.0.input_tokens_mean", expected) in err.value.problems
    data["benchmark"]["scenarios"][0].update(input_tokens_mean=100, output_tokens_mean=200)
    with pytest.raises(SpecError, match=r"benchmark.scenarios.0.output_tokens_mean: input 100 \+ output 200"):
        parse_spec(data)
