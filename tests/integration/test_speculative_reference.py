"""Draft/target speculation on the reference lane, end to end on this CPU (issue 37): the tiny model's spec with the
tiny draft (tests/fixtures/tiny-chat/draft, made by scripts/make_tiny_model.py --draft) is validated, its draft
fetched and checked against the target, the unit built with the draft in its bundle, served by the scoring server's
assisted generation and judged by the real gate, whose lossless rule compares every greedy answer with the same
unit's without speculation. A deliberately broken speculative path (the server's test-only --unverified-draft:
draft tokens kept without verification) is rejected by that rule. The stages' functions, no Prefect run."""

from __future__ import annotations

import json
import shutil
import urllib.request
from pathlib import Path

import yaml

from enginefoundry.inputs.sources import fetch
from enginefoundry.inputs.units import expand_units
from enginefoundry.lanes import get_lane
from enginefoundry.lanes.speculation import fetch_speculative_draft
from enginefoundry.model_server import free_port, serving
from enginefoundry.smoke.gate import LOSSLESS
from enginefoundry.smoke.serve import SPECULATIVE_PATH
from enginefoundry.spec import parse_spec
from enginefoundry.tasks.smoke import smoke_reference, smoke_test
from tests.support.paths import CONFIGS, REPO, TINY_MODEL

TINY_DRAFT = TINY_MODEL.parent / "draft"


def _spec(tmp: Path):
    data = yaml.safe_load((CONFIGS / "tiny-cpu.yaml").read_text())
    data["speculative"] = {"algorithm": "draft_target", "draft": "../tests/fixtures/tiny-chat/draft",
                           "max_draft_len": 3}
    data["publish"]["store"] = (tmp / "store").as_uri()
    return parse_spec(data, source="test spec", base_dir=CONFIGS)


def _judge(spec, bundle: Path, tmp: Path, name: str, reference, *extra: str):
    lane = get_lane("reference")
    cmd = lane.smoke_serve_command(bundle, "127.0.0.1", free_port(), spec.model.name, spec.lane_options)
    assert cmd.shipped and "--draft" in cmd.command.argv  # the server the unit ships with speculates
    command = cmd.command.model_copy(update={"argv": [*cmd.command.argv, *extra],
                                             "env": {**cmd.command.env, "PYTHONPATH": str(REPO)}})
    with serving(cmd.model_copy(update={"command": command}), tmp / f"{name}.log", timeout_s=120) as ep:
        report = smoke_test.fn(spec, ep, str(TINY_MODEL), str(tmp / name), precision="fp32", reference=reference)
        with urllib.request.urlopen(ep.base_url + SPECULATIVE_PATH, timeout=30) as r:
            stats = json.loads(r.read())
    return report, stats


def test_a_draft_target_unit_is_lossless_and_a_broken_draft_path_is_rejected(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("EF_REFERENCE_CACHE", str(tmp_path / "refs"))
    spec = _spec(tmp_path)
    lane = get_lane("reference")
    assert lane.validate_options(spec) == []
    source = fetch(spec.model.parsed_source(spec.base_path), progress=str)
    draft = fetch_speculative_draft(spec, source, progress=str)
    assert draft is not None and draft.tokenizer_digest == source.tokenizer_digest
    unit = expand_units(spec)[0]
    ckpt = lane.convert(spec, unit.variant, Path(source.local_dir), tmp_path / "work")
    built = lane.build(spec, unit, Path(ckpt.checkpoint_dir), tmp_path / "work", Path(draft.local_dir))
    bundle = Path(built.bundle_dir)
    assert (bundle / "draft" / "model.safetensors").is_file() and built.params["speculative"] == "draft_target"

    reference = smoke_reference.fn(spec, str(TINY_MODEL), precision="fp32")
    report, stats = _judge(spec, bundle, tmp_path, "speculative", reference)
    rules = {r.name: r for r in report.verdict.rules}
    assert report.passed, report.verdict.reason
    assert rules[LOSSLESS].ok and "all 108 greedy answers equal" in rules[LOSSLESS].detail
    assert stats["verified"] and stats["drafted"] > 0 and 0.5 < stats["acceptance_rate"] <= 1.0

    broken, stats = _judge(spec, bundle, tmp_path, "unverified", reference, "--unverified-draft")
    assert not broken.passed and LOSSLESS in {r.name for r in broken.verdict.failed}, broken.verdict.reason
    assert "the speculative path changed the model's answers" in broken.verdict.reason
    assert not stats["verified"]


def test_the_benchmark_records_acceptance_and_the_speed_up_over_the_twin(tmp_path: Path):
    """AIPerf against the speculative unit's server and against its twin (the same server, speculative: false):
    every point has the draft tokens proposed and accepted during it and its speed-up at that concurrency."""
    from enginefoundry.bench import run_sweep
    from enginefoundry.tasks.bench import draft_counters, speculative_twin_sweep

    spec = _spec(tmp_path)
    bench = spec.benchmark.model_copy(update={"concurrency": [1, 2], "request_count": 6, "warmup_request_count": 1})
    spec = spec.model_copy(update={"benchmark": bench})
    lane = get_lane("reference")
    unit = expand_units(spec)[0]
    # The lane's build hard-links from its checkpoint (the pipeline's own work copy), so it gets a copy of the
    # fixture: linked, the fixture's files would share an inode with the bundle (test_checkpoint_cast checks not).
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(TINY_MODEL, checkpoint)
    built = lane.build(spec, unit, checkpoint, tmp_path / "work", TINY_DRAFT)
    cmd = lane.smoke_serve_command(Path(built.bundle_dir), "127.0.0.1", free_port(), spec.model.name,
                                   spec.lane_options)
    command = cmd.command.model_copy(update={"env": {**cmd.command.env, "PYTHONPATH": str(REPO)}})
    with serving(cmd.model_copy(update={"command": command}), tmp_path / "bench.log", timeout_s=120) as ep:
        report = run_sweep(bench, url=ep.base_url, model=ep.model_name, tokenizer=ep.tokenizer_dir,
                           out=tmp_path / "bench", progress=str, telemetry=False,
                           draft_counters=draft_counters(ep.base_url))
        report = speculative_twin_sweep(spec, ep, report, tmp_path / "bench", str, unit)
    assert [p.concurrency for p in report.points] == [1, 2] and report.valid, report.failures
    for p in report.points:
        assert p.speculation is not None and p.speculation.drafted > 0 and p.speculation.accepted > 0
        assert p.speculation.twin_output_tokens_per_s and p.metrics()["spec_speedup"] > 0
    summary = report.summary()
    assert 0.0 < summary["spec_acceptance_rate"] <= 1.0  # random synthetic prompts: lower than the prompt set
    assert {"spec_speedup_c1", "spec_speedup_c2"} <= set(summary)
    assert "Speculation: draft acceptance" in report.slo_markdown()
    assert (tmp_path / "bench" / "twin" / "sweep.json").is_file()
