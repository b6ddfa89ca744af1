"""What the Prefect UI shows for a run agrees with MLflow and the CLI (issue 25), on the code path a worker takes:
`prefect.flow_engine.run_flow(flow, flow_run=…, error_logger=<the run's logger>)`, as prefect/engine.py's
`__main__` calls it for a deployment run (prefect 3.9.1). The flow run is created first with a name, as the UI's
Custom run form does.

- a bad input (a typo'd spec path) ends Failed with one message and no traceback in the run's logs;
- a rejected unit ends the unit subflow and the parent Failed, the message naming the unit and its reason,
  with an error in the parent's log; MLflow says FAILED too;
- a name a person chose stays; a made-up one becomes `build <spec>`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from enginefoundry.errors import EngineFoundryError
from enginefoundry.flows.build_engines import build_engines
from tests.support.paths import CONFIGS, TINY_MODEL, TINY_PROMPTS


@pytest.fixture(autouse=True)
def _patient_ephemeral_server() -> Iterator[None]:
    from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, temporary_settings

    with temporary_settings(updates={PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: 180}):
        yield


def run_as_a_worker(name: str, parameters: dict[str, Any]) -> tuple[Any, str]:
    """Create a named flow run of build-engines and run it as the worker's run process does; (final flow run,
    its logs as 'LEVEL message' lines)."""
    from prefect.client.orchestration import get_client
    from prefect.flow_engine import run_flow
    from prefect.logging.handlers import APILogHandler
    from prefect.logging.loggers import flow_run_logger

    with get_client(sync_client=True) as client:
        flow_run = client.create_flow_run(build_engines, name=name, parameters=parameters)
        # The worker's run process exits on the error; what matters is what the UI shows.
        with contextlib.suppress(EngineFoundryError):
            run_flow(build_engines, flow_run=flow_run, error_logger=flow_run_logger(flow_run=flow_run))
        for logger in (logging.getLogger(n) for n in ("prefect.flow_runs", "prefect.task_runs", "prefect")):
            for handler in logger.handlers:
                if isinstance(handler, APILogHandler):
                    handler.flush()
        final = client.read_flow_run(flow_run.id)
        return final, run_logs(client, flow_run.id)


def run_logs(client: Any, flow_run_id: Any) -> str:
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return "\n".join(f"{logging.getLevelName(log.level)} {log.message}" for log in logs)


def children(flow_run_id: Any) -> list[Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    with get_client(sync_client=True) as client:
        return client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id])))


def test_a_typo_in_the_spec_path_fails_with_one_message_and_no_traceback(tmp_path: Path, unique: str) -> None:
    run, logs = run_as_a_worker(f"ui-bad-path-{unique}", {"spec_path": "configs/tiny-cpu.yml"})
    assert run.state.is_failed()
    first_line = run.state.message.splitlines()[0]
    assert "configs/tiny-cpu.yml does not exist; pass a spec such as configs/tiny-cpu.yaml" in first_line
    assert "Traceback" not in logs and "unexpected exception" not in logs, logs
    assert "ERROR " in logs and "configs/tiny-cpu.yml does not exist" in logs, logs  # at ERROR (issue 33)
    assert run.name == f"ui-bad-path-{unique}"  # the name typed in the form stays


def test_a_two_word_name_a_person_gave_stays() -> None:
    """`nightly-check` has the shape of Prefect's made-up names (issue 33): it is told by how Prefect makes them."""
    run, _ = run_as_a_worker("nightly-check", {"spec_path": "configs/tiny-cpu.yml"})
    assert run.state.is_failed() and run.name == "nightly-check"


def test_a_pasted_spec_with_a_typo_names_the_unknown_key_first(unique: str) -> None:
    data = yaml.safe_load((CONFIGS / "tiny-cpu.yaml").read_text())
    data["modell"] = data.pop("model")  # its consequence, "model: required field is missing", comes second
    run, logs = run_as_a_worker("alpha7-andromedae-nebula", {"spec_yaml": yaml.safe_dump(data)})
    assert run.state.is_failed()
    first_line = run.state.message.splitlines()[0]
    assert first_line.startswith("spec_yaml is invalid: modell: unknown key"), run.state.message
    assert first_line.endswith("(+1 more below)") and "  model: required field is missing" in run.state.message
    assert "Traceback" not in logs, logs
    assert run.name == "build tiny-cpu"  # a name the UI's form made up is replaced by a readable one


def test_the_shipped_spec_pasted_unchanged_resolves_its_paths_from_configs(monkeypatch, tmp_path: Path) -> None:
    from enginefoundry.flows.build_engines import resolve_spec

    monkeypatch.chdir(CONFIGS.parent)  # a worker runs in the project folder
    spec = resolve_spec(None, None, (CONFIGS / "tiny-cpu.yaml").read_text())
    assert spec.resolve_path(spec.smoke.prompts) == TINY_PROMPTS.resolve()
    assert spec.model.parsed_source(spec.base_path).location == str(TINY_MODEL.resolve())


def test_a_rejected_unit_fails_the_unit_and_the_parent_run(tmp_path: Path, unique: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in {"EF_WORK_DIR": tmp_path / "work", "EF_CACHE_DIR": tmp_path / "cache",
                 "EF_REFERENCE_CACHE": tmp_path / "references"}.items():
        monkeypatch.setenv(k, str(v))
    doc = yaml.safe_load((CONFIGS / "tiny-cpu.yaml").read_text())
    doc["model"]["source"] = str(TINY_MODEL)
    # A floor no finite prompt set clears (the Wilson lower bound of 108/108 is 0.966): rejected for real.
    doc["smoke"].update({"prompts": str(TINY_PROMPTS), "min_agreement": 1.0})
    doc["benchmark"]["enabled"] = False
    doc["publish"]["store"] = f"file://{tmp_path / 'store'}"
    doc["tracking"] = {"mlflow_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": f"states-{unique}"}
    run, logs = run_as_a_worker(f"rejected {unique}", {"spec_yaml": yaml.safe_dump(doc)})

    assert run.state.is_failed(), run.state
    assert run.state.message.startswith("1 of 1 unit(s) did not pass: fp32-tp1.chat.cpu rejected (smoke gate: ")
    # At ERROR (issue 33): the UI's Logs tab filtered to errors shows why the run failed.
    assert "ERROR 1 of 1 unit(s) did not pass: fp32-tp1.chat.cpu rejected" in logs, logs
    assert "Traceback" not in logs and "unexpected exception" not in logs, logs
    unit_runs = children(run.id)
    assert [(u.name, u.state.type.value) for u in unit_runs] == [("unit fp32-tp1.chat.cpu", "FAILED")]
    assert unit_runs[0].state.message.startswith("unit fp32-tp1.chat.cpu rejected: smoke gate: ")
    assert run.name == f"rejected {unique}"

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert sorted(r.info.status for r in runs) == ["FAILED", "FAILED"]
    # The exact commands the unit ran are on its run: a tag, and reports/commands.json.
    unit_run = next(r for r in runs if "enginefoundry.commands" in r.data.tags)
    commands = unit_run.data.tags["enginefoundry.commands"].splitlines()
    assert commands[0].startswith("convert: '(in-process)' cast_checkpoint dtype=float32"), commands
    # The server the smoke stage judged (the reference lane's scoring server); no benchmark, so no shipped one.
    assert any(c.startswith("smoke_serve: ") and "-m enginefoundry.smoke.serve" in c and "--port" in c
               for c in commands), commands
    assert "commands.json" in [a.path.rsplit("/", 1)[-1] for a in client.list_artifacts(unit_run.info.run_id,
                                                                                        "reports")]
