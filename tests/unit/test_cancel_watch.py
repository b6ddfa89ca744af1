"""Cancel means stop (issue 33 §3), the parts that need no server: which run of a chain is cancelled, the private
Prefect name the watcher relies on, and the end of MLflow runs whose Prefect flow run is over (a unit on a worker
that never came back). tests/e2e/test_cancel.py cancels a real build on the cluster."""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any

from enginefoundry import tracking_tags as mltags
from enginefoundry.records.tracking import end_orphaned_runs
from enginefoundry.tasks.cancel_watch import CANCEL_INTENT, cancelled_in


def _run(name: str, state: str | None) -> Any:
    kind = None if state is None else SimpleNamespace(type=SimpleNamespace(value=state))
    return SimpleNamespace(name=name, state=kind)


def test_the_first_cancelled_run_of_the_chain_is_found() -> None:
    unit, parent, rollout = _run("unit", "RUNNING"), _run("build", "CANCELLING"), _run("rollout", "RUNNING")
    assert cancelled_in([unit, parent, rollout]) is parent
    assert cancelled_in([unit, _run("build", "RUNNING"), _run("rollout", None)]) is None
    assert cancelled_in([_run("unit", "CANCELLED"), parent]).name == "unit"


def test_the_private_prefect_name_is_there() -> None:
    module, name = CANCEL_INTENT
    assert callable(getattr(importlib.import_module(module), name))


class _Client:
    """MlflowClient's three calls end_orphaned_runs makes, over a list of runs."""

    def __init__(self, runs: dict[str, str]) -> None:  # run id → its Prefect flow run id ("" for none)
        self.runs = {rid: SimpleNamespace(info=SimpleNamespace(run_id=rid, status="RUNNING"),
                                          data=SimpleNamespace(tags={mltags.PREFECT_FLOW_RUN_ID: fr} if fr else {}))
                     for rid, fr in runs.items()}
        self.tags: dict[str, dict[str, str]] = {}

    def search_runs(self, experiments: list[str], filter_string: str, max_results: int) -> list[Any]:
        assert "RUNNING" in filter_string
        return [r for r in self.runs.values() if r.info.status == "RUNNING"]

    def set_tag(self, run_id: str, key: str, value: str) -> None:
        self.tags.setdefault(run_id, {})[key] = value

    def set_terminated(self, run_id: str, status: str) -> None:
        self.runs[run_id].info.status = status


def test_runs_of_flow_runs_that_are_over_end_killed() -> None:
    client = _Client({"cancelled-unit": "fr-1", "live-unit": "fr-2", "untagged": "", "elsewhere": "fr-9"})
    states = {"fr-1": "Cancelled", "fr-2": None}  # fr-9: not a flow run of this server
    ended = end_orphaned_runs(client, ["0"], states.get)
    assert ended == ["cancelled-unit"]
    assert client.runs["cancelled-unit"].info.status == "KILLED"
    assert client.tags["cancelled-unit"][mltags.END_REASON] == "its Prefect flow run ended Cancelled"
    assert {r: client.runs[r].info.status for r in ("live-unit", "untagged", "elsewhere")} == {
        "live-unit": "RUNNING", "untagged": "RUNNING", "elsewhere": "RUNNING"}
