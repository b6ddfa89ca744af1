"""What MLflow users see on a registered version (issue 33 §4), on a real SQLite MLflow: a rejected unit's version
says REJECTED and not deployable (MLflow sets its own status READY and offers no API to set another), a candidate
whose `<stem>-candidate` moved on to a newer build no longer says `candidate`."""

from __future__ import annotations

from pathlib import Path

import yaml
from mlflow.tracking import MlflowClient

from enginefoundry import tracking_tags as mltags
from enginefoundry.inputs.units import expand_units
from enginefoundry.spec import BuildSpec, load_spec
from enginefoundry.store.manifest import Manifest
from enginefoundry.store.unit_status import UnitStatus
from enginefoundry.tasks.track import register_published_unit

REPO = Path(__file__).resolve().parents[2]


def _spec(tmp_path: Path) -> BuildSpec:
    data = yaml.safe_load((REPO / "configs" / "tiny-cpu.yaml").read_text())
    data["model"]["source"] = str(REPO / "tests" / "fixtures" / "tiny-chat" / "model")
    data["smoke"]["prompts"] = str(REPO / "configs" / "prompts" / "tiny-chat.jsonl")
    data["tracking"] = {"mlflow_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "registered_model": "words",
                        "experiment": "words"}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_spec(path)


def _register(spec: BuildSpec, client: MlflowClient, digit: str, status: str) -> str:
    unit = expand_units(spec)[0]
    manifest = Manifest(key=digit * 64, key_components={}, model="tiny-chat", unit=unit.name, lane="reference",
                        target={}, variant={}, profile={}, source={"uri": "x", "weights_digest": "w" * 64,
                                                                     "tokenizer_digest": "t" * 64},
                        files=[], status=status,
                        status_reason="" if status == "candidate" else "smoke gate: 0.5 < 0.95")
    exp = client.get_experiment_by_name("words")
    run_id = client.create_run(exp.experiment_id if exp else client.create_experiment("words")).info.run_id
    client.set_tag(run_id, mltags.STATUS, status)
    return register_published_unit.fn(spec, unit, manifest, f"file:///store/{digit}/manifest.json", run_id)


def test_a_rejected_version_says_so_and_a_superseded_candidate_too(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    client = MlflowClient(spec.tracking.mlflow_uri)
    rejected = client.get_model_version("words", _register(spec, client, "1", UnitStatus.REJECTED))
    assert rejected.description.startswith("REJECTED, not deployable: smoke gate: 0.5 < 0.95")
    assert rejected.tags[mltags.DEPLOYABLE] == "false" and rejected.tags[mltags.STATUS] == "rejected"
    assert not client.get_registered_model("words").aliases  # no alias points at it

    first = _register(spec, client, "2", UnitStatus.CANDIDATE)
    assert client.get_model_version("words", first).tags[mltags.DEPLOYABLE] == "true"
    second = _register(spec, client, "3", UnitStatus.CANDIDATE)
    assert str(client.get_model_version_by_alias("words", "cpu-candidate").version) == second
    old = client.get_model_version("words", first)
    assert old.tags[mltags.STATUS] == "superseded"  # was `candidate` for ever (issue 33)
    assert client.get_run(old.run_id).data.tags[mltags.STATUS] == "superseded"
    assert client.get_model_version("words", second).tags[mltags.STATUS] == "candidate"
