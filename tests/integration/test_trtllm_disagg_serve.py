"""Lane trtllm's disaggregated unit, served (issue 37 item 3): the lane writes a disaggregated variant's serving files
into the bundle against the checkpoint (router config, context/generation YAMLs with the unit's runtime keys, the
launch plan and the launcher), and its server is the launcher: one fake TensorRT-LLM 1.3 `trtllm-serve` per worker
(tests/fixtures/fake-trtllm/fakehelp.py: the scoring server) and the fake `trtllm-serve disaggregated` router, which
sends each completion to a context server (the prefill) and then to a generation server, as OpenAIDisaggServer does.
The real gate judges the router's answers, AIPerf measures through it, the router's counts show both roles served,
and stopping the server stops every process of the replica. The stages' functions, no Prefect run; on this CPU (the
warm-up needs a real TensorRT-LLM and a GPU: it is not run here)."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from enginefoundry.inputs.toolchain import ToolSurface, check_against_surface
from enginefoundry.inputs.units import expand_units
from enginefoundry.lanes import get_lane
from enginefoundry.lanes.base import BUNDLE_INFO, BundleInfo, CheckpointRef
from enginefoundry.lanes.serve_files import serving_plan
from enginefoundry.lanes.trtllm import TrtllmLane
from enginefoundry.model_server import free_port, serving
from enginefoundry.runner import pid_alive
from enginefoundry.spec import parse_spec
from enginefoundry.tasks.smoke import smoke_reference, smoke_test
from tests.support.paths import CONFIGS, REPO, TINY_MODEL

FAKE_13 = REPO / "tests" / "fixtures" / "fake-trtllm" / "1.3"
DISAGG = {"prefill": {"workers": 1, "tp": 1, "batch_size": 4}, "decode": {"workers": 2, "tp": 1, "batch_size": 8}}


def _spec(tmp: Path, **bench: object):
    data = yaml.safe_load((CONFIGS / "tiny-sm90.yaml").read_text())
    data.update(lane="trtllm", variants=[{"precision": "bf16", "disaggregated": DISAGG}],
                toolchain={"trtllm_version": "1.3.0rc20"})
    data["targets"][0]["gpu_count"] = 3
    data["publish"] = {"store": (tmp / "store").as_uri()}
    data["benchmark"].update(bench)
    return parse_spec(data, source="test spec", base_dir=CONFIGS)


def _bundle(spec, tmp: Path) -> Path:
    """The bundle as the lane's build writes it, less the warm-up (no GPU here)."""
    lane = get_lane("trtllm")
    assert isinstance(lane, TrtllmLane)
    [unit] = expand_units(spec)
    bundle = tmp / "bundle"
    bundle.mkdir()
    settings = lane.disaggregated_files(spec, unit, TINY_MODEL, bundle, "1.3.0rc20")
    assert settings is not None
    info = BundleInfo(checkpoint=CheckpointRef(path=str(TINY_MODEL)), disaggregated=settings)
    (bundle / BUNDLE_INFO).write_text(json.dumps(info.as_json()))
    return bundle


