#!/usr/bin/env python3
"""A cold run of a spec (default configs/tiny-cpu.yaml): how much of its wall time is the tools' own work and how
much is orchestration. A benchmark, not a test.

    .venv/bin/python benchmarks/cold_run.py [--runs 2] [--repo DIR] [--keep-prefect-home | --prefect-api URL] [--json]

Cold: a fresh store, a fresh SQLite MLflow file, a fresh work folder and a fresh PREFECT_HOME (so the temporary
Prefect API server creates and migrates its database), no PREFECT_API_URL. `--keep-prefect-home` keeps one
PREFECT_HOME for all runs and warms it first (what a second `make demo` on a fresh store meets: ~/.prefect
stays). `--prefect-api URL` runs against a Prefect API server that is already up (how Prefect runs in
production and under `make stack`: PREFECT_API_URL set, no temporary server). `--repo` runs another
checkout's code (its `enginefoundry` on PYTHONPATH, its spec), e.g. main's, to
compare before and after a change.

Each tool's own time comes from the run's own records: the unit's stage seconds in the run's summary.json
(build, server start, smoke, benchmark, publish) and, per AIPerf point, the time between the bench task's log
lines that start and end that point. Orchestration = wall − tools: CLI start-up, the temporary Prefect server,
MLflow bookkeeping, task and flow bookkeeping, stopping the model server and the exit. The goal (issue 13):
orchestration ≤ 10% of the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GOAL_PCT = 10.0
TOOL_STAGES = (("build", "build"), ("serve", "server start"), ("smoke", "smoke"), ("bench", "benchmark (AIPerf)"),
               ("publish", "publish"))
# Prefect's console log lines: "20:37:09.052 | INFO    | Task run 'benchmark-ed9' - bench: short-c1 (24 requests…"
LOG_LINE = re.compile(r"^(\d\d:\d\d:\d\d\.\d{3}) \| \w+\s+\| (.*)$")
POINT_START = re.compile(r" - bench: (\S+) \(\d+ requests")
POINT_END = re.compile(r" - bench: (\S+): ")
MARKS = {"temporary Prefect server starting": "Starting temporary server",
         "temporary Prefect server ready": "Prefect: temporary API server on",
         "flow begins": "Beginning flow run",
         "first unit task": "Task run 'build "}


def cold_env(root: Path, repo: Path, prefect_home: Path, prefect_api: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "EF_"))}
    if prefect_api:
        env["PREFECT_API_URL"] = prefect_api
    env.update(PYTHONPATH=str(repo), OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"), PREFECT_HOME=str(prefect_home),
               EF_WORK_DIR=str(root / "work"), EF_STORE=(root / "store").as_uri(),
               MLFLOW_TRACKING_URI=f"sqlite:///{root / 'mlflow.db'}")
    return env


def run_once(python: str, repo: Path, spec: str, prefect_home: Path | None, prefect_api: str | None = None) -> dict:
    root = Path(tempfile.mkdtemp(prefix="ef-cold-"))
    home = prefect_home or root / "prefect"
    lines: list[tuple[float, str]] = []
    try:
        t0 = time.monotonic()
        wall_clock0 = datetime.now()
        proc = subprocess.Popen([python, "-m", "enginefoundry.cli", "run", spec], cwd=repo,
                                env=cold_env(root, repo, home, prefect_api), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.monotonic() - t0, line.rstrip("\n")))
        rc = proc.wait()
        wall = time.monotonic() - t0
        if rc != 0:
            tail = "\n".join(text for _, text in lines[-30:])
            raise SystemExit(f"the run failed (exit {rc}):\n{tail}")
        summaries = list((root / "work" / "runs").glob("*/summary.json"))
        if len(summaries) != 1:
            raise SystemExit(f"expected one run summary under {root / 'work' / 'runs'}, found {len(summaries)}")
        summary = json.loads(summaries[0].read_text())
        return measure(wall, lines, summary, wall_clock0)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def measure(wall: float, lines: list[tuple[float, str]], summary: dict, clock0: datetime) -> dict:
    if len(summary["outcomes"]) != 1:
        raise SystemExit("this benchmark reads a spec of one unit (the tiny spec)")
    stages = summary["outcomes"][0]["stage_seconds"]
    tools = {label: float(stages.get(key, 0.0)) for key, label in TOOL_STAGES}
    points = aiperf_points(lines, clock0)
    tool_s = sum(tools.values())
    orchestration = wall - tool_s
    marks = {name: next((t for t, text in lines if needle in text), None) for name, needle in MARKS.items()}
    last_output = lines[-1][0] if lines else wall
    return {"wall_s": round(wall, 2), "tools_s": {k: round(v, 2) for k, v in tools.items()},
            "aiperf_points_s": {k: round(v, 2) for k, v in points.items()}, "tool_total_s": round(tool_s, 2),
            "orchestration_s": round(orchestration, 2), "orchestration_pct": round(100 * orchestration / wall, 1),
            "goal_pct": GOAL_PCT, "marks_s": {k: (round(v, 2) if v is not None else None) for k, v in marks.items()},
            "exit_after_last_output_s": round(wall - last_output, 2)}


def aiperf_points(lines: list[tuple[float, str]], clock0: datetime) -> dict[str, float]:
    """Per benchmark point: from the bench task's "bench: <point> (N requests" line to its "bench: <point>: …"
    result line, both stamped by Prefect's logger."""
    starts: dict[str, datetime] = {}
    points: dict[str, float] = {}
    for _, text in lines:
        m = LOG_LINE.match(text)
        if not m:
            continue
        stamp = datetime.combine(clock0.date(), datetime.strptime(m.group(1), "%H:%M:%S.%f").time())
        if stamp < clock0 - timedelta(minutes=1):  # past midnight
            stamp += timedelta(days=1)
        if (s := POINT_START.search(text)) is not None:
            starts[s.group(1)] = stamp
        elif (e := POINT_END.search(text)) is not None and e.group(1) in starts:
            points[e.group(1)] = (stamp - starts.pop(e.group(1))).total_seconds()
    return points


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path("/proc/loadavg").exists() else "?"


