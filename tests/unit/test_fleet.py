"""A fleet's specs (files and folders), its per-pool limits and its summary, decided without Prefect
(enginefoundry/rollout/fleet.py); the CLI refuses a bad fleet before Prefect starts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from enginefoundry.errors import InputError
from enginefoundry.records.promotion import Decision
from enginefoundry.rollout.fleet import (
    MAX_FLEET_SPECS,
    FleetMember,
    FleetNotOk,
    FleetSummary,
    fleet_spec_paths,
    parse_pool_limits,
    pool_limit_name,
)
from enginefoundry.rollout.source_change import ChangeReport, RolloutReport, SourceState, TargetChange
from enginefoundry.spec import SourceKind


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("name: x\n")
    return path


def test_files_and_folders_in_order_each_spec_once(tmp_path: Path) -> None:
    folder = tmp_path / "fleet"
    b, a = _touch(folder / "b.yaml"), _touch(folder / "a.yml")
    _touch(folder / "notes.txt")
    (folder / "nested").mkdir()
    _touch(folder / "nested" / "deep.yaml")  # not recursive
    single = _touch(tmp_path / "single.yaml")
    assert fleet_spec_paths([str(single), str(folder), str(b)]) == [single, a, b]


@pytest.mark.parametrize("case, message", [
    ("missing", "does not exist"), ("not-yaml", "is not a spec"), ("empty-folder", "holds no *.yaml"),
    ("nothing", "no specs"),
])
def test_a_bad_fleet_is_refused_naming_the_item(tmp_path: Path, case: str, message: str) -> None:
    items = {"missing": [str(tmp_path / "nope.yaml")], "not-yaml": [str(_touch(tmp_path / "spec.txt"))],
             "empty-folder": [str(tmp_path)], "nothing": []}[case]
    with pytest.raises(InputError, match="fleet: .*" + message.replace("*", r"\*")):
        fleet_spec_paths(items)


def test_a_fleet_is_bounded(tmp_path: Path) -> None:
    for i in range(MAX_FLEET_SPECS + 1):
        _touch(tmp_path / f"s{i:04d}.yaml")
    with pytest.raises(InputError, match=f"more than {MAX_FLEET_SPECS}"):
        fleet_spec_paths([str(tmp_path)])


def test_pool_limits_parse_and_refuse_with_the_fix() -> None:
    assert parse_pool_limits(["cpu=2", "gpu-sm90=4", "cpu=1"]) == {"cpu": 1, "gpu-sm90": 4}
    assert pool_limit_name("gpu-sm90") == "enginefoundry-pool-gpu-sm90"
    for bad, fix in (("cpu", "POOL=N"), ("CPU=1", "POOL=N"), ("cpu=0", "from 1 to"), ("cpu=x", "from 1 to"),
                     ("cpu=1001", "from 1 to"), ("../x=1", "POOL=N")):
        with pytest.raises(InputError, match=fix):
            parse_pool_limits([bad])


def _report(*, built: bool, build_ok: bool | None, actions: list[tuple[str, str]]) -> RolloutReport:
    change = ChangeReport(source=SourceState(uri="file:///m", kind=SourceKind("local")),
                          targets=[TargetChange(target="cpu", changed=built, reason="new")])
    return RolloutReport(spec="s", change=change, built=built, build_ok=build_ok, duration_s=1.5, build_run_id=None,
                         decisions=[Decision(stem=stem, unit=f"u-{stem}", action=action,  # type: ignore[arg-type]
                                             reasons=["slower"] if action == "held" else [])
                                    for stem, action in actions])


@pytest.mark.parametrize("built, build_ok, actions, status", [
    (True, True, [("cpu", "promoted")], "promoted"),
    (True, True, [("cpu", "held")], "held"),
    (True, True, [("cpu", "promoted"), ("gpu", "held")], "promoted"),
    (True, True, [], "built"),
    (False, None, [], "unchanged"),
    (True, False, [("cpu", "held")], "failed"),
])
def test_member_status_from_the_rollout_report(built: bool, build_ok: bool | None, actions: list[tuple[str, str]],
                                               status: str) -> None:
    member = FleetMember.of_report("s.yaml", _report(built=built, build_ok=build_ok, actions=actions), "run1")
    assert member.status == status
    assert member.promoted == [s for s, a in actions if a == "promoted"]
    if any(a == "held" for _, a in actions):
        assert "slower" in member.reason
    if status == "failed":
        assert "did not pass" in member.reason


def test_summary_counts_rows_markdown_and_failure() -> None:
    ok = FleetMember.of_report("a.yaml", _report(built=True, build_ok=True, actions=[("cpu", "promoted")]), "r1")
    bad = FleetMember.failure("b.yaml", "b", "model.source: no such folder | x\nTraceback…")
    summary = FleetSummary(name="nightly", members=[ok, bad], pool_limits={"cpu": 2}, mlflow_run_id="f1")
    assert not summary.ok and summary.counts() == {"promoted": 1, "failed": 1}
    assert summary.headline() == "fleet nightly: 2 spec(s): 1 failed, 1 promoted"
    assert [r["status"] for r in summary.rows()] == ["promoted", "failed"]
    assert bad.reason == "model.source: no such folder | x"  # first line only
    md = summary.markdown()
    assert "`cpu` 2" in md and "`f1`" in md and "no such folder \\| x" in md
    assert "b (model.source" in str(FleetNotOk(summary))
    assert FleetSummary(name="n", members=[ok]).ok


def test_cli_refuses_a_bad_fleet_before_prefect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from enginefoundry.cli import main

    had_prefect = "prefect.flows" in sys.modules
    assert main(["fleet", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    spec = _touch(tmp_path / "a.yaml")
    assert main(["fleet", str(spec), "--pool-limit", "cpu=zero"]) == 2
    assert "--pool-limit" in capsys.readouterr().err
    assert had_prefect or "prefect.flows" not in sys.modules
