"""Issue 36 (LoRA adapters, serve mode): configs/tiny-lora.yaml in adapter_mode serve through the CLI on this CPU (its
benchmark off here, to keep the test short) with two adapters, a file:// store and a local MLflow: one unit serving
the base and both adapters (the scoring server, PEFT, per request), each adapter asked by its name and gated against
its own merged reference, published with every adapter's lineage in its manifest, its MLflow run and its registered
version; after a new revision of one adapter `explain` shows the serving unit as a miss, naming the adapter part of
its key."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.adapters import run_cli as _cli
from tests.support.adapters import set_dropout, two_adapter_run


def test_one_unit_serves_every_adapter_each_gated_published_and_registered_with_the_set_lineage(tmp_path: Path):
    from mlflow import MlflowClient

    from enginefoundry import tracking_tags as mltags

    setup = two_adapter_run(tmp_path, "serve")
    spec, env, mlflow_uri, retrained = setup.spec, setup.env, setup.mlflow_uri, setup.retrained
    run = _cli(["run", str(spec)], env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    docs = [json.loads(p.read_text()) for p in (tmp_path / "store" / "manifests" / "tiny-chat").glob("*/2*.json")]
    (manifest,) = [d for d in docs if "unit" in d]
    assert manifest["unit"] == "fp32-tp1.chat.cpu" and manifest["status"] == "candidate"
    served = manifest["key_components"]["adapter"]
    assert served["mode"] == "serve" and sorted(served["served"]) == ["plus-one", "retrained"]
    lineage = manifest["source"]["identity"]["adapters"]
    assert [a["name"] for a in lineage] == ["plus-one", "retrained"]
    assert {a["name"]: a["weights_digest"] for a in lineage} == served["served"]
    assert manifest["build_params"]["adapters"] == ["plus-one", "retrained"]
    assert manifest["smoke"]["smoke_passed"] is True
    bundled = {f["path"] for f in manifest["files"]}
    assert any(p.endswith("adapters/retrained/adapter_config.json") for p in bundled)
    assert any(p.endswith("reports/adapters/plus-one/smoke.json") for p in bundled)

    client = MlflowClient(mlflow_uri)
    version = client.get_model_version_by_alias("tiny-chat", "cpu-candidate")
    assert version.tags[mltags.ADAPTER] == "plus-one,retrained"
    assert version.tags[mltags.ADAPTER_DIGEST] == ",".join(a["weights_digest"] for a in lineage)
    assert client.get_run(manifest["mlflow_run_id"]).data.tags[mltags.ADAPTER] == "plus-one,retrained"

    shown = _cli(["lineage", "models:/tiny-chat@cpu-candidate", "--mlflow-uri", mlflow_uri], env)
    assert shown.returncode == 0, shown.stderr[-3000:]
    rows = [line for line in shown.stdout.splitlines() if "served adapter" in line]
    assert len(rows) == 2 and "plus-one:" in rows[0] and "retrained:" in rows[1], shown.stdout[-3000:]

    # A new revision of one adapter: the serving unit is a miss, and `explain` names that adapter's digest.
    set_dropout(retrained, 0.1)
    explained = _cli(["explain", str(spec), "--json"], env)
    assert explained.returncode == 0, explained.stderr[-3000:]
    (row,) = json.loads(explained.stdout)["units"]
    assert row["hit"] is False and row["key"] != manifest["key"]
    assert [d.split(":")[0] for d in row["differences"]] == ["adapter.served.retrained"], row["differences"]
