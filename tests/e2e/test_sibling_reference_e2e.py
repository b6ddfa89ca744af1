"""`smoke.reference: sibling` through the CLI: a fp32 and a bf16 unit of the tiny model; the bf16 unit is
judged against the answers its fp32 sibling served (the verdict and the MLflow tag say so), and the Hugging
Face reference is computed once, for the fp32 unit only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from enginefoundry import tracking_tags as mltags
from enginefoundry.smoke.reference import SiblingReferenceKey
from tests.support.paths import CONFIGS, TINY_MODEL, TINY_PROMPTS


def _spec(tmp: Path, **smoke: object) -> Path:
    doc = yaml.safe_load((CONFIGS / "tiny-cpu.yaml").read_text())
    doc["name"] = "tiny-sibling"
    doc["model"]["source"] = str(TINY_MODEL)
    doc["variants"] = [{"precision": "bf16"}, {"precision": "fp32"}]  # spec order puts the judged unit first
    doc["smoke"].update({"prompts": str(TINY_PROMPTS), "reference": "sibling", "reference_sibling": "fp32",
                         **smoke})
    doc["benchmark"]["enabled"] = False
    doc["publish"]["store"] = f"file://{tmp / 'store'}"
    doc["tracking"]["mlflow_uri"] = f"sqlite:///{tmp / 'mlflow.db'}"
    path = tmp / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _run(tmp: Path, spec: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EF_WORK_DIR": str(tmp / "work"), "EF_CACHE_DIR": str(tmp / "cache"),
           "EF_REFERENCE_CACHE": str(tmp / "references"), "PREFECT_HOME": str(tmp / "prefect"),
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"}
    return subprocess.run([sys.executable, "-m", "enginefoundry.cli", "run", str(spec)], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=900)


def test_the_bf16_unit_is_judged_against_its_fp32_sibling_and_loads_no_reference_model(tmp_path: Path):
    run = _run(tmp_path, _spec(tmp_path))
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    # The source reference is computed once (for fp32), before the bf16 unit that comes first in the spec.
    assert out.count("smoke: computing 108 reference answers (fp32 on cpu)") == 1, out[-4000:]
    assert out.index("smoke: computing 108") < out.index("smoke: judged against sibling unit fp32-tp1.chat.cpu")
    assert "served answers of fp32-tp1.chat.cpu published as the sibling reference" in out

    stored = sorted((tmp_path / "store" / "references").glob("*.json"))
    docs = [json.loads(p.read_text()) for p in stored if not p.name.endswith(".spread.v2.json")]
    assert sorted(d["key"].get("kind", "source") for d in docs) == ["sibling", "source"]
    # the fp32 unit is judged like with like on the scoring server: its reference's spread is stored beside it
    source = next(p for p, d in zip([p for p in stored if not p.name.endswith(".spread.v2.json")], docs, strict=True)
                  if d["key"].get("kind", "source") == "source")
    assert [p.name for p in stored if p.name.endswith(".spread.v2.json")] == [f"{source.stem}.spread.v2.json"]
    sibling_doc = next(d for d in docs if d["key"].get("kind") == "sibling")
    assert sibling_doc["served_by"] == "fp32-tp1.chat.cpu" and len(sibling_doc["answers"]) == 108

    reports = {p.parent.parent.name: json.loads(p.read_text())
               for p in (tmp_path / "work").rglob("reports/smoke.json")}
    by_unit = {r["precision"]: r for r in reports.values()}
    bf16, fp32 = by_unit["bf16"], by_unit["fp32"]
    assert bf16["reference"]["sibling_unit"] == "fp32-tp1.chat.cpu"
    assert bf16["verdict"]["reference"].startswith("sibling unit fp32-tp1.chat.cpu (key ")
    assert bf16["verdict"]["passed"], bf16["verdict"]
    assert fp32["reference"]["sibling_unit"] is None and fp32["verdict"]["reference"].startswith("fp32 reference ")

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    tags = {r.data.tags.get("mlflow.runName", ""): r.data.tags for r in runs}
    bf16_tags = next(t for name, t in tags.items() if "bf16" in name)
    assert bf16_tags[mltags.SMOKE_REFERENCE].startswith("sibling unit fp32-tp1.chat.cpu (key ")
    assert bf16_tags[mltags.SMOKE_REFERENCE_KEY] == SiblingReferenceKey.model_validate(sibling_doc["key"]).digest


def test_a_sibling_rejected_by_its_gate_judges_nothing_and_its_dependent_is_refused_unbuilt(tmp_path: Path):
    # A floor no finite prompt set clears (the Wilson lower bound of 108/108 is 0.966): the fp32 unit is
    # rejected by its own gate, for real.
    run = _run(tmp_path, _spec(tmp_path, min_agreement=1.0))
    out = run.stdout + run.stderr
    assert run.returncode == 1, out[-4000:]
    assert "refused: its reference, sibling unit fp32-tp1.chat.cpu (key " in out, out[-4000:]
    assert "was rejected by its own gate (smoke gate: " in out
    assert "judged against sibling unit" not in out  # the bf16 unit never ran
    units = {p.parent.parent.name for p in (tmp_path / "work").rglob("reports/smoke.json")}
    assert len(units) == 1
