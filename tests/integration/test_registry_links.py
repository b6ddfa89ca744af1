"""On the MLflow tracking server, a registered unit is linked both ways (issue 25): the model version's source is
its LoggedModel (`models:/<model_id>`, the form MLflow's UI links from), the LoggedModel names the version, and
the run lists the LoggedModel as its output (the run page's "Logged models")."""

from __future__ import annotations

from enginefoundry.records.tracking import Tracker, UnitVersion, register_unit


def test_version_logged_model_and_run_link_each_other(stack: dict[str, str], unique: str) -> None:
    tracker = Tracker(stack["MLFLOW_TRACKING_URI"], f"links-{unique}")
    client = tracker.client
    run_id = client.create_run(tracker.experiment_id).info.run_id
    number = register_unit(tracker, UnitVersion(
        unit_name="fp32-tp1.chat.cpu", run_id=run_id, artifact_uri=f"s3://enginefoundry/links-{unique}/units/x",
        tags={"enginefoundry.manifest_uri": f"s3://enginefoundry/links-{unique}/m.json"}, params={}),
        registered_model=f"links-{unique}", alias=None)
    version = client.get_model_version(f"links-{unique}", number)
    model_id = version.source.removeprefix("models:/")
    assert version.source.startswith("models:/m-") and version.run_id == run_id
    logged = client.get_logged_model(model_id)
    assert logged.source_run_id == run_id and str(logged.status).endswith("READY")
    assert f'"version": {number}' in logged.tags["mlflow.modelVersions"]
    assert [o.model_id for o in client.get_run(run_id).outputs.model_outputs] == [model_id]
    assert version.tags["enginefoundry.manifest_uri"].endswith("/m.json")  # the store location stays a tag
