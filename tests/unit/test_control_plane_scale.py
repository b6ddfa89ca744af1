"""The scale benchmark's own logic (benchmarks/control_plane_scale.py): overhead per unit, lost units, the table, the
verdict, the synthetic spec and the 5xx count. No process starts here; the benchmark itself is run by hand."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from enginefoundry.inputs.units import expand_units
from enginefoundry.spec import load_spec

REPO = Path(__file__).resolve().parents[2]


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("control_plane_scale", REPO / "benchmarks" / "control_plane_scale.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's annotations through sys.modules
    spec.loader.exec_module(module)
    return module


scale = load()


def result(units: int, wall: float, stages: float, *, candidates: int | None = None, published: int | None = None,
           registered: int | None = None, answers_5xx: int = 0, rerun: float = 1.0):  # -> scale.SizeResult
    return scale.SizeResult(units=units, plan_s=2.0, wall_s=wall, stages_s=stages, rerun_s=rerun,
                            rerun_all_hits=True, candidates=units if candidates is None else candidates,
                            published=units if published is None else published,
                            registered=units if registered is None else registered, answers_5xx=answers_5xx,
                            rss_peak_mib={"prefect": 300.0, "postgres": 120.0})


def test_overhead_per_unit_is_wall_less_stages_over_units() -> None:
    r = result(10, wall=400.0, stages=300.0, rerun=5.0)
    assert r.overhead_per_unit_s == pytest.approx(10.0)
    assert r.wall_per_unit_s == pytest.approx(40.0)
    assert r.rerun_per_unit_s == pytest.approx(0.5)


def test_a_unit_missing_from_any_record_is_lost() -> None:
    assert result(10, 400.0, 300.0).lost == 0
    assert result(10, 400.0, 300.0, published=9).lost == 1
    assert result(10, 400.0, 300.0, registered=7, candidates=9).lost == 3


def test_verdict_flat_within_tolerance_compares_largest_with_smallest() -> None:
    found = scale.verdict([result(20, 900.0, 700.0), result(5, 260.0, 200.0)], tolerance=0.25)
    assert (found.smallest, found.largest) == (5, 20)
    assert found.ratio == pytest.approx(10.0 / 12.0)
    assert found.marginal_s == pytest.approx((200.0 - 60.0) / 15)  # the fixed cost of a run left out
    assert found.flat and found.ok
    assert "0.83× that at 5" in found.line() and found.line().endswith("OK")


def test_verdict_fails_when_overhead_grows_a_unit_is_lost_or_a_5xx_was_answered() -> None:
    grows = scale.verdict([result(5, 250.0, 200.0), result(20, 1100.0, 800.0)], tolerance=0.25)
    assert grows.ratio == pytest.approx(1.5) and not grows.flat and not grows.ok
    assert "GROWS" in grows.line() and grows.line().endswith("FAIL")
    lost = scale.verdict([result(5, 250.0, 200.0), result(20, 900.0, 700.0, registered=19)], tolerance=0.25)
    assert lost.flat and lost.lost == 1 and not lost.ok
    busy = scale.verdict([result(5, 250.0, 200.0, answers_5xx=2), result(20, 900.0, 700.0)], tolerance=0.25)
    assert busy.answers_5xx == 2 and not busy.ok


def test_verdict_needs_two_sizes_and_a_positive_overhead() -> None:
    with pytest.raises(ValueError, match="two sizes"):
        scale.verdict([result(5, 250.0, 200.0)], tolerance=0.25)
    with pytest.raises(ValueError, match="exceed the wall"):
        scale.verdict([result(5, 200.0, 250.0), result(10, 500.0, 400.0)], tolerance=0.25)


def test_table_has_one_row_per_size_in_unit_order() -> None:
    text = scale.table([result(20, 900.0, 700.0), result(5, 260.0, 200.0)])
    lines = text.splitlines()
    assert lines[0].startswith("| units | plan s |")
    assert "postgres RSS MiB" in lines[0] and "prefect RSS MiB" in lines[0]
    assert len(lines) == 4
    assert lines[2].startswith("| 5 | 2.0 | 260.0 | 200.0 | 12.00 |")
    assert lines[3].startswith("| 20 | 2.0 | 900.0 | 700.0 | 10.00 |")


def test_fleet_spec_is_a_valid_spec_of_n_distinct_units(tmp_path: Path) -> None:
    data = scale.fleet_spec(7, 11, store="s3://b/store", mlflow_uri="http://127.0.0.1:5000", tag="t")
    (tmp_path / "spec.json").write_text(json.dumps(data))
    spec = load_spec(tmp_path / "spec.json")
    units = expand_units(spec)
    assert len(units) == 7
    assert len({u.name for u in units}) == 7
    assert [p.max_batch_size for p in spec.profiles] == list(range(11, 18))
    assert spec.benchmark.enabled is False
    with pytest.raises(ValueError, match="outside 1…4096"):
        scale.fleet_spec(10, 4090, store="s3://b/s", mlflow_uri="http://x", tag="t")


def test_count_5xx_in_access_lines_and_client_messages() -> None:
    text = "\n".join([
        'INFO: 127.0.0.1:5 - "POST /api/flow_runs/ HTTP/1.1" 201 Created',
        'INFO: 127.0.0.1:5 - "POST /api/flow_runs/ HTTP/1.1" 503 Service Unavailable',
        '127.0.0.1 - "GET /api/2.0/mlflow/runs/get HTTP/1.1" 500 12',
        "Received response with retryable status code 503. Another attempt will be made in 2s.",
        "took 503 ms",  # not an answer
    ])
    assert scale.count_5xx(text) == 3


def test_sizes_parse() -> None:
    assert scale.parse_sizes("25,100,200") == [25, 100, 200]
    with pytest.raises(Exception, match="two or more sizes"):
        scale.parse_sizes("200")


def run(run_id: str, start: str | None, end: str | None) -> dict[str, object]:
    day = "2026-12-05T20:"
    return {"id": run_id, "start_time": start and day + start + "+00:00", "end_time": end and day + end + "+00:00"}


def test_breakdown_splits_the_parents_time_between_units_and_the_gaps_between_them() -> None:
    parent = run("p", "00:00", "02:00")
    units = [run("b", "01:00", "01:30"), run("a", "00:10", "00:40"), run("c", "01:40", "01:55")]
    states = {"a": [{"name": "Scheduled"}, {"name": "Running"}, {"name": "Completed"}],
              "b": [{"name": "Scheduled"}, {"name": "AwaitingConcurrencySlot"}, {"name": "AwaitingConcurrencySlot"},
                    {"name": "Running"}, {"name": "Completed"}],
              "c": [{"name": "AwaitingConcurrencySlot"}]}
    split = scale.breakdown(parent, units, states)
    assert split.unit_runs == 3
    assert split.in_runs_s == pytest.approx(30 + 30 + 15)
    assert split.between_s == pytest.approx(20 + 10)  # a's end → b's start, b's end → c's start
    assert split.before_first_s == pytest.approx(10) and split.after_last_s == pytest.approx(5)
    assert (split.slot_rejections, split.state_writes) == (3, 9)
    assert split.per_unit(stages_s=60.0) == {"in_flow_bookkeeping_s": 5.0, "between_units_s": 10.0,
                                             "slot_rejections": 1.0, "state_writes": 3.0}


def test_breakdown_needs_an_ended_parent_and_a_unit_that_ran() -> None:
    with pytest.raises(ValueError, match="no unit run"):
        scale.breakdown(run("p", "00:00", None), [run("a", "00:10", "00:40")], {})
    with pytest.raises(ValueError, match="no unit run"):
        scale.breakdown(run("p", "00:00", "02:00"), [run("a", None, None)], {})
