"""The pipeline's smoke stages with `smoke.reference_precision: unit` (the default, issue 24): a bf16 unit's
reference stage computes a bf16 source reference, and its smoke stage judges it like with like against that
reference, its log-prob limits from the spread measured at bf16. The stages' functions (not a Prefect run), the
real scoring server (enginefoundry/smoke/serve.py) and the tiny fixture model; a few seconds."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from enginefoundry.lanes.base import Command, ServeCommand
from enginefoundry.model_server import free_port, serving
from enginefoundry.smoke.reference import ReferenceKey
from enginefoundry.spec import parse_spec
from enginefoundry.store.layout import reference_spread_key
from enginefoundry.tasks.smoke import smoke_reference, smoke_test
from tests.support.paths import CONFIGS, REPO, TINY_MODEL


def _serve(tmp: Path):
    port = free_port()
    argv = [sys.executable, "-m", "enginefoundry.smoke.serve", str(TINY_MODEL), "--port", str(port), "--name", "tiny"]
    cmd = ServeCommand(command=Command(argv=argv, env={"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)},
                                       description="enginefoundry scoring server"),
                       model_name="tiny", tokenizer_dir=str(TINY_MODEL))
    return serving(cmd, tmp / "server.log", timeout_s=120)


def test_a_bf16_unit_of_a_unit_spec_is_judged_against_a_bf16_reference(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("EF_REFERENCE_CACHE", str(tmp_path / "refs"))
    data = yaml.safe_load((CONFIGS / "tiny-cpu.yaml").read_text())
    data["variants"] = [{"precision": "bf16"}]
    data["publish"]["store"] = (tmp_path / "store").as_uri()
    spec = parse_spec(data, source="test spec", base_dir=CONFIGS)
    assert spec.smoke.reference_precision == "unit"  # the default

    ref, outcome = smoke_reference.fn(spec, str(TINY_MODEL), precision="bf16")
    assert isinstance(ref.key, ReferenceKey) and ref.key.dtype == "bf16" and outcome.dtype == "bf16"
    with _serve(tmp_path) as ep:
        report = smoke_test.fn(spec, ep, str(TINY_MODEL), str(tmp_path / "report"), precision="bf16",
                               reference=(ref, outcome))
    assert report.passed, report.verdict.reason
    assert report.reference.key == outcome.key and report.reference.label().startswith("bf16 reference ")
    assert report.verdict.reference_why == "the unit's own precision bf16 (like with like)"
    assert report.verdict.reference.startswith("bf16 reference ")
    # The scoring server returns log-probs: the spread is measured at bf16, beside the bf16 reference.
    assert report.spread is not None and report.spread.precision == "bf16"
    assert report.spread.reference_key == outcome.key
    assert (tmp_path / "refs" / reference_spread_key(outcome.key).rsplit("/", 1)[-1]).is_file()  # beside it
    md = (tmp_path / "report" / "smoke.md").read_text()
    assert "| why that reference | the unit's own precision bf16 (like with like) |" in md
