"""LoRA adapters in serve mode on the reference lane, on this CPU (issue 36): one unit serves the base and the real
tiny adapter (tests/fixtures/tiny-chat/adapters/plus-one, trained with PEFT by scripts/make_tiny_lora.py). The lane
bundles the fetched adapter beside the base (a copy, never a hard link into the user's folder), the scoring server
loads both with PEFT and picks per request by the OpenAI `model` name, and the real gate judges the base (asked by
the model's name) against the base's fp32 reference and the adapter (asked by its name) against its own reference,
the base with the adapter merged. The same bundle served with the server's test-only --ignore-adapters (every
request answered by the base) is rejected by that adapter's rule. The stages' functions, no Prefect run."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import yaml

from enginefoundry.inputs.adapters import fetch_adapters, served_source
from enginefoundry.inputs.sources import fetch
from enginefoundry.inputs.units import expand_units
from enginefoundry.lanes import get_lane
from enginefoundry.lanes.serve_files import serving_plan
from enginefoundry.model_server import Endpoint, free_port, serving
from enginefoundry.records.lineage import adapter_tags, served_adapters_of
from enginefoundry.schemas.manifest import SourcePart
from enginefoundry.spec import parse_spec
from enginefoundry.tasks.smoke import smoke_reference, smoke_served_adapters, smoke_test
from enginefoundry.tracking_tags import ADAPTER, ADAPTER_DIGEST
from tests.support.paths import CONFIGS, REPO


def _spec(tmp: Path, **adapter: object):
    data = yaml.safe_load((CONFIGS / "tiny-lora.yaml").read_text())
    data["model"]["adapter_mode"] = "serve"
    data["model"]["adapters"][0].update(adapter)
    data["publish"]["store"] = (tmp / "store").as_uri()
    data["tracking"]["mlflow_uri"] = f"sqlite:///{tmp / 'mlflow.db'}"
    data["benchmark"]["enabled"] = False
    return parse_spec(data, source="test spec", base_dir=CONFIGS)


def _serve(lane, bundle: Path, spec, log: Path, *extra: str):
    cmd = lane.smoke_serve_command(bundle, "127.0.0.1", free_port(), spec.model.name, spec.lane_options)
    command = cmd.command.model_copy(update={"argv": [*cmd.command.argv, *extra],
                                             "env": {**cmd.command.env, "PYTHONPATH": str(REPO)}})
    return serving(cmd.model_copy(update={"command": command}), log, timeout_s=120)


def _ask(ep: Endpoint, model: str, question: str) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": question}], "max_tokens": 4}
    req = urllib.request.Request(f"{ep.base_url}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return str(json.load(resp)["choices"][0]["message"]["content"]).strip()


def test_one_unit_serves_base_and_adapter_each_gated_and_a_unit_ignoring_the_adapter_is_rejected(
        tmp_path: Path, monkeypatch):
    monkeypatch.setenv("EF_REFERENCE_CACHE", str(tmp_path / "refs"))
    monkeypatch.setenv("EF_CACHE_DIR", str(tmp_path / "cache"))
    spec = _spec(tmp_path)
    lane = get_lane("reference")
    base = fetch(spec.model.parsed_source(spec.base_path), progress=str)
    adapters = fetch_adapters(spec, base, lane.name, lane.max_lora_rank, progress=str)
    (unit,) = expand_units(spec)
    assert unit.adapter is None and unit.name == "fp32-tp1.chat.cpu"  # one unit: the base serving every adapter

    # Lineage: the unit's source is the base, recording every adapter of the set (manifest, MLflow tags).
    source = served_source(base, adapters).model_dump(mode="json")
    (served,) = served_adapters_of(SourcePart.model_validate(source)) or []
    assert served.name == "plus-one" and served.weights_digest == adapters["plus-one"].weights_digest
    assert adapter_tags(source)[ADAPTER] == "plus-one"
    assert adapter_tags(source)[ADAPTER_DIGEST] == adapters["plus-one"].weights_digest

    ckpt = lane.convert(spec, unit.variant, Path(base.local_dir), tmp_path / "unit")
    build = lane.build(spec, unit, Path(ckpt.checkpoint_dir), tmp_path / "unit",
                       adapter_dirs={"plus-one": Path(adapters["plus-one"].local_dir)})
    bundle = Path(build.bundle_dir)
    assert build.params["adapters"] == ["plus-one"]
    for f in Path(adapters["plus-one"].local_dir).iterdir():  # copied: the user's folder shares no inode with it
        bundled = bundle / "adapters" / "plus-one" / f.name
        assert bundled.read_bytes() == f.read_bytes() and bundled.stat().st_ino != f.stat().st_ino

    shipped = lane.serve_command(bundle, "127.0.0.1", 8000)
    assert shipped.shipped and "--adapter" in shipped.command.argv  # transformers serve has no per-request adapter
    plan = serving_plan(lane, bundle, unit=unit.name, model=spec.model.name, key="k", artifact_uri="s3://b/u",
                        checkpoint_dir=None, checkpoint_uri=None)
    assert "plus-one=${EF_UNIT_DIR}/bundle/adapters/plus-one" in plan.argv  # serve.sh: relocatable

    reference = smoke_reference.fn(spec, base.local_dir, base.weights_digest, precision="fp32")

    def judge(name: str, *extra: str):
        with _serve(lane, bundle, spec, tmp_path / f"{name}.log", *extra) as ep:
            answers = {m: _ask(ep, m, "What is 2 plus 3?") for m in (spec.model.name, "plus-one")}
            with urllib.request.urlopen(f"{ep.base_url}/v1/models", timeout=30) as resp:
                models = [m["id"] for m in json.load(resp)["data"]]
            report = smoke_test.fn(spec, ep, base.local_dir, str(tmp_path / name), precision="fp32",
                                   reference=reference)
            report = smoke_served_adapters.fn(spec, ep, base, adapters, report, str(tmp_path / name))
        return report, answers, models

    good, answers, models = judge("served")
    assert models == [spec.model.name, "plus-one"]
    assert answers == {spec.model.name: "5", "plus-one": "6"}  # per request: the base's a + b, the adapter's + 1
    assert good.passed, good.verdict.reason
    rule = next(r for r in good.verdict.rules if r.name == "adapter plus-one")
    assert rule.ok and rule.kind == "hard" and "asked as model 'plus-one'" in rule.detail
    assert (tmp_path / "served" / "adapters" / "plus-one" / "smoke.json").is_file()

    broken, answers, _ = judge("ignoring", "--ignore-adapters")
    assert answers == {spec.model.name: "5", "plus-one": "5"}  # the base answers where the adapter was asked
    assert not broken.passed
    assert [r.name for r in broken.verdict.failed] == ["adapter plus-one"], broken.verdict.reason
    assert "first-" in broken.verdict.reason


def test_the_benchmark_sends_the_adapter_mix_and_records_each_ones_figures(tmp_path: Path):
    """AIPerf against the served set with the adapter's traffic_share 0.75: requests by `model` name, three to the
    adapter for one to the base, and the server's per-name counters (GET /v1/adapters) give each one's requests,
    share, tokens and mean latency."""
    from enginefoundry.tasks.bench import benchmark

    spec = _spec(tmp_path, traffic_share=0.75)
    bench = spec.benchmark.model_copy(update={"enabled": True, "concurrency": [1, 2], "request_count": 6,
                                              "warmup_request_count": 2})
    spec = spec.model_copy(update={"benchmark": bench})
    lane = get_lane("reference")
    base = fetch(spec.model.parsed_source(spec.base_path), progress=str)
    adapters = fetch_adapters(spec, base, lane.name, lane.max_lora_rank, progress=str)
    (unit,) = expand_units(spec)
    ckpt = lane.convert(spec, unit.variant, Path(base.local_dir), tmp_path / "unit")
    bundle = Path(lane.build(spec, unit, Path(ckpt.checkpoint_dir), tmp_path / "unit",
                             adapter_dirs={"plus-one": Path(adapters["plus-one"].local_dir)}).bundle_dir)
    with _serve(lane, bundle, spec, tmp_path / "bench.log") as ep:
        report = benchmark.fn(spec, ep, str(tmp_path / "bench"), "served set", unit)
    assert report.valid, report.failures
    assert sorted(report.served) == ["plus-one", "tiny-chat"]
    total = sum(f.requests for f in report.served.values())
    assert total >= 2 * 6  # two points of six requests (and the warm-up), every one counted by its name
    assert report.served["plus-one"].traffic_share == 0.75 and report.served["tiny-chat"].traffic_share == 0.25
    assert 0.6 <= report.served["plus-one"].share <= 0.9, report.served
    for f in report.served.values():
        assert f.requests > 0 and f.completion_tokens > 0 and f.mean_latency_ms and f.mean_latency_ms > 0
    summary = report.summary()
    assert {"bench_served_plus-one_share", "bench_served_tiny-chat_latency_ms"} <= set(summary)
    assert "Served adapters" in report.slo_markdown()
    assert json.loads((tmp_path / "bench" / "sweep.json").read_text())["served"]["plus-one"]["requests"] > 0
