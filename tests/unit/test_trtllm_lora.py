"""Lane trtllm's LoRA adapters (issue 36 item 2): `lora_config` in the LLM-API YAML for adapter_mode serve, every key
registered per release with its evidence, releases before it refused at validate with the fix, adapters whose target
modules TensorRT-LLM's default module map does not cover refused before any download, merge mode allowed (the merged
checkpoint is an ordinary checkpoint), the adapters bundled and linked into the server's working folder, a request
selecting its adapter by `lora_request`, and the worker's probe of LoraConfig's fields deciding."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from enginefoundry.errors import InputError
from enginefoundry.inputs.toolchain import ToolSurface, UnsupportedByRelease, check_against_surface
from enginefoundry.inputs.units import SourceDigests, expand_units, unit_key_components
from enginefoundry.lanes import get_lane
from enginefoundry.lanes.base import Command
from enginefoundry.lanes.lora import DEFAULT_TRTLLM_TO_HF, adapter_request, bundle_adapters
from enginefoundry.lanes.serve_files import serving_plan
from enginefoundry.lanes.trtllm import RUNTIME_CONFIG, runtime_config
from enginefoundry.lanes.trtllm_flags import (
    ABSENT,
    LLM_API,
    PRESENT,
    TO_BE_PROBED,
    flag,
    llm_api_key_paths,
    registry_verdict,
    unknown_llm_api_keys,
)
from enginefoundry.spec import BuildSpec, parse_spec
from tests.support.paths import CONFIGS, TINY_MODEL

ADAPTERS = TINY_MODEL.parent / "adapters"
LORA_KEYS = ["lora_config", "lora_config.lora_dir", "lora_config.max_lora_rank", "lora_config.max_loras",
             "lora_config.max_cpu_loras", "lora_config.lora_ckpt_source"]


def _spec(version: str | None = "1.3.0rc20", mode: str | None = "serve", adapters: list[Any] | None = None,
          **fields: Any) -> BuildSpec:
    data = yaml.safe_load((CONFIGS / "tiny-sm90.yaml").read_text())
    data.update(lane="trtllm", variants=[{"precision": "bf16"}], toolchain={"trtllm_version": version} if version
                else {}, **fields)
    if mode is not None:
        data["model"]["adapters"] = adapters or [{"name": "plus-one", "source": str(ADAPTERS / "plus-one")}]
        data["model"]["adapter_mode"] = mode
    return parse_spec(data, source="test spec", base_dir=CONFIGS)


def test_a_spec_without_adapters_writes_no_lora_config_and_keeps_its_key():
    spec = _spec(mode=None)
    cfg = runtime_config(spec, expand_units(spec)[0], "1.3.0rc20")
    assert not any(k.startswith("lora") for k in cfg)
    # merge mode: the merged checkpoint is converted like any other, nothing LoRA-specific in the YAML
    merged = _spec(mode="merge")
    assert not any(k.startswith("lora") for k in runtime_config(merged, expand_units(merged)[0], "1.3.0rc20"))


def test_serve_mode_writes_lora_config_every_key_registered_with_evidence():
    spec = _spec(adapters=[{"name": "plus-one", "source": str(ADAPTERS / "plus-one")},
                           {"name": "again", "source": str(ADAPTERS / "plus-one")}], )
    cfg = runtime_config(spec, expand_units(spec)[0], "1.3.0rc20")
    assert cfg["lora_config"] == {"lora_dir": ["adapters/plus-one", "adapters/again"], "max_lora_rank": 64,
                                  "max_loras": 2, "max_cpu_loras": 2, "lora_ckpt_source": "hf"}
    paths = llm_api_key_paths(cfg)
    assert set(LORA_KEYS) <= set(paths) and unknown_llm_api_keys(cfg) == []
    for key in LORA_KEYS:
        entry = flag(LLM_API, key)
        assert any("lora_helper.py@037d4ba1" in r for r in entry.refs) and any("lora.md@" in r for r in entry.refs)
        assert entry.status("1.2.1") == ABSENT and entry.status("1.3.0rc20") == PRESENT
        assert entry.status("1.4.0rc4") == PRESENT and entry.status("1.5.0") == TO_BE_PROBED
    serve = Command(argv=["trtllm-serve"], llm_api_keys=paths)
    assert registry_verdict([serve], "1.3.0rc20") == ([], [])
    assert set(registry_verdict([serve], "1.5.0").to_be_probed) >= {f"LLM API option {k}" for k in LORA_KEYS}


def test_lora_config_is_the_only_difference_and_a_plain_units_key_has_no_adapter():
    plain, served = _spec(mode=None), _spec()
    mine = runtime_config(served, expand_units(served)[0], "1.3.0rc20")
    assert {k: v for k, v in mine.items() if k != "lora_config"} == \
        runtime_config(plain, expand_units(plain)[0], "1.3.0rc20")
    digests = SourceDigests(weights="w", tokenizer="t")
    components = unit_key_components(plain, expand_units(plain)[0], digests, {}, plain.lane_options)
    assert "adapter" not in components and "lora" not in json.dumps(components)


def test_a_release_before_the_evidence_is_refused_at_validate_with_the_pin_and_merge_is_not():
    lane = get_lane("trtllm")
    problems = dict(lane.validate_options(_spec(version="1.2.1")))
    why = problems["model.adapter_mode"]
    assert "lora_config" in why and "1.2.1" in why and "toolchain.trtllm_version 1.3.0rc24" in why
    assert "adapter_mode: merge" in why
    assert "model.adapter_mode" not in dict(lane.validate_options(_spec(version="1.2.1", mode="merge")))
    assert not [p for p in lane.validate_options(_spec()) if p[0].startswith("model.")]
    # the common preflight (inputs/adapters.py) no longer refuses the lane: it builds adapters up to the spec's bound
    assert lane.max_lora_rank == 1024


def test_target_modules_outside_the_default_module_map_are_refused_before_any_download(tmp_path: Path):
    odd = tmp_path / "odd"
    shutil.copytree(ADAPTERS / "plus-one", odd)
    cfg = json.loads((odd / "adapter_config.json").read_text())
    (odd / "adapter_config.json").write_text(json.dumps({**cfg, "target_modules": ["q_proj", "lm_head"]}))
    pattern = tmp_path / "pattern"
    shutil.copytree(ADAPTERS / "plus-one", pattern)
    (pattern / "adapter_config.json").write_text(json.dumps({**cfg, "target_modules": r".*\.q_proj"}))
    spec = _spec(adapters=[{"name": "plus-one", "source": str(ADAPTERS / "plus-one")},
                           {"name": "odd", "source": str(odd)}, {"name": "pattern", "source": str(pattern)}])
    problems = [p for p in get_lane("trtllm").validate_options(spec) if p[0].startswith("model.adapters")]
    assert [f for f, _ in problems] == ["model.adapters.1", "model.adapters.2"]
    assert "['lm_head']" in problems[0][1] and "default module map" in problems[0][1]
    assert "list them by name" in problems[1][1]
    assert set(DEFAULT_TRTLLM_TO_HF.values()) >= set(cfg["target_modules"])  # the fixture's own modules are mapped


def test_the_triton_repository_with_served_adapters_is_refused():
    spec = _spec(lane_options={"triton": True, "triton_dir": "/nonexistent"})
    assert "lane_options.triton" in dict(get_lane("trtllm").validate_options(spec))


def test_a_request_selects_its_adapter_by_lora_request_the_model_staying_the_base():
    spec = _spec(adapters=[{"name": "plus-one", "source": str(ADAPTERS / "plus-one")},
                           {"name": "again", "source": str(ADAPTERS / "plus-one")}])
    assert get_lane("trtllm").adapter_request(spec, "again") == adapter_request(spec, "again") == {
        "lora_request": {"lora_name": "again", "lora_int_id": 1, "lora_path": "adapters/again"}}
    assert get_lane("reference").adapter_request(spec, "again") is None  # the reference lane: by `model` name


def test_the_bundle_carries_the_adapters_and_the_server_links_them(tmp_path: Path):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    assert bundle_adapters(bundle, {"plus-one": ADAPTERS / "plus-one"}) == ["plus-one"]
    for f in (ADAPTERS / "plus-one").iterdir():  # a copy: the user's folder shares no inode with it
        copied = bundle / "adapters" / "plus-one" / f.name
        assert copied.read_bytes() == f.read_bytes() and copied.stat().st_ino != f.stat().st_ino
    spec = _spec()
    (bundle / RUNTIME_CONFIG).write_text(yaml.safe_dump(runtime_config(spec, expand_units(spec)[0], "1.3.0rc20")))
    info = {"checkpoint": {"path": str(TINY_MODEL)}, "params": {"adapters": ["plus-one"]},
            "runtime_config": RUNTIME_CONFIG}
    (bundle / "bundle.json").write_text(json.dumps(info))
    cmd = get_lane("trtllm").serve_command(bundle, "127.0.0.1", 8000)
    assert cmd.links == {"adapters": str((bundle / "adapters").resolve())}
    assert "LoRA" in cmd.command.description
    plan = serving_plan(get_lane("trtllm"), bundle, unit="u", model="tiny-chat", key="k", artifact_uri="s3://b/u",
                        checkpoint_dir=None, checkpoint_uri=None)
    assert plan.links == {"adapters": "${EF_UNIT_DIR}/bundle/adapters"}  # serve.sh: relocatable, like the draft
    (bundle / "bundle.json").write_text(json.dumps({**info, "params": {"adapters": ["../../etc"]}}))
    with pytest.raises(InputError, match="rebuild"):
        get_lane("trtllm").serve_command(bundle, "127.0.0.1", 8000)


def test_the_build_refuses_a_serving_unit_without_its_fetched_adapters(tmp_path: Path):
    with pytest.raises(InputError, match=r"model\.adapters"):
        get_lane("trtllm").refuse_adapters(_spec(), {})  # type: ignore[attr-defined]


def _surface(lora_fields: list[str] | None) -> ToolSurface:
    api = {"": ["lora_config", "max_batch_size"], **({"lora_config": lora_fields} if lora_fields is not None else {})}
    return ToolSurface(tensorrt_llm="1.5.0", llm_api=api)


def test_the_workers_probe_of_loraconfig_decides_past_the_evidence():
    cmd = Command(argv=["x"], llm_api_keys=LORA_KEYS)
    check_against_surface([cmd], _surface(["lora_dir", "lora_ckpt_source", "max_lora_rank", "max_loras",
                                           "max_cpu_loras"]))
    with pytest.raises(UnsupportedByRelease, match=r"lora_config\.max_cpu_loras"):
        check_against_surface([cmd], _surface(["lora_dir", "lora_ckpt_source", "max_lora_rank", "max_loras"]))


@pytest.mark.parametrize("given", [
    "adapters/plus-one", {"lora_name": "a", "lora_int_id": -1, "lora_path": "x"},
    {"lora_name": "a", "lora_int_id": True, "lora_path": "x"}, {"lora_name": "a", "lora_int_id": 0, "lora_path": ""},
    {"lora_name": 3, "lora_int_id": 0, "lora_path": "x"}])
def test_the_scoring_servers_lora_request_is_bounded_like_trtllm_serves(given: Any):
    from enginefoundry.smoke.serve import RequestError, _lora_fields

    with pytest.raises(RequestError, match="lora_request"):
        _lora_fields(given)
    assert _lora_fields({"lora_name": "a", "lora_int_id": 0, "lora_path": "adapters/a"}) == ("a", 0, "adapters/a")


def test_the_benchmark_sends_lane_trtllms_adapter_mix_by_lora_request_with_aiperf_only(tmp_path: Path):
    from enginefoundry.bench.mix import MixPlan, plan_mix
    from enginefoundry.spec.checks import BenchTool
    from enginefoundry.tasks.bench import adapter_fields

    def plan(spec: BuildSpec) -> MixPlan:
        served = ["m", *(a.name for a in spec.model.adapters)] if spec.model.serves_adapters else []
        return plan_mix(spec, "m", str(TINY_MODEL), served, adapter_fields(spec, "m"), tmp_path / "datasets")

    spec = _spec()
    fields = adapter_fields(spec, "m")
    assert fields is not None and fields["m"] is None  # the base: nothing added, its `model` name selects it
    assert fields["plus-one"] == {"lora_request": {"lora_name": "plus-one", "lora_int_id": 0,
                                                   "lora_path": "adapters/plus-one"}}
    aiperf = plan(spec)  # AIPerf (the default) sends each record's lora_request
    assert aiperf.warning is None and aiperf.datasets is not None
    genai = spec.model_copy(update={"benchmark": spec.benchmark.model_copy(update={"tool": BenchTool.GENAI_PERF})})
    why = plan(genai).warning
    assert why is not None and "lora_request" in why and "every request went to the base" in why
    assert plan(_spec(mode="merge")).warning is None and plan(_spec(mode=None)).warning is None
    assert adapter_fields(_spec(mode="merge"), "m") is None


def test_plan_names_the_served_adapters():
    spec = _spec()
    (serve,) = [c for c in get_lane("trtllm").describe(spec, expand_units(spec)[0]) if c.tool == "trtllm-serve"]
    assert "1 LoRA adapters (lora_config)" in serve.description and "lora_config.lora_dir" in serve.llm_api_keys
