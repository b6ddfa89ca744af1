"""Issue 36 (LoRA adapters, merge mode): the shipped spec configs/tiny-lora.yaml through the CLI on this CPU (its
benchmark off here, to keep the test short) with a second adapter, a file:// store and a local MLflow: one unit per
adapter, published with the adapter's lineage in its manifest, its MLflow run and its registered version (aliases
cpu-plus-one-candidate, cpu-retrained-candidate); after a new revision of one adapter `explain` shows that adapter's
unit alone as a miss, naming its digest, and the next run rebuilds that unit alone; a wrong-base adapter and a
wrong-rank one are refused by `validate` and by `run` before any download, naming the field and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.support.adapters import ADAPTERS, set_dropout, two_adapter_run
from tests.support.adapters import run_cli as _cli


def test_the_adapter_units_are_built_gated_published_and_registered_with_its_lineage(tmp_path: Path):
    from mlflow import MlflowClient

    from enginefoundry import tracking_tags as mltags

    # A second adapter: the same weights retrained elsewhere, its adapter_config.json another revision's (dropout,
    # which merging ignores): its own unit, key, alias and lineage.
    setup = two_adapter_run(tmp_path)
    spec, env, mlflow_uri, retrained = setup.spec, setup.env, setup.mlflow_uri, setup.retrained
    run = _cli(["run", str(spec)], env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    docs = [json.loads(p.read_text()) for p in (tmp_path / "store" / "manifests" / "tiny-chat").glob("*/2*.json")]
    units = {d["unit"]: d for d in docs if "unit" in d}  # beside them: the merged checkpoints' converted builds
    assert sorted(units) == ["fp32-tp1+plus-one.chat.cpu", "fp32-tp1+retrained.chat.cpu"]
    manifest = units["fp32-tp1+plus-one.chat.cpu"]
    assert manifest["status"] == "candidate" and units["fp32-tp1+retrained.chat.cpu"]["status"] == "candidate"
    adapter = manifest["key_components"]["adapter"]
    assert adapter["name"] == "plus-one" and adapter["mode"] == "merge"
    lineage = manifest["source"]["identity"]["adapter"]
    assert lineage["uri"].endswith("adapters/plus-one") and lineage["weights_digest"] == adapter["weights_digest"]
    assert manifest["smoke"]["smoke_passed"] is True

    client = MlflowClient(mlflow_uri)
    version = client.get_model_version_by_alias("tiny-chat", "cpu-plus-one-candidate")
    assert version.tags[mltags.ADAPTER] == "plus-one"
    assert version.tags[mltags.ADAPTER_DIGEST] == adapter["weights_digest"]
    assert version.tags[mltags.BASE_WEIGHTS_DIGEST] == manifest["source"]["identity"]["base_weights_digest"]
    assert client.get_run(manifest["mlflow_run_id"]).data.tags[mltags.ADAPTER_URI].endswith("adapters/plus-one")
    other = client.get_model_version_by_alias("tiny-chat", "cpu-retrained-candidate")
    assert other.tags[mltags.ADAPTER] == "retrained" and other.version != version.version

    # A new revision of one adapter: `explain` shows that adapter's unit alone as a miss, and why.
    set_dropout(retrained, 0.1)
    explained = _cli(["explain", str(spec), "--json"], env)
    assert explained.returncode == 0, explained.stderr[-3000:]
    rows = {r["unit"]: r for r in json.loads(explained.stdout)["units"]}
    assert rows["fp32-tp1+plus-one.chat.cpu"]["hit"] is True
    assert rows["fp32-tp1+plus-one.chat.cpu"]["key"] == manifest["key"]
    changed = rows["fp32-tp1+retrained.chat.cpu"]
    assert changed["hit"] is False and [d.split(":")[0] for d in changed["differences"]] == ["adapter.weights_digest"]

    # ... and the next run rebuilds and gates that adapter's unit alone; the other is a cache hit whose run keeps its
    # adapter's lineage
    again = _cli(["run", str(spec), "--json"], env)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    outcomes = {o["unit"]: o for o in json.loads(again.stdout)["outcomes"]}
    assert outcomes["fp32-tp1+plus-one.chat.cpu"]["cache_hit"] is True
    rebuilt = outcomes["fp32-tp1+retrained.chat.cpu"]
    assert rebuilt["cache_hit"] is False and rebuilt["status"] == "candidate" and rebuilt["key"] == changed["key"]
    hit_run = client.get_run(outcomes["fp32-tp1+plus-one.chat.cpu"]["mlflow_run_id"])
    assert hit_run.data.tags[mltags.CACHE_HIT] == "true" and hit_run.data.tags[mltags.ADAPTER] == "plus-one"

    for name, words in (("wrong-base", "trained on base 'tiny-chat-draft'"),
                        ("wrong-rank", "LoRA rank 128")):
        data = yaml.safe_load(spec.read_text())
        data["model"]["adapters"] = [{"name": "bad", "source": str(ADAPTERS / name)}]
        spec.write_text(yaml.safe_dump(data))
        for command in ("validate", "run"):
            refused = _cli([command, str(spec)], env)
            assert refused.returncode == 2 and "model.adapters.0" in refused.stderr, refused.stderr[-2000:]
            assert words in refused.stderr
    # refused before any download or merge: only the good adapters' merged checkpoints are there (plus-one, retrained
    # and its new revision)
    assert len(list((tmp_path / "cache" / "merged").iterdir())) == 3
