"""Issue 36 (LoRA adapters, a scheduled rollout): configs/tiny-lora.yaml in adapter_mode merge with two adapters
through `rollout` on this CPU (benchmark off, to keep the test short), a file:// store and a local MLflow. The first
rollout builds both adapters' units and promotes each to its own champion; after a new revision of one adapter the
next rollout names that adapter's change ("adapter retrained: <old> → <new>"), rebuilds and gates its unit alone (the
other a cache hit), promotes it and leaves the other adapter's champion as it was, recording the trigger on the
build's MLflow parent run."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import yaml

from tests.support.adapters import ADAPTERS, set_dropout
from tests.support.adapters import run_cli as _cli
from tests.support.paths import CONFIGS, TINY_MODEL


def test_a_new_adapter_revision_rolls_out_that_adapters_unit_alone(tmp_path: Path):
    from mlflow import MlflowClient

    from enginefoundry import tracking_tags as mltags

    retrained = tmp_path / "retrained"  # a second adapter: another revision's adapter_config.json, the same weights
    shutil.copytree(ADAPTERS / "plus-one", retrained)
    set_dropout(retrained, 0.05)
    data = yaml.safe_load((CONFIGS / "tiny-lora.yaml").read_text())
    data["benchmark"]["enabled"] = False
    data["model"]["source"] = str(TINY_MODEL)
    data["model"]["adapters"] = [{"name": "plus-one", "source": str(ADAPTERS / "plus-one")},
                                 {"name": "retrained", "source": str(retrained)}]
    data["smoke"]["prompts"] = str(CONFIGS / "prompts" / "tiny-chat.jsonl")
    spec = tmp_path / "tiny-lora.yaml"
    spec.write_text(yaml.safe_dump(data))
    mlflow_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "EF_STORE": f"file://{tmp_path / 'store'}", "MLFLOW_TRACKING_URI": mlflow_uri,
           "EF_CACHE_DIR": str(tmp_path / "cache"), "EF_WORK_DIR": str(tmp_path / "work"),
           "EF_REFERENCE_CACHE": str(tmp_path / "refs"), "PREFECT_HOME": str(tmp_path / "prefect"),
           "HF_HOME": str(tmp_path / "hf"), "OMP_NUM_THREADS": "1"}
    client = MlflowClient(mlflow_uri)

    def rollout() -> dict:
        done = _cli(["--json", "rollout", str(spec)], env)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return json.loads(done.stdout)

    def champion(adapter: str) -> str:
        return str(client.get_model_version_by_alias("tiny-chat", f"cpu-{adapter}-champion").version)

    # 1. Never built: both adapters' units built, each promoted to its own champion on its own gates.
    first = rollout()
    assert first["built"] and first["build_ok"], first["change"]
    assert first["change"]["targets"][0]["reason"] == ("adapter plus-one: never built: first build; "
                                                       "adapter retrained: never built: first build")
    champions = {a: champion(a) for a in ("plus-one", "retrained")}

    # 2. A new revision of `retrained`: named, its unit alone rebuilt, gated and promoted; plus-one's a cache hit,
    # its champion untouched; the trigger recorded on the build's parent run.
    old = client.get_model_version("tiny-chat", champions["retrained"]).tags[mltags.ADAPTER_DIGEST]
    set_dropout(retrained, 0.1)
    second = rollout()
    [row] = second["change"]["targets"]
    assert row["changed"] and [a["name"] for a in row["adapters"]] == ["retrained"], row
    assert row["reason"].startswith(f"adapter retrained: weights {old[:12]} → weights "), row["reason"]
    assert second["built"] and second["build_ok"]
    decisions = {d["stem"]: d for d in second["decisions"]}
    assert decisions["cpu-retrained"]["action"] == "promoted", decisions["cpu-retrained"]["reasons"]
    assert champion("retrained") == decisions["cpu-retrained"]["candidate_version"] != champions["retrained"]
    assert decisions["cpu-plus-one"]["action"] == "held" and champion("plus-one") == champions["plus-one"]
    parent = client.get_run(second["build_run_id"])
    assert parent.data.tags[mltags.ROLLOUT_ADAPTERS] == "retrained"
    assert parent.data.tags[mltags.ROLLOUT_TRIGGER] == f"cpu: {row['reason']}"
    units = client.search_runs([parent.info.experiment_id],
                               filter_string=f"tags.`{mltags.MLFLOW_PARENT_RUN_ID}` = '{parent.info.run_id}'")
    hits = {r.data.tags[mltags.ADAPTER]: r.data.tags[mltags.CACHE_HIT] for r in units}
    assert hits == {"plus-one": "true", "retrained": "false"}, hits
