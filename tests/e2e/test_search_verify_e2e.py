"""The verify step of the search for real: a bounded goodput search (AIPerf against `transformers serve` on the tiny
bundle, CPU) for the unit the search planned on the cpu target, with cost at the SLO point and energy unavailable."""

from __future__ import annotations

import json
from pathlib import Path

from enginefoundry.bench.goodput import verify_unit
from enginefoundry.inputs.units import expand_units
from enginefoundry.model_server import Endpoint
from enginefoundry.search.plan import materialise
from enginefoundry.spec import load_spec

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_goodput_search_on_cpu_is_bounded_and_recorded(tiny_served: Endpoint, tmp_path: Path):
    spec, _ = materialise(load_spec(CONFIGS / "tiny-search.yaml"), progress=lambda _: None)
    (unit,) = expand_units(spec)
    verdict = verify_unit(spec, unit, url=tiny_served.base_url, model=tiny_served.model_name,
                          tokenizer=tiny_served.tokenizer_dir, out=tmp_path, progress=lambda _: None)
    g = spec.search.goodput
    assert 1 <= len(verdict.probes) <= g.max_points
    assert all(g.min_concurrency <= p.concurrency <= g.max_concurrency for p in verdict.probes)
    assert verdict.bounded_by in ("range", "points", "time")
    met = [p.concurrency for p in verdict.probes if p.met]
    # The SLO (TTFT p95 ≤ 2 s, ITL p95 ≤ 500 ms) holds for the tiny model at c=1 on any CPU this runs on.
    assert verdict.goodput_concurrency == max(met) and verdict.goodput_concurrency >= 1
    assert all(p.concurrency < verdict.goodput_concurrency or p.concurrency == verdict.goodput_concurrency
               or not p.met for p in verdict.probes)
    assert verdict.measured["tokens_per_s_gpu"] > 0 and verdict.predicted == {}  # cpu: not predicted
    assert verdict.prediction_error is None and not verdict.flagged
    assert verdict.cost["usd_per_mtok"] > 0 and verdict.cost["energy"] == "unavailable"
    assert "tokens_per_joule" not in verdict.cost  # unavailable, never zero
    assert json.loads((tmp_path / "search.json").read_text())["goodput_concurrency"] == verdict.goodput_concurrency
    assert (tmp_path / "search.png").stat().st_size > 0
    assert "goodput_concurrency" in verdict.metrics() and "usd_per_mtok" in verdict.metrics()


def test_run_of_a_search_spec_records_goodput_cost_and_energy(tmp_path: Path):
    """`run` on a spec whose only units come from `search` (cpu: a measured search): the unit is built, gated and
    verified; the manifest, MLflow and the summary hold goodput, $/1M tokens and energy "unavailable"."""
    import os
    import subprocess
    import sys

    import yaml
    from mlflow.tracking import MlflowClient

    data = yaml.safe_load((CONFIGS / "tiny-search.yaml").read_text())
    data["model"]["source"] = str((CONFIGS / data["model"]["source"]).resolve())
    data["smoke"]["prompts"] = str((CONFIGS / data["smoke"]["prompts"]).resolve())
    data["publish"]["store"] = f"file://{tmp_path / 'store'}"
    data["tracking"]["mlflow_uri"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    data["benchmark"].update(concurrency=[1], request_count=8)  # the hand-written sweep; the goodput search is ours
    spec = tmp_path / "search.yaml"
    spec.write_text(yaml.safe_dump(data))
    env = {k: v for k, v in os.environ.items() if k not in ("EF_STORE", "MLFLOW_TRACKING_URI")}
    env.update(EF_CACHE_DIR=str(tmp_path / "cache"), EF_WORK_DIR=str(tmp_path / "work"),
               PREFECT_HOME=str(tmp_path / "prefect"))
    done = subprocess.run([sys.executable, "-m", "enginefoundry.cli", "run", str(spec), "--json"],
                          cwd=CONFIGS.parent, env=env, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(done.stdout)
    (outcome,) = summary["outcomes"]
    assert outcome["unit"] == "fp32-tp1.search-measured.cpu" and outcome["status"] == "candidate"
    search = outcome["bench"]["search"]
    assert search["goodput_concurrency"] >= 1 and search["cost"]["energy"] == "unavailable"
    manifest = json.loads(Path(outcome["manifest_uri"].removeprefix("file://")).read_text())
    assert manifest["benchmark"]["search"]["cost"]["usd_per_mtok"] == search["cost"]["usd_per_mtok"] > 0
    assert "tokens_per_joule" not in manifest["benchmark"]["search"]["cost"]
    metrics = MlflowClient(data["tracking"]["mlflow_uri"]).get_run(outcome["mlflow_run_id"]).data.metrics
    assert metrics["goodput_concurrency"] == search["goodput_concurrency"]
    assert metrics["measured_tokens_per_s_gpu"] > 0 and metrics["usd_per_mtok"] > 0
    assert "tokens_per_joule" not in metrics  # unavailable on a cpu, never zero
