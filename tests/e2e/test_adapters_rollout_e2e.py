"""Issue 36 (LoRA adapters, a scheduled rollout): configs/tiny-lora.yaml in adapter_mode merge with two adapters
through `rollout` on this CPU (benchmark off, to keep the test short), a file:// store and a local MLflow. The first
rollout builds both adapters' units and promotes each to its own champion; after a new revision of one adapter the
next rollout names that adapter's change ("adapter retrained: <old> → <new>"), rebuilds and gates its unit alone (the
other a cache hit), promotes it and leaves the other adapter's champion as it was, recording the trigger on the
build's MLflow parent run."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.adapters import run_cli as _cli
from tests.support.adapters import set_dropout, two_adapter_run


def test_a_new_adapter_revision_rolls_out_that_adapters_unit_alone(tmp_path: Path):
    from mlflow import MlflowClient

    from enginefoundry import tracking_tags as mltags

    setup = two_adapter_run(tmp_path)
    spec, env, mlflow_uri, retrained = setup.spec, setup.env, setup.mlflow_uri, setup.retrained
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
