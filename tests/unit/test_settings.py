"""Configuration like the ecosystem: flag > environment > spec > default; relative paths against the spec's
folder; one settings object, documented in the table of docs/configuration.md."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from enginefoundry.settings import EnvSettings, env_table, resolve_destinations
from enginefoundry.spec import load_spec

REPO = Path(__file__).resolve().parents[2]
VARS = ("MLFLOW_TRACKING_URI", "EF_STORE", "AWS_ENDPOINT_URL_S3", "EF_S3_ENDPOINT")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _spec(folder: Path, publish: dict | None = None, tracking: dict | None = None) -> Path:
    data = yaml.safe_load((REPO / "configs" / "tiny-cpu.yaml").read_text())
    data.pop("publish", None)
    data.pop("tracking", None)
    if publish is not None:
        data["publish"] = publish
    if tracking is not None:
        data["tracking"] = tracking
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_precedence_flag_over_environment_over_spec_over_default(tmp_path: Path, clean_env) -> None:
    spec = load_spec(_spec(tmp_path, {"store": "s3://from-spec/x", "s3_endpoint_url": "http://spec:1"},
                           {"mlflow_uri": "http://spec-mlflow:5000"}))
    dest = resolve_destinations(spec)
    assert (dest.store.value, dest.store.origin) == ("s3://from-spec/x", "spec")
    assert (dest.mlflow_uri.value, dest.mlflow_uri.origin) == ("http://spec-mlflow:5000", "spec")
    assert (dest.s3_endpoint_url.value, dest.s3_endpoint_url.origin) == ("http://spec:1", "spec")

    clean_env.setenv("EF_STORE", "s3://from-env/y")
    clean_env.setenv("MLFLOW_TRACKING_URI", "http://env-mlflow:5000")
    clean_env.setenv("AWS_ENDPOINT_URL_S3", "http://env:2")
    dest = resolve_destinations(spec)
    assert [d.origin for d in (dest.store, dest.mlflow_uri, dest.s3_endpoint_url)] == ["environment"] * 3
    assert dest.mlflow_uri.value == "http://env-mlflow:5000" and dest.mlflow_uri.detail == "MLFLOW_TRACKING_URI"

    dest = resolve_destinations(spec, store="s3://flag/z", mlflow_uri="http://flag:5000",
                                s3_endpoint_url="http://flag:3")
    assert [d.value for d in (dest.store, dest.mlflow_uri, dest.s3_endpoint_url)] == [
        "s3://flag/z", "http://flag:5000", "http://flag:3"]
    assert dest.store.origin == "flag" and dest.store.detail == "--store"

    for name in VARS:
        clean_env.delenv(name, raising=False)
    bare = load_spec(_spec(tmp_path / "bare"))
    dest = resolve_destinations(bare)
    assert dest.store.origin == "default" and dest.s3_endpoint_url.value is None


def test_relative_spec_paths_resolve_against_the_spec_folder_not_the_cwd(tmp_path: Path, clean_env) -> None:
    folder = tmp_path / "project" / "configs"
    spec = load_spec(_spec(folder, {"store": "file://../store"}, {"mlflow_uri": "sqlite:///db/mlflow.db"}))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    clean_env.chdir(elsewhere)
    dest = resolve_destinations(spec)
    assert dest.store.value == f"file://{tmp_path / 'project' / 'store'}"
    assert dest.mlflow_uri.value == f"sqlite:///{folder / 'db' / 'mlflow.db'}"
    # Defaults are relative paths of the spec model, so they land beside the spec too.
    default = resolve_destinations(load_spec(_spec(tmp_path / "other")))
    assert default.store.value == f"file://{tmp_path / 'other' / '.enginefoundry' / 'store'}"
    # From a flag or the environment: the working directory, as a shell user expects.
    clean_env.setenv("EF_STORE", "file://here")
    assert resolve_destinations(spec).store.value == f"file://{elsewhere / 'here'}"


def test_deprecated_s3_variable_is_an_alias_with_a_warning(clean_env) -> None:
    clean_env.setenv("EF_S3_ENDPOINT", "http://old:1")
    with pytest.warns(DeprecationWarning, match="AWS_ENDPOINT_URL_S3"):
        assert EnvSettings().s3_endpoint() == ("http://old:1", "EF_S3_ENDPOINT")
    clean_env.setenv("AWS_ENDPOINT_URL_S3", "http://new:2")
    assert EnvSettings().s3_endpoint() == ("http://new:2", "AWS_ENDPOINT_URL_S3")


def test_configuration_page_lists_every_setting() -> None:
    section = (REPO / "docs" / "configuration.md").read_text()
    for names, _default, description in env_table():
        row = next((line for line in section.splitlines() if line.startswith(f"| {names} |")), None)
        assert row is not None, f"docs/configuration.md's table has no row for {names}"
        assert description in row


PARAMETERS = ("parameter store", "parameter mlflow_uri", "parameter s3_endpoint_url")


def test_a_flow_parameter_that_repeats_the_environment_says_where_the_value_came_from(tmp_path: Path,
                                                                                      clean_env) -> None:
    """The CLI passes its effective destinations to the flow as parameters; the flow's log names their real
    origin (it said "from flag parameter store" for a value nobody typed, issue 25)."""
    from enginefoundry.settings import effective_spec

    spec = load_spec(_spec(tmp_path, {"store": "s3://from-spec/x"}))
    clean_env.setenv("MLFLOW_TRACKING_URI", "http://env-mlflow:5000")
    _, cli = effective_spec(spec)
    _, flow = effective_spec(spec, store=cli.store.value, mlflow_uri=cli.mlflow_uri.value,
                             s3_endpoint_url=cli.s3_endpoint_url.value, flag_names=PARAMETERS)
    assert [r["from"] for r in flow.rows()] == ["spec publish.store", "environment MLFLOW_TRACKING_URI",
                                                "default publish.s3_endpoint_url"]
    _, given = effective_spec(spec, store="s3://typed/z", flag_names=PARAMETERS)
    assert given.store.row()["from"] == "parameter store" and given.store.value == "s3://typed/z"