def _env(cmd):
    command = cmd.command.model_copy(update={"env": {
        **cmd.command.env, "PATH": f"{FAKE_13 / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "EF_FAKE_REAL_PYTHON": sys.executable, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}})
    return cmd.model_copy(update={"command": command})


def _routes(base_url: str) -> dict[str, int]:
    with urllib.request.urlopen(base_url + "/ef-fake/routes", timeout=10) as r:
        data = json.loads(r.read())
    return {role: sum(data["requests"][u] for u in urls) for role, urls in data["servers"].items()}


def test_a_disaggregated_unit_is_served_by_its_workers_and_router_and_gated_through_it(tmp_path: Path,
                                                                                     monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("EF_REFERENCE_CACHE", str(tmp_path / "refs"))
    spec = _spec(tmp_path)
    bundle = _bundle(spec, tmp_path)
    context = yaml.safe_load((bundle / "context.yaml").read_text())
    generation = yaml.safe_load((bundle / "generation.yaml").read_text())
    # Each role keeps the unit's runtime keys under its own parallelism, batch size and transceiver.
    assert context["disable_overlap_scheduler"] is True and generation["disable_overlap_scheduler"] is False
    assert (context["max_batch_size"], generation["max_batch_size"]) == (4, 8)
    assert context["max_seq_len"] == generation["max_seq_len"] == 256 and "kv_cache_config" in generation
    assert context["cache_transceiver_config"] == {"backend": "DEFAULT", "max_tokens_in_buffer": 768}
    plan = json.loads((bundle / "disagg.json").read_text())
    assert [(w["role"], w["gpus"]) for w in plan["workers"]] == [("context", [0]), ("generation", [1]),
                                                                  ("generation", [2])]

    lane = get_lane("trtllm")
    cmd = _env(lane.smoke_serve_command(bundle, "127.0.0.1", free_port(), spec.model.name, spec.lane_options))
    assert cmd.command.argv[1].endswith("bundle/disagg_launch.py") and cmd.shipped
    reference = smoke_reference.fn(spec, str(TINY_MODEL), precision="fp32")
    with serving(cmd, tmp_path / "server.log", timeout_s=180) as ep:
        report = smoke_test.fn(spec, ep, str(TINY_MODEL), str(tmp_path / "smoke"), precision="fp32",
                               reference=reference)
        routes = _routes(ep.base_url)
        workers = [int(line.split(" pid ")[1].split()[0]) for line in (tmp_path / "server.log").read_text()
                   .splitlines() if line.startswith("disagg: ") and " pid " in line]
    assert report.passed, report.verdict.reason
    # Every gated answer went through a context server first, then a generation server.
    assert routes["context"] == routes["generation"] >= 108, routes
    log = (tmp_path / "server.log").read_text()
    assert log.count("disagg: context worker") == 1 and log.count("disagg: generation worker") == 2
    assert "every worker healthy; router on 127.0.0.1" in log
    assert len(workers) == 3
    deadline = time.monotonic() + 10  # stopped with the server (init reaps them once the launcher is gone)
    while any(pid_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(p) for p in workers)


def test_the_benchmark_measures_a_disaggregated_unit_through_its_router(tmp_path: Path):
    from enginefoundry.bench import run_sweep

    spec = _spec(tmp_path, enabled=True, concurrency=[2], request_count=6, warmup_request_count=1)
    bundle, lane = _bundle(spec, tmp_path), get_lane("trtllm")
    with serving(_env(lane.serve_command(bundle, "127.0.0.1", free_port())), tmp_path / "bench.log",
                 timeout_s=180) as ep:
        report = run_sweep(spec.benchmark, url=ep.base_url, model=ep.model_name, tokenizer=ep.tokenizer_dir,
                           out=tmp_path / "bench", progress=str, telemetry=False)
        routes = _routes(ep.base_url)
    assert [p.concurrency for p in report.points] == [2] and report.valid, report.failures
    assert routes["generation"] >= 7 and routes["context"] == routes["generation"], routes


def test_the_workers_router_and_published_serve_files_use_only_what_the_release_has(tmp_path: Path, fake_trtllm):
    """What `plan` and the worker's probe check (the router's --config_file from `trtllm-serve disaggregated --help`,
    each role's YAML keys from the LLM API fields), and the published serve.sh: the launcher, relocatable."""
    spec = _spec(tmp_path)
    [unit] = expand_units(spec)
    lane = get_lane("trtllm")
    surface = ToolSurface.model_validate(fake_trtllm.expected_surface("1.3"))
    cmds = lane.describe(spec, unit, surface)
    assert cmds[-1].tool == "trtllm-serve disaggregated" and "--config_file" in cmds[-1].argv
    assert sum(c.tool == "trtllm-serve" for c in cmds) == 3  # one per worker
    check_against_surface(cmds, surface)
    bare = surface.model_copy(update={"tools": {k: v for k, v in surface.tools.items()
                                                if k != "trtllm-serve disaggregated"}})
    with pytest.raises(Exception, match="trtllm-serve disaggregated"):
        check_against_surface(cmds, bare)
    plan = serving_plan(lane, _bundle(spec, tmp_path), unit=unit.name, model="tiny-chat", key="k" * 64,
                        artifact_uri="s3://b/u", checkpoint_dir=TINY_MODEL, checkpoint_uri="s3://b/c")
    assert plan.argv[1] == "${EF_UNIT_DIR}/bundle/disagg_launch.py", plan.argv
    assert plan.argv[plan.argv.index("--checkpoint") + 1] == "${EF_CHECKPOINT_DIR}"
