"""Lane trtllm's non-speculative twin, served (issue 37 item 2): a draft/target unit's bundle as the lane's build
writes it (its runtime YAML with speculative_config, and the twin's YAML without it) is served by the fake
TensorRT-LLM 1.3 trtllm-serve (tests/fixtures/fake-trtllm/fakehelp.py: the scoring server, the draft's tokens
verified), judged by the real gate, then its own server stopped and the twin started from the twin YAML: the rule
`lossless speculation`, not run before, passes on the twin's answers. A fake whose speculative path changes
answers (EF_FAKE_TRTLLM_LOSSY=1: draft tokens kept unverified) is rejected by that rule. The stages' functions,
no Prefect run; on this CPU."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import yaml

from enginefoundry.inputs.units import expand_units
from enginefoundry.lanes import get_lane
from enginefoundry.lanes.trtllm import (
    RUNTIME_CONFIG,
    TWIN_CONFIG,
    bundle_draft,
    runtime_config,
    write_runtime_configs,
)
from enginefoundry.model_server import free_port, serving
from enginefoundry.smoke.gate import LOSSLESS
from enginefoundry.spec import parse_spec
from enginefoundry.tasks.smoke import smoke_reference, smoke_test, smoke_twin
from tests.support.paths import CONFIGS, REPO, TINY_MODEL

TINY_DRAFT = TINY_MODEL.parent / "draft"
FAKE_13 = REPO / "tests" / "fixtures" / "fake-trtllm" / "1.3"


def _spec(tmp: Path):
    data = yaml.safe_load((CONFIGS / "tiny-sm90.yaml").read_text())
    data.update(lane="trtllm", variants=[{"precision": "bf16"}], toolchain={"trtllm_version": "1.3.0rc20"},
                speculative={"algorithm": "draft_target", "draft": "../tests/fixtures/tiny-chat/draft",
                             "max_draft_len": 3})
    data["publish"] = {"store": (tmp / "store").as_uri()}
    return parse_spec(data, source="test spec", base_dir=CONFIGS)


def _bundle(spec, tmp: Path) -> Path:
    bundle = tmp / "bundle"
    bundle.mkdir()
    draft = bundle_draft(bundle, TINY_DRAFT)  # the draft travels in the bundle, named relative to the server's cwd
    write_runtime_configs(bundle, runtime_config(spec, expand_units(spec)[0], "1.3.0rc20", draft))
    (bundle / "bundle.json").write_text(json.dumps({"checkpoint": {"path": str(TINY_MODEL)}, "params": {"draft": draft},
                                                    "runtime_config": RUNTIME_CONFIG, "autotuner_cache": None}))
    return bundle


def _serve(cmd, tmp: Path, name: str, **env: str):
    command = cmd.command.model_copy(update={"env": {
        **cmd.command.env, "PATH": f"{FAKE_13 / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "EF_FAKE_REAL_PYTHON": sys.executable, "PYTHONPATH": str(REPO), **env}})
    return serving(cmd.model_copy(update={"command": command}), tmp / f"{name}.log", timeout_s=120)


def _judge(spec, bundle: Path, tmp: Path, name: str, reference, **env: str):
    lane = get_lane("trtllm")
    cmd = lane.smoke_serve_command(bundle, "127.0.0.1", free_port(), spec.model.name, spec.lane_options)
    assert "speculative_config" in yaml.safe_load(Path(cmd.command.argv[3]).read_text())
    with _serve(cmd, tmp, name, **env) as ep:
        report = smoke_test.fn(spec, ep, str(TINY_MODEL), str(tmp / name), precision="fp32", reference=reference)
    pending = {r.name: r for r in report.verdict.rules}[LOSSLESS]
    assert not pending.ok and pending.not_run  # no twin on the unit's own server: nothing passed on trust
    twin_cmd = lane.twin_serve_command(bundle, "127.0.0.1", free_port(), spec.model.name)
    assert twin_cmd is not None and twin_cmd.command.argv[3].endswith(TWIN_CONFIG)
    with _serve(twin_cmd, tmp, f"{name}-twin") as twin:  # started after the unit's own server was stopped
        return smoke_twin.fn(spec, twin, report, str(tmp / name))


def test_the_trtllm_twin_is_served_and_a_lossy_speculative_path_is_rejected(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("EF_REFERENCE_CACHE", str(tmp_path / "refs"))
    spec = _spec(tmp_path)
    bundle = _bundle(spec, tmp_path)
    twin_yaml = yaml.safe_load((bundle / TWIN_CONFIG).read_text())
    own = yaml.safe_load((bundle / RUNTIME_CONFIG).read_text())
    assert own.pop("speculative_config")["speculative_model"] == "draft" and own == twin_yaml
    reference = smoke_reference.fn(spec, str(TINY_MODEL), precision="fp32")

    report = _judge(spec, bundle, tmp_path, "speculative", reference)
    rules = {r.name: r for r in report.verdict.rules}
    assert report.passed, report.verdict.reason
    assert rules[LOSSLESS].ok and "all 108 greedy answers equal" in rules[LOSSLESS].detail
    assert json.loads((tmp_path / "speculative" / "smoke.json").read_text())["verdict"]["passed"]

    lossy = _judge(spec, bundle, tmp_path, "lossy", reference, EF_FAKE_TRTLLM_LOSSY="1")
    assert not lossy.passed and LOSSLESS in {r.name for r in lossy.verdict.failed}, lossy.verdict.reason
    assert "the speculative path changed the model's answers" in lossy.verdict.reason


def test_the_benchmark_measures_the_speed_up_on_the_trtllm_twin_server(tmp_path: Path):
    """AIPerf against the unit's fake trtllm-serve, then (that server stopped) the same points against its twin
    server: every point has its speed-up over the twin."""
    from enginefoundry.bench import run_sweep
    from enginefoundry.tasks.bench import twin_benchmark

    spec = _spec(tmp_path)
    bench = spec.benchmark.model_copy(update={"enabled": True, "concurrency": [1], "request_count": 4,
                                              "warmup_request_count": 1})
    spec = spec.model_copy(update={"benchmark": bench})
    bundle, lane = _bundle(spec, tmp_path), get_lane("trtllm")
    with _serve(lane.serve_command(bundle, "127.0.0.1", free_port()), tmp_path, "bench") as ep:
        report = run_sweep(bench, url=ep.base_url, model=ep.model_name, tokenizer=ep.tokenizer_dir,
                           out=tmp_path / "bench", progress=str, telemetry=False)
    twin_cmd = lane.twin_serve_command(bundle, "127.0.0.1", free_port(), spec.model.name)
    with _serve(twin_cmd, tmp_path, "bench-twin") as twin:
        report = twin_benchmark.fn(spec, twin, report, str(tmp_path / "bench"), unit=None)
    assert [p.concurrency for p in report.points] == [1] and report.valid, report.failures
    assert report.points[0].speculation is not None and report.summary()["spec_speedup_c1"] > 0
    assert (tmp_path / "bench" / "twin" / "sweep.json").is_file()
