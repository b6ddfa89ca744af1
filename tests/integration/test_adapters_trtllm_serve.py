"""LoRA adapters in serve mode on lane trtllm (issue 36 item 2), on this CPU: the bundle as the lane's build writes it
(the fetched adapter copied into <bundle>/adapters/plus-one, the runtime YAML's lora_config naming it relative to the
server's working folder) is served by the fake TensorRT-LLM 1.3 trtllm-serve (tests/fixtures/fake-trtllm/fakehelp.py:
the scoring server with the lora_config adapters, selecting per request by the body's `lora_request` as trtllm-serve
does), judged by the real gate: the base asked by the served model's name against the base's reference, the adapter
asked with its lora_request against its own reference (the base with the adapter merged). A server that ignores the
adapters (EF_FAKE_TRTLLM_IGNORE_ADAPTERS=1: every request answered by the base) is rejected by `adapter plus-one`.
The stages' functions, no Prefect run."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from enginefoundry.inputs.adapters import fetch_adapters
from enginefoundry.inputs.sources import fetch
from enginefoundry.inputs.units import expand_units
from enginefoundry.lanes import get_lane
from enginefoundry.lanes.lora import bundle_adapters
from enginefoundry.lanes.trtllm import RUNTIME_CONFIG, runtime_config, write_runtime_configs
from enginefoundry.model_server import Endpoint, free_port, serving
from enginefoundry.spec import parse_spec
from enginefoundry.tasks.smoke import smoke_reference, smoke_served_adapters, smoke_test
from tests.support.paths import CONFIGS, REPO, TINY_MODEL

FAKE_13 = REPO / "tests" / "fixtures" / "fake-trtllm" / "1.3"
QUESTION = "What is 2 plus 3?"


def _spec(tmp: Path, mode: str = "serve", version: str = "1.3.0rc20"):
    data = yaml.safe_load((CONFIGS / "tiny-sm90.yaml").read_text())
    data.update(lane="trtllm", variants=[{"precision": "bf16"}], toolchain={"trtllm_version": version})
    data["model"].update(adapter_mode=mode, adapters=[
        {"name": "plus-one", "source": "../tests/fixtures/tiny-chat/adapters/plus-one"}])
    data["publish"] = {"store": (tmp / "store").as_uri()}
    return parse_spec(data, source="test spec", base_dir=CONFIGS)


def _bundle(spec, tmp: Path, adapters: dict[str, Path]) -> Path:
    bundle = tmp / "bundle"
    bundle.mkdir()
    names = bundle_adapters(bundle, adapters)
    write_runtime_configs(bundle, runtime_config(spec, expand_units(spec)[0], "1.3.0rc20"))
    (bundle / "bundle.json").write_text(json.dumps({
        "checkpoint": {"path": str(TINY_MODEL)}, "params": {"adapters": names}, "runtime_config": RUNTIME_CONFIG,
        "autotuner_cache": None}))
    return bundle


def _serve(spec, bundle: Path, tmp: Path, name: str, **env: str):
    cmd = get_lane("trtllm").smoke_serve_command(bundle, "127.0.0.1", free_port(), spec.model.name,
                                                 spec.lane_options)
    command = cmd.command.model_copy(update={"env": {
        **cmd.command.env, "PATH": f"{FAKE_13 / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "EF_FAKE_REAL_PYTHON": sys.executable, "PYTHONPATH": str(REPO), **env}})
    return serving(cmd.model_copy(update={"command": command}), tmp / f"{name}.log", timeout_s=120)


def _ask(ep: Endpoint, **fields: Any) -> str:
    body = {"model": ep.model_name, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 4, **fields}
    req = urllib.request.Request(f"{ep.base_url}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return str(json.load(resp)["choices"][0]["message"]["content"]).strip()


def test_trtllm_serves_the_adapter_per_lora_request_and_a_server_ignoring_it_is_rejected(tmp_path: Path,
                                                                                           monkeypatch):
    monkeypatch.setenv("EF_REFERENCE_CACHE", str(tmp_path / "refs"))
    monkeypatch.setenv("EF_CACHE_DIR", str(tmp_path / "cache"))
    spec = _spec(tmp_path)
    lane = get_lane("trtllm")
    assert lane.validate_options(spec) == []
    base = fetch(spec.model.parsed_source(spec.base_path), progress=str)
    adapters = fetch_adapters(spec, base, lane.name, lane.max_lora_rank, progress=str)
    bundle = _bundle(spec, tmp_path, {n: Path(a.local_dir) for n, a in adapters.items()})
    own = yaml.safe_load((bundle / RUNTIME_CONFIG).read_text())
    assert own["lora_config"]["lora_dir"] == ["adapters/plus-one"]
    selected = lane.adapter_request(spec, "plus-one")
    assert selected == {"lora_request": {"lora_name": "plus-one", "lora_int_id": 0, "lora_path": "adapters/plus-one"}}
    reference = smoke_reference.fn(spec, base.local_dir, base.weights_digest, precision="fp32")

    def judge(name: str, **env: str):
        with _serve(spec, bundle, tmp_path, name, **env) as ep:
            answers = {"base": _ask(ep), "plus-one": _ask(ep, **selected)}
            with pytest.raises(urllib.error.HTTPError) as by_name:  # trtllm-serve: not selected by `model`
                _ask(ep.model_copy(update={"model_name": "plus-one"}))
            assert by_name.value.code == 404
            report = smoke_test.fn(spec, ep, base.local_dir, str(tmp_path / name), precision="fp32",
                                   reference=reference)
            report = smoke_served_adapters.fn(spec, ep, base, adapters, report, str(tmp_path / name))
        return report, answers

    good, answers = judge("served")
    assert answers == {"base": "5", "plus-one": "6"}  # per request: the base's a + b, the adapter's a + b + 1
    assert good.passed, good.verdict.reason
    rule = next(r for r in good.verdict.rules if r.name == "adapter plus-one")
    assert rule.ok and rule.kind == "hard" and "asked as lora_request 'plus-one'" in rule.detail
    assert (tmp_path / "served" / "adapters" / "plus-one" / "smoke.json").is_file()

    broken, answers = judge("ignoring", EF_FAKE_TRTLLM_IGNORE_ADAPTERS="1")
    assert answers == {"base": "5", "plus-one": "5"}  # the base answers where the adapter was asked
    assert not broken.passed
    assert [r.name for r in broken.verdict.failed] == ["adapter plus-one"], broken.verdict.reason


def test_merge_mode_on_trtllm_converts_the_merged_checkpoint_like_any_other(tmp_path: Path, monkeypatch):
    """adapter_mode merge: the base with the adapter merged by PEFT is an ordinary Hugging Face checkpoint, which the
    lane passes through (a 16-bit variant) with a runtime YAML that has no LoRA key: allowed on every release."""
    from enginefoundry.inputs.adapters import merged_source

    monkeypatch.setenv("EF_CACHE_DIR", str(tmp_path / "cache"))
    spec = _spec(tmp_path, mode="merge", version="1.2.1")
    lane = get_lane("trtllm")
    assert lane.validate_options(spec) == []
    base = fetch(spec.model.parsed_source(spec.base_path), progress=str)
    adapters = fetch_adapters(spec, base, lane.name, lane.max_lora_rank, progress=str)
    merged = merged_source(base, "plus-one", adapters["plus-one"], progress=str)
    (unit,) = expand_units(spec)
    assert unit.adapter == "plus-one"
    converted = lane.convert(spec, unit.variant, Path(merged.local_dir), tmp_path / "unit")
    assert converted.checkpoint_dir == merged.local_dir and converted.params["passthrough"]
    assert not any(k.startswith("lora") for k in runtime_config(spec, unit, "1.2.1"))


def test_an_adapter_above_the_rank_bound_is_refused_on_trtllm_before_any_download():
    """The fixture's wrong-rank adapter (rank 128) against lane trtllm: refused from adapter_config.json alone, with
    the field and the fix (the spec's model.max_lora_rank 64, TensorRT-LLM's LoraConfig default)."""
    from enginefoundry.inputs.adapters import adapter_problems

    data = yaml.safe_load((CONFIGS / "tiny-sm90.yaml").read_text())
    data.update(lane="trtllm", variants=[{"precision": "bf16"}], toolchain={"trtllm_version": "1.3.0rc20"})
    data["model"].update(adapter_mode="serve", adapters=[
        {"name": "wide", "source": "../tests/fixtures/tiny-chat/adapters/wrong-rank"}])
    spec = parse_spec(data, source="test spec", base_dir=CONFIGS)
    lane = get_lane("trtllm")
    ((field, why),) = adapter_problems(spec, lane.name, lane.max_lora_rank)
    assert field == "model.adapters.0" and "rank 128" in why and "raise model.max_lora_rank" in why


def _counts(ep: Endpoint) -> dict[str, int]:
    """Requests so far per served name, as the fake trtllm-serve (the scoring server) counts them."""
    from enginefoundry.tasks.bench import served_counts

    counts = served_counts(ep.base_url)
    assert counts is not None
    return {name: c[0] for name, c in counts.items()}


def test_the_benchmark_sends_the_adapter_mix_on_trtllm_as_lora_requests(tmp_path: Path):
    """AIPerf against trtllm-serve serving the base and plus-one (traffic_share 0.75): the mix goes as a single_turn
    dataset whose records carry plus-one's lora_request (the `model` stays the base's), the server answers that many
    with the adapter, and AIPerf's per-request records give each one's requests, share, tokens and latency. Before,
    every request went to the base."""
    from enginefoundry.tasks.bench import benchmark

    spec = _spec(tmp_path)
    adapters_spec = [spec.model.adapters[0].model_copy(update={"traffic_share": 0.75})]
    bench = spec.benchmark.model_copy(update={"enabled": True, "concurrency": [1, 2], "request_count": 8,
                                              "warmup_request_count": 2})
    spec = spec.model_copy(update={"benchmark": bench,
                                   "model": spec.model.model_copy(update={"adapters": adapters_spec})})
    base = fetch(spec.model.parsed_source(spec.base_path), progress=str)
    adapters = fetch_adapters(spec, base, "trtllm", get_lane("trtllm").max_lora_rank, progress=str)
    bundle = _bundle(spec, tmp_path, {n: Path(a.local_dir) for n, a in adapters.items()})
    with _serve(spec, bundle, tmp_path, "bench") as ep:
        before = _counts(ep)
        report = benchmark.fn(spec, ep, str(tmp_path / "bench"), "served set")
        after = _counts(ep)
        base_name = ep.model_name  # trtllm-serve's: the checkpoint as given
    assert report.valid, report.failures
    assert not [w for w in report.warnings if "adapter mix" in w]  # no "every request went to the base"
    sent = {n: after.get(n, 0) - before.get(n, 0) for n in after}
    assert sent["plus-one"] > sent[base_name] > 0, sent  # the server selected plus-one by lora_request
    assert sum(sent.values()) == 2 * (8 + 2)  # two points, warm-up included: every request answered by one of them
    served = report.served
    assert sorted(served) == sorted(["plus-one", base_name])
    assert sum(f.requests for f in served.values()) == 2 * 8  # the profiling phase's records
    for name, f in served.items():
        assert f.measured_by == "client" and 0 < f.requests <= sent[name]
        assert f.completion_tokens > 0 and f.mean_latency_ms is not None and f.mean_latency_ms > 0
    assert served["plus-one"].traffic_share == 0.75 and 0.6 <= served["plus-one"].share <= 0.9, served
    records = [json.loads(line) for line in (tmp_path / "bench" / "datasets" / "short.jsonl").read_text().splitlines()]
    assert len(records) == 8 + 2
    mine = [r for r in records if r["session_id"].endswith("~plus-one")]
    assert mine and all(r["extra"] == get_lane("trtllm").adapter_request(spec, "plus-one") for r in mine)
    assert all("extra" not in r for r in records if r not in mine)  # the base: nothing added
    assert "AIPerf's per-request records" in report.slo_markdown()