def print_table(result: dict, index: int) -> None:
    wall = result["wall_s"]
    print(f"\nrun {index}: load before {result['load_before']}, after {result['load_after']}")
    print(f"{'':34}{'s':>8}{'% wall':>9}")
    print(f"{'wall':34}{wall:8.1f}{100:8.0f}%")
    for label, seconds in result["tools_s"].items():
        print(f"  {label:32}{seconds:8.1f}{100 * seconds / wall:8.1f}%")
        if label.startswith("benchmark"):
            for point, s in result["aiperf_points_s"].items():
                print(f"    AIPerf {point:25}{s:8.1f}")
    print(f"{'tools together':34}{result['tool_total_s']:8.1f}{100 * result['tool_total_s'] / wall:8.1f}%")
    verdict = "meets" if result["orchestration_pct"] <= GOAL_PCT else "misses"
    print(f"{'orchestration (wall − tools)':34}{result['orchestration_s']:8.1f}{result['orchestration_pct']:8.1f}%"
          f"   {verdict} the ≤ {GOAL_PCT:.0f}% goal")
    marks = ", ".join(f"{k} at {v:.1f} s" for k, v in result["marks_s"].items() if v is not None)
    print(f"  where: {marks}; exit {result['exit_after_last_output_s']:.1f} s after the last output")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--repo", type=Path, default=REPO, help="the checkout whose code runs (default: this one)")
    ap.add_argument("--spec", default="configs/tiny-cpu.yaml", help="relative to --repo")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--keep-prefect-home", action="store_true",
                    help="one warmed PREFECT_HOME for all runs instead of a fresh one per run")
    ap.add_argument("--prefect-api", metavar="URL",
                    help="PREFECT_API_URL of a Prefect server already up (no temporary server), e.g. make stack's")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    repo = args.repo.resolve()
    home = None
    if args.keep_prefect_home:
        home = Path(tempfile.mkdtemp(prefix="ef-cold-prefect-"))
        run_once(args.python, repo, args.spec, home)  # warms it: the database exists and is migrated
    results = []
    try:
        for i in range(args.runs):
            before = load()
            result = run_once(args.python, repo, args.spec, home, args.prefect_api)
            result.update(load_before=before, load_after=load(), repo=str(repo),
                          prefect_home="kept" if home else "fresh", prefect_api=args.prefect_api)
            results.append(result)
            if not args.json:
                print_table(result, i + 1)
    finally:
        if home is not None:
            shutil.rmtree(home, ignore_errors=True)
    if args.json:
        print(json.dumps({"runs": results, "goal_pct": GOAL_PCT}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
