"""Lanes own their knowledge: one registry, typed options per lane, preflight that names no lane, and a new lane
added by one folder plus one registry line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

import enginefoundry.planning.preflight as preflight_module
from enginefoundry.errors import SpecError
from enginefoundry.inputs.units import expand_units
from enginefoundry.lanes.registry import LaneEntry, get_lane, lane_names, register_lane, unregister_lane
from enginefoundry.planning.plan_report import plan_report
from enginefoundry.planning.preflight import preflight
from enginefoundry.spec import Target, parse_spec

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
FIXTURE_LANES = Path(__file__).resolve().parents[1] / "fixtures" / "lanes"
LLAMA_8B = json.loads((CONFIGS / "model-configs" / "llama-3.1-8b-instruct.json").read_text())


def echo_spec(**options):
    data = yaml.safe_load((CONFIGS / "llama-3.1-8b-multiarch.yaml").read_text())
    data.update(lane="echo", lane_options=options, toolchain={})
    return parse_spec(data, base_dir=CONFIGS)


@pytest.fixture
def echo_lane(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURE_LANES))
    register_lane(LaneEntry("echo", "echo_lane:EchoLane", "echo_lane:EchoOptions"))  # the one registry line
    yield
    unregister_lane("echo")


def test_a_new_lane_is_one_folder_and_one_registry_line(echo_lane):
    assert "echo" in lane_names()
    spec = echo_spec(greeting="hi")
    assert type(spec.lane_options).__name__ == "EchoOptions" and dict(spec.lane_options) == {"greeting": "hi"}
    unit = expand_units(spec)[0]
    assert get_lane("echo").describe(spec, unit)[0].argv == ["echo", "hi"]
    report = plan_report(spec)
    assert report.refused == 0 and report.commands[unit.name] == ["[serve] echo hi"]
    # its preflight check and its memory model, through a preflight that does not know it
    loud = echo_spec(loudness="loud")
    checks = {c.name: c for c in preflight(loud, expand_units(loud)[0], LLAMA_8B, None).checks}
    assert not checks["echo_volume"].ok and checks["echo_volume"].fix == "loudness: quiet"
    est = preflight(spec, unit, LLAMA_8B, None).estimates
    assert est.host_needed_bytes == 1  # 1.0 × the 10 % margin, truncated
    cpu_target = Target.model_validate({**spec.targets[0].model_dump(), "arch": "cpu", "name": "cpu"})
    cpu = spec.model_copy(update={"targets": [cpu_target]})
    assert "needs an NVIDIA GPU" in {c.name: c for c in preflight(cpu, expand_units(cpu)[0], None, None).checks}[
        "device"].message
    assert dict(get_lane("echo").validate_options(echo_spec())) == {}


def test_the_lanes_options_model_refuses_unknown_keys_in_its_own_words(echo_lane):
    with pytest.raises(SpecError) as err:
        echo_spec(greeting="hi", volume=11, loudness="deafening")
    problems = dict(err.value.problems)
    assert problems["lane_options.volume"] == "echo has no option volume; it has greeting, loudness"
    assert problems["lane_options.loudness"] == "must be one of quiet, loud; got 'deafening'"


def test_an_unregistered_lane_is_refused_with_the_registered_ones():
    data = yaml.safe_load((CONFIGS / "llama-3.1-8b-multiarch.yaml").read_text())
    data["lane"] = "echo"
    with pytest.raises(SpecError) as err:
        parse_spec(data)
    assert "use one of reference, trtllm, trtllm-engine" in dict(err.value.problems)["lane"]


def test_preflight_names_no_lane():
    source = Path(preflight_module.__file__).read_text()
    named = [lane for lane in lane_names() if re.search(rf"[\"']{re.escape(lane)}[\"']", source)]
    assert named == [] and "spec.lane ==" not in source and "lane_options" not in source


def test_each_shipped_lane_has_a_typed_options_model():
    for name, config in (("trtllm", "llama-3.1-8b-multiarch.yaml"), ("trtllm-engine", "llama-3-70b-tp2-a100.yaml"),
                         ("reference", "tiny-cpu.yaml")):
        spec = parse_spec(yaml.safe_load((CONFIGS / config).read_text()), base_dir=CONFIGS)
        assert spec.lane == name
        assert spec.model_dump(mode="json")["lane_options"] == dict(spec.lane_options)  # as written, no defaults
    with pytest.raises(SpecError, match=r"lane_options\.anything"):
        parse_spec({**yaml.safe_load((CONFIGS / "tiny-cpu.yaml").read_text()), "lane_options": {"anything": 1}})


def test_a_spec_without_lane_options_gets_the_lanes_defaults():
    data = yaml.safe_load((CONFIGS / "llama-3.1-8b-multiarch.yaml").read_text())
    del data["lane_options"]
    spec = parse_spec(data, base_dir=CONFIGS)
    assert type(spec.lane_options).__name__ == "TrtllmOptions" and dict(spec.lane_options) == {}
    assert spec.lane_options.resolved()["warmup_requests"] == 8
