"""A disaggregated variant (issue 37 item 3): its name, key and GPUs; the refusals with the field and the fix before any
download (lanes without it, parallelism outside the roles, a release without the keys, what is not served
disaggregated here); preflight role by role; the launcher's own parsing (enginefoundry/lanes/disagg_launch.py), which
reads a file of the bundle: hostile content is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from enginefoundry.confine import UnsafePathError
from enginefoundry.errors import InputError, SpecError
from enginefoundry.inputs.units import expand_units
from enginefoundry.lanes import disagg_launch, get_lane
from enginefoundry.lanes.base import BUNDLE_INFO
from enginefoundry.planning.plan_report import plan_report
from enginefoundry.planning.preflight import preflight
from enginefoundry.planning.validate import validate_deep
from enginefoundry.spec import BuildSpec, Variant, parse_spec
from tests.support.paths import CONFIGS

ROLES = {"prefill": {"workers": 1, "tp": 1, "batch_size": 4}, "decode": {"workers": 2, "tp": 1, "batch_size": 8}}


def _spec(variant: dict[str, Any] | None = None, **top: Any) -> BuildSpec:
    data = yaml.safe_load((CONFIGS / "tiny-sm90.yaml").read_text())
    data.update(lane="trtllm", variants=[variant or {"precision": "bf16", "disaggregated": ROLES}],
                toolchain={"trtllm_version": "1.3.0rc20"})
    data["targets"][0]["gpu_count"] = 3
    data.update(top)
    return parse_spec(data, source="test spec", base_dir=CONFIGS)


def _problems(spec: BuildSpec) -> dict[str, str]:
    """field → its messages, joined."""
    with pytest.raises(SpecError) as err:
        validate_deep(spec)
    out: dict[str, str] = {}
    for field, message in err.value.problems:
        out[field] = f"{out[field]} | {message}" if field in out else message
    return out


def test_name_gpus_and_key_of_a_disaggregated_variant_and_a_plain_variant_keeps_its_key():
    v = _spec().variants[0]
    assert v.name == "bf16-disagg-p1xtp1b4-d2xtp1b8" and v.gpus == 3
    assert v.disaggregated is not None and v.disaggregated.total_gpus == 3  # the roles' sum, when not given
    assert v.key_json()["disaggregated"]["decode"]["workers"] == 2
    plain = Variant(precision="bf16", tp=2)
    assert "disaggregated" not in plain.key_json() and plain.gpus == 2  # keys from before the field are unchanged
    validate_deep(_spec())  # a valid one passes


def test_a_lane_that_serves_one_server_refuses_the_field_with_the_fix():
    problems = _problems(_spec(lane="reference", toolchain={}))
    assert "variants.0.disaggregated" in problems
    assert "use lane trtllm (trtllm-serve disaggregated)" in problems["variants.0.disaggregated"]


def test_parallelism_outside_the_roles_a_bad_role_shape_and_an_old_release_are_refused_per_field():
    got = _problems(_spec({"precision": "bf16", "tp": 2, "disaggregated": {
        "prefill": {"workers": 1, "tp": 2, "dp": 2, "batch_size": 4}, "decode": ROLES["decode"]}}))
    assert "set it in variants.0.disaggregated.prefill and .decode" in got["variants.0.tp"]
    assert "attention tp 2 inside attention DP 2" in got["variants.0.disaggregated.prefill.dp"]
    old = _problems(_spec(toolchain={"trtllm_version": "1.0.0rc3"}))
    assert "has no cache_transceiver_config" in old["toolchain.trtllm_version"]
    assert "pin toolchain.trtllm_version ≥ 1.0.0rc4" in old["toolchain.trtllm_version"]


def test_speculation_adapters_and_triton_are_not_served_disaggregated_here():
    got = _problems(_spec(speculative={"algorithm": "ngram", "max_draft_len": 3},
                          lane_options={"triton": True}))
    assert "not with a disaggregated variant here" in got["speculative"]
    assert "set lane_options.triton: false" in got["lane_options.triton"]


def test_an_unpinned_toolchain_leaves_the_keys_to_the_workers_probe():
    validate_deep(_spec(toolchain={}))


def test_preflight_counts_both_roles_gpus_and_estimates_memory_role_by_role():
    spec = _spec()
    [unit] = expand_units(spec)
    config = json.loads((CONFIGS.parent / "tests" / "fixtures" / "tiny-chat" / "model" / "config.json").read_text())
    ok = {c.name: c for c in preflight(spec, unit, config, None).checks}
    assert ok["parallelism"].ok and "3 GPUs: both roles' workers" in ok["parallelism"].message
    small = unit.model_copy(update={"target": unit.target.model_copy(update={"gpu_count": 2})})
    refused = {c.name: c for c in preflight(spec, small, config, None).checks}["parallelism"]
    assert not refused.ok and refused.fix == "gpu_count ≥ 3 on the target, or lower the roles' workers or parallelism"


def _plan(tmp: Path, workers: list[dict[str, Any]]) -> Path:
    plan = {"router": {"hostname": "localhost", "port": 8000}, "workers": workers}
    (tmp / "disagg.json").write_text(json.dumps(plan))
    return tmp


def test_the_launcher_reads_its_plan_and_refuses_a_config_outside_the_bundle(tmp_path: Path):
    folder = _plan(tmp_path, [{"role": "context", "config": "context.yaml", "gpus": [0]},
                              {"role": "generation", "config": "generation.yaml", "gpus": [1, 2]}])
    router, workers = disagg_launch.read_plan(folder)
    urls = [("context", "127.0.0.1:5001"), ("generation", "127.0.0.1:5002")]
    config = disagg_launch.router_config(router, "127.0.0.1", 9000, urls)
    assert config == {"hostname": "127.0.0.1", "port": 9000,
                      "context_servers": {"num_instances": 1, "urls": ["127.0.0.1:5001"]},
                      "generation_servers": {"num_instances": 1, "urls": ["127.0.0.1:5002"]}}
    assert [w.gpus for w in workers] == [[0], [1, 2]]
    for bad in ({"role": "context", "config": "../../etc/passwd", "gpus": [0]},
                {"role": "context", "config": ".hidden", "gpus": [0]},
                {"role": "router", "config": "context.yaml", "gpus": [0]},
                {"role": "context", "config": "context.yaml", "gpus": ["0; rm -rf /"]}):
        with pytest.raises(SystemExit, match="a worker needs role"):
            disagg_launch.read_plan(_plan(tmp_path, [bad]))


def test_a_workers_gpus_index_the_visible_devices_already_set(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert disagg_launch.gpu_env([2, 3]) == "2,3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-a,GPU-b,GPU-c")
    assert disagg_launch.gpu_env([1, 2]) == "GPU-b,GPU-c"
    with pytest.raises(SystemExit, match="not all among CUDA_VISIBLE_DEVICES"):
        disagg_launch.gpu_env([3])


def test_a_bundle_json_naming_a_launcher_outside_the_bundle_is_refused(tmp_path: Path):
    (tmp_path / BUNDLE_INFO).write_text(json.dumps({
        "checkpoint": {"path": str(tmp_path)},
        "disaggregated": {"launcher": "../evil.py", "plan": "disagg.json", "router": "disagg_config.yaml"}}))
    with pytest.raises((InputError, UnsafePathError)):
        get_lane("trtllm").serve_command(tmp_path, "127.0.0.1", 8000)


def test_plan_for_a_14_pin_names_the_disaggregated_keys_past_their_evidence_for_the_workers_probe():
    spec = _spec(toolchain={"trtllm_version": "1.4.0rc4"})
    report = plan_report(spec)
    [row] = report.rows
    assert row["verdict"] == "ok" and row["tp×pp"] == "disaggregated: P 1×tp1pp1 bs4 + D 2×tp1pp1 bs8"
    [probe] = [line for line in report.commands[row["unit"]] if line.startswith("(to be probed on the worker")]
    for item in ("trtllm-serve disaggregated config_file", "cache_transceiver_config.max_tokens_in_buffer",
                 "disable_overlap_scheduler", "generation_servers.urls"):
        assert item in probe
    assert report.commands[row["unit"]][-2].startswith("[serve: the router (the unit's endpoint)")
