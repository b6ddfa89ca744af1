#!/usr/bin/env python3
"""The control plane at scale (issue 40, item 3): a synthetic fleet of tiny units built in cluster mode through a
private stack (PostgreSQL, Prefect server, MLflow server, SeaweedFS, a cpu worker), at two or three sizes, then
rerun all-hits. A benchmark, not a test.

    .venv/bin/python benchmarks/control_plane_scale.py --sizes 5,10,20 [--tolerance 0.25] [--json]

Each size is one spec of N units: the tiny model (tests/fixtures/tiny-chat) on the reference lane and the cpu
target, fp32, N profiles that differ only in max_batch_size (so each is a unit of its own key), the benchmark off
and the tiny spec's smoke (its required gate, 6 new tokens). Every size has its own registered model
and MLflow experiment, and its own max_batch_size range, so no unit of one size is a cache hit of another; the
servers and the database keep what the earlier sizes wrote (the fleet grows).

Per size it measures:
- plan: `enginefoundry plan SPEC` (the CLI's wall, its start-up included);
- the build: `enginefoundry run SPEC --mode cluster` (the parent flow sends each unit to `build-unit/cpu` and
  waits); wall, the units' own stage seconds from the run's summary.json, and orchestration overhead per unit =
  (wall − the stages' seconds) / N;
- the servers' RSS (psutil over each service's process tree, sampled each second while the size runs; peak);
- answers 5xx: in the Prefect and MLflow servers' logs (their access lines) and in the CLI's output;
- lost units: every planned unit must be a candidate in the summary with a manifest in the store and a version
  of the size's registered model in MLflow;
- the all-hits rerun: the same command again; wall and wall per unit.

The verdict compares orchestration overhead per unit at the largest size with the smallest, measured in the same
run: flat when largest ≤ smallest × (1 + tolerance). Exit status 1 when a unit is lost, a 5xx was answered or the
verdict is not flat.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from enginefoundry.runner import die_with_parent

REPO = Path(__file__).resolve().parent.parent
STACK = REPO / "scripts" / "stack.py"
BIN = Path(sys.executable).parent
TINY_MODEL = REPO / "tests" / "fixtures" / "tiny-chat" / "model"
TINY_PROMPTS = REPO / "configs" / "prompts" / "tiny-chat.jsonl"
SERVICES = ("prefect", "mlflow", "postgres")  # the control plane whose RSS is reported
# An access-log line answered 5xx: uvicorn's `"GET /path HTTP/1.1" 503` and gunicorn's/Werkzeug's `" 503 `.
STATUS_5XX = re.compile(r'HTTP/1\.[01]" (5\d\d)\b')
CLI_5XX = re.compile(r"\b(50[0-4]) (Service Unavailable|Internal Server Error|Bad Gateway|Gateway Timeout)\b"
                     r"|status code (5\d\d)\b")  # the texts of httpx's errors; Prefect's client's retry warning
HIT = "(cache hit)"  # the summary table's status of a hit


# ---- pure logic (tests/unit/test_control_plane_scale.py) ----

@dataclasses.dataclass
class SizeResult:
    units: int
    plan_s: float
    wall_s: float
    stages_s: float  # the units' own stage seconds, summed (summary.json)
    rerun_s: float
    rerun_all_hits: bool
    candidates: int  # units a candidate in the summary
    published: int  # of those, with a manifest in the store
    registered: int  # versions of the size's registered model
    answers_5xx: int
    rss_peak_mib: dict[str, float]
    per_unit: dict[str, float] = dataclasses.field(default_factory=dict)  # Breakdown.per_unit
    outside_flow_s: float = 0.0  # the CLI's wall less the parent flow run's (start-up, exit)
    before_first_unit_s: float = 0.0  # the parent's start to the first unit's Running (first pick-up)

    @property
    def overhead_per_unit_s(self) -> float:
        return (self.wall_s - self.stages_s) / self.units

    @property
    def wall_per_unit_s(self) -> float:
        return self.wall_s / self.units

    @property
    def rerun_per_unit_s(self) -> float:
        return self.rerun_s / self.units

    @property
    def lost(self) -> int:
        """Planned units missing from any of the three records (summary, store, registry)."""
        return self.units - min(self.candidates, self.published, self.registered)

    def as_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "overhead_per_unit_s": round(self.overhead_per_unit_s, 3),
                "wall_per_unit_s": round(self.wall_per_unit_s, 3), "rerun_per_unit_s": round(self.rerun_per_unit_s, 4),
                "lost": self.lost}


@dataclasses.dataclass
class Verdict:
    smallest: int
    largest: int
    ratio: float  # overhead per unit, largest / smallest
    marginal_s: float  # overhead of one more unit: the slope of (wall − stages) from the smallest to the largest
    tolerance: float
    lost: int
    answers_5xx: int

    @property
    def flat(self) -> bool:
        return self.ratio <= 1.0 + self.tolerance

    @property
    def ok(self) -> bool:
        return self.flat and self.lost == 0 and self.answers_5xx == 0

    def line(self) -> str:
        trend = "flat" if self.flat else "GROWS"
        return (f"verdict: overhead per unit at {self.largest} units is {self.ratio:.2f}× that at {self.smallest} "
                f"({trend}, tolerance +{self.tolerance:.0%}); overhead of one more unit {self.marginal_s:.2f} s; "
                f"units lost {self.lost}; answers 5xx {self.answers_5xx}"
                f" -> {'OK' if self.ok else 'FAIL'}")


def verdict(results: Sequence[SizeResult], tolerance: float) -> Verdict:
    if len(results) < 2:
        raise ValueError("a verdict needs at least two sizes")
    ordered = sorted(results, key=lambda r: r.units)
    small, large = ordered[0], ordered[-1]
    if small.overhead_per_unit_s <= 0:
        raise ValueError(f"overhead per unit at {small.units} units is {small.overhead_per_unit_s:.3f} s: "
                         "the stage seconds exceed the wall time")
    return Verdict(smallest=small.units, largest=large.units,
                   ratio=large.overhead_per_unit_s / small.overhead_per_unit_s,
                   marginal_s=((large.wall_s - large.stages_s) - (small.wall_s - small.stages_s))
                   / max(1, large.units - small.units), tolerance=tolerance,
                   lost=sum(r.lost for r in results), answers_5xx=sum(r.answers_5xx for r in results))


def table(results: Sequence[SizeResult]) -> str:
    services = sorted({name for r in results for name in r.rss_peak_mib})
    head = ["units", "plan s", "build wall s", "stages s", "overhead/unit s", "wall/unit s", "all-hits rerun s",
            "rerun/unit s", "lost", "5xx", "in-flow/unit s", "between units/unit s", "slot refusals/unit",
            "state writes/unit", *(f"{name} RSS MiB" for name in services)]
    rows = [head, ["---"] * len(head)]
    for r in sorted(results, key=lambda r: r.units):
        rows.append([str(r.units), f"{r.plan_s:.1f}", f"{r.wall_s:.1f}", f"{r.stages_s:.1f}",
                     f"{r.overhead_per_unit_s:.2f}", f"{r.wall_per_unit_s:.2f}",
                     f"{r.rerun_s:.1f}" + ("" if r.rerun_all_hits else " (not all hits)"),
                     f"{r.rerun_per_unit_s:.3f}", str(r.lost), str(r.answers_5xx),
                     *(f"{r.per_unit[k]:.1f}" if k in r.per_unit else "–" for k in
                       ("in_flow_bookkeeping_s", "between_units_s", "slot_rejections", "state_writes")),
                     *(f"{r.rss_peak_mib.get(name, 0.0):.0f}" for name in services)])
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def fleet_spec(units: int, first_batch: int, *, store: str, mlflow_uri: str, tag: str) -> dict[str, Any]:
    """The spec of one size: `units` profiles of the tiny model, max_batch_size first_batch … first_batch+units−1."""
    if units < 1 or first_batch < 1 or first_batch + units - 1 > 4096:
        raise ValueError(f"max_batch_size {first_batch}…{first_batch + units - 1} is outside 1…4096")
    return {
        "name": f"scale-{tag}",
        "model": {"source": str(TINY_MODEL), "name": "tiny-chat"},
        "lane": "reference",
        "variants": [{"precision": "fp32"}],
        "profiles": [{"name": f"p{first_batch + i}", "max_batch_size": first_batch + i, "max_input_len": 128,
                      "max_seq_len": 256, "max_num_tokens": 512} for i in range(units)],
        "targets": [{"name": "cpu", "arch": "cpu", "gpu_count": 0}],
        "smoke": {"prompts": str(TINY_PROMPTS), "max_new_tokens": 6},
        "benchmark": {"enabled": False, "concurrency": [1],  # off; the two fields are required all the same
                      "scenarios": [{"name": "short", "input_tokens_mean": 24, "output_tokens_mean": 16}]},
        "publish": {"store": store},
        "tracking": {"mlflow_uri": mlflow_uri, "experiment": f"scale-{tag}", "registered_model": f"scale-{tag}"},
    }


@dataclasses.dataclass
class Breakdown:
    """Where one size's overhead goes, from the Prefect server's records of its unit runs (serial on one worker)."""
    unit_runs: int
    in_runs_s: float  # the unit runs' own time (Running → final), summed; minus the stages: in-flow bookkeeping
    between_s: float  # from one unit run's end to the next one's Running, summed: slot hand-off, process start
    before_first_s: float  # the parent's start to the first unit's Running
    after_last_s: float  # the last unit's end to the parent's end
    slot_rejections: int  # AwaitingConcurrencySlot states: a worker's try refused while the pool's slot was held
    state_writes: int  # every state of every unit run

    def per_unit(self, stages_s: float) -> dict[str, float]:
        n = max(1, self.unit_runs)
        return {"in_flow_bookkeeping_s": round((self.in_runs_s - stages_s) / n, 2),
                "between_units_s": round(self.between_s / n, 2),
                "slot_rejections": round(self.slot_rejections / n, 2), "state_writes": round(self.state_writes / n, 2)}


def stamp(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text).timestamp()


def breakdown(parent: dict[str, Any], units: Sequence[dict[str, Any]],
              states: Mapping[str, Sequence[dict[str, Any]]]) -> Breakdown:
    """`parent` and `units`: flow runs as the Prefect API returns them; `states`: each unit run's states by run id."""
    ran = sorted((u for u in units if u.get("start_time") and u.get("end_time")), key=lambda u: stamp(u["start_time"]))
    if not ran or not parent.get("start_time") or not parent.get("end_time"):
        raise ValueError("no unit run with a start and an end, or the parent has not ended")
    starts = [stamp(u["start_time"]) for u in ran]
    ends = [stamp(u["end_time"]) for u in ran]
    every = [s for u in units for s in states.get(u["id"], ())]
    return Breakdown(unit_runs=len(units), in_runs_s=sum(e - s for s, e in zip(starts, ends, strict=True)),
                     between_s=sum(max(0.0, s - e) for s, e in zip(starts[1:], ends[:-1], strict=True)),
                     before_first_s=starts[0] - stamp(parent["start_time"]),
                     after_last_s=stamp(parent["end_time"]) - max(ends),
                     slot_rejections=sum(1 for s in every if s.get("name") == "AwaitingConcurrencySlot"),
                     state_writes=len(every))


def count_5xx(text: str) -> int:
    """Lines that tell of an answer 5xx (a line counts once)."""
    return sum(1 for line in text.splitlines() if STATUS_5XX.search(line) or CLI_5XX.search(line))


# ---- the stack and the runs ----

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PREFECT_", "MLFLOW_")) and k not in ("EF_STORE", "AWS_ENDPOINT_URL_S3")}
    return env | {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1", "OMP_NUM_THREADS": "1",
                  "HF_HUB_DISABLE_XET": "1", "NO_PROXY": "127.0.0.1,localhost", "PREFECT_LOGGING_LEVEL": "WARNING"}


@contextlib.contextmanager
def private_stack(root: Path) -> Iterator[dict[str, str]]:
    """SeaweedFS, PostgreSQL, MLflow and Prefect servers and a cpu worker on free ports, build-unit/cpu deployed."""
    state = root / "stack"
    env = base_env() | {f"EF_{n}_PORT": str(free_port()) for n in ("S3", "MLFLOW", "PREFECT", "POSTGRES")}
    stack = [sys.executable, str(STACK)]
    try:
        up = subprocess.run([*stack, "up", "--state-dir", str(state), "--services", "s3,postgres,mlflow,prefect",
                             "--worker-pools", "cpu", "--owner-pid", str(os.getpid())],
                            env=env, capture_output=True, text=True)
        if up.returncode != 0:
            raise SystemExit(f"stack.py up failed:\n{up.stdout}{up.stderr}")
        env = env | json.loads((state / "env.json").read_text())
        deploy = subprocess.run([str(BIN / "prefect"), "--no-prompt", "deploy", "--prefect-file", "deployment.yaml",
                                 "--name", "build-unit/cpu"], cwd=REPO, env=env | {"PROJECT_DIR": str(REPO)},
                                capture_output=True, text=True)
        if deploy.returncode != 0:
            raise SystemExit(f"prefect deploy build-unit/cpu failed:\n{deploy.stdout[-3000:]}{deploy.stderr[-3000:]}")
        yield env | {"EF_STATE_DIR_FOR_BENCH": str(state)}
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a TERM now would cut `stack down` short: it runs to its end
        subprocess.run([*stack, "down", "--state-dir", str(state)], env=env, capture_output=True, text=True)


class RssSampler:
    """Peak RSS of each service's process tree (pid files of the stack), sampled once a second."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.peak: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> dict[str, float]:
        import psutil

        now: dict[str, float] = {}
        for name in SERVICES:
            pid_file = self.state / "pids" / f"{name}.pid"
            if not pid_file.is_file():
                continue
            try:
                root = psutil.Process(int(pid_file.read_text().strip()))
                tree = [root, *root.children(recursive=True)]
            except (psutil.Error, ValueError):
                continue
            total = 0
            for proc in tree:
                with contextlib.suppress(psutil.Error):
                    total += proc.memory_info().rss
            now[name] = total / 2**20
        return now

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, mib in self.sample().items():
                self.peak[name] = max(self.peak.get(name, 0.0), mib)
            self._stop.wait(1.0)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def log_sizes(state: Path) -> dict[Path, int]:
    return {p: p.stat().st_size for p in (state / "logs").glob("*.log")}


def new_log_text(state: Path, before: dict[Path, int]) -> str:
    """What the Prefect and MLflow servers and the workers (their flow runs' output) logged since `before`."""
    text = []
    for path in sorted((state / "logs").glob("*.log")):
        if not path.name.startswith(("prefect", "mlflow", "worker")):
            continue
        with path.open("rb") as f:
            f.seek(before.get(path, 0))
            text.append(f.read().decode(errors="replace"))
    return "".join(text)


def timed(argv: list[str], env: dict[str, str], log: Path) -> tuple[float, str, int]:
    """The command's wall, output and exit status; it dies with this process (a kill -9 of the benchmark leaves no
    `enginefoundry run` behind)."""
    start = time.monotonic()
    proc = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, preexec_fn=die_with_parent())
    wall = time.monotonic() - start
    out = proc.stdout + proc.stderr
    with log.open("a") as f:
        f.write(f"\n=== {' '.join(argv)} -> rc {proc.returncode} in {wall:.1f} s\n{out}")
    return wall, out, proc.returncode


PARENT_RUN = re.compile(r"MLflow parent run ([0-9a-f]{32})\b")


def run_summary(work: Path, cli_output: str) -> dict[str, Any]:
    """The summary.json of the run whose parent MLflow run the CLI named (an all-hits rerun's is written later,
    by its background process, so "the newest summary" is not this run's)."""
    named = PARENT_RUN.findall(cli_output)
    if len(named) != 1:
        raise SystemExit(f"expected the CLI to name one MLflow parent run, found {len(named)}:\n{cli_output[-2000:]}")
    data: dict[str, Any] = json.loads((work / "runs" / named[0] / "summary.json").read_text())
    return data


def prefect_runs(env: dict[str, str], tag: str) -> tuple[dict[str, Any], list[dict[str, Any]],
                                                         dict[str, list[dict[str, Any]]]]:
    """The size's parent flow run (`build scale-<tag> (cluster)`), its unit runs and their states."""
    import httpx

    with httpx.Client(base_url=env["PREFECT_API_URL"], trust_env=False, timeout=60) as http:
        found = http.post("/flow_runs/filter", json={"flow_runs": {"name": {"any_": [f"build scale-{tag} (cluster)"]}}})
        found.raise_for_status()
        parents = found.json()
        if len(parents) != 1:
            raise SystemExit(f"expected one parent run 'build scale-{tag} (cluster)', found {len(parents)}")
        units: list[dict[str, Any]] = []
        while True:  # the API answers at most 200 a page
            page = http.post("/flow_runs/filter", json={
                "flow_runs": {"parent_flow_run_id": {"any_": [parents[0]["id"]]}}, "offset": len(units),
                "limit": 200})
            page.raise_for_status()
            units += page.json()
            if len(page.json()) < 200:
                break
        states = {}
        for unit in units:
            got = http.get("/flow_run_states/", params={"flow_run_id": unit["id"]})
            got.raise_for_status()
            states[unit["id"]] = got.json()
    return parents[0], units, states


def count_published(env: dict[str, str], uris: list[str]) -> int:
    import boto3
    from botocore.config import Config

    s3 = boto3.client("s3", endpoint_url=env["EF_S3_ENDPOINT"], region_name="us-east-1",
                      aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                      config=Config(s3={"addressing_style": "path"}))
    found = 0
    for uri in uris:
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        with contextlib.suppress(s3.exceptions.ClientError):
            s3.head_object(Bucket=bucket, Key=key)
            found += 1
    return found


def count_registered(env: dict[str, str], name: str) -> int:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    return len(client.search_model_versions(f"name='{name}'", max_results=10_000))


def run_size(env: dict[str, str], root: Path, units: int, first_batch: int, tag: str) -> SizeResult:
    state = Path(env["EF_STATE_DIR_FOR_BENCH"])
    work = root / "work"
    cli_env = env | {"EF_WORK_DIR": str(work), "EF_CACHE_DIR": str(root / "cache"), "HF_HOME": str(root / "hf"),
                     "COLUMNS": "200"}  # one table row per unit
    spec = fleet_spec(units, first_batch, store=env["EF_STORE"], mlflow_uri=env["MLFLOW_TRACKING_URI"], tag=tag)
    path = root / f"spec-{tag}.json"
    path.write_text(json.dumps(spec, indent=1))  # JSON is YAML
    cli = [str(BIN / "enginefoundry")]
    log = root / f"cli-{tag}.log"
    logs_before = log_sizes(state)
    with RssSampler(state) as rss:
        plan_s, out, rc = timed([*cli, "plan", str(path)], cli_env, log)
        if rc != 0:
            raise SystemExit(f"plan failed (rc {rc}), see {log}:\n{out[-2000:]}")
        print(f"[{tag}] building {units} units in cluster mode …", file=sys.stderr, flush=True)
        wall_s, out, rc = timed([*cli, "run", str(path), "--mode", "cluster"], cli_env, log)
        cli_text = out
        summary = run_summary(work, out)
        # All hits take the fast path (no Prefect; MLflow recorded by a background process): its table says so.
        rerun_s, out, rc2 = timed([*cli, "run", str(path), "--mode", "cluster"], cli_env, log)
        cli_text += out
    outcomes = summary["outcomes"]
    candidates = [o for o in outcomes if o["status"] == "candidate" and o.get("manifest_uri")]
    stages = sum(float(v) for o in outcomes for v in o.get("stage_seconds", {}).values())
    result = SizeResult(
        units=units, plan_s=plan_s, wall_s=wall_s, stages_s=stages, rerun_s=rerun_s,
        rerun_all_hits=rc2 == 0 and out.count(HIT) == units,
        candidates=len(candidates),
        published=count_published(env, [o["manifest_uri"] for o in candidates]),
        registered=count_registered(env, spec["tracking"]["registered_model"]),
        answers_5xx=count_5xx(new_log_text(state, logs_before)) + count_5xx(cli_text),
        rss_peak_mib={k: round(v, 1) for k, v in rss.peak.items()})
    parent, unit_runs, states = prefect_runs(env, tag)
    split = breakdown(parent, unit_runs, states)
    result.per_unit = split.per_unit(stages)
    result.outside_flow_s = round(wall_s - (stamp(parent["end_time"]) - stamp(parent["start_time"])), 2)
    result.before_first_unit_s = round(split.before_first_s, 2)
    print(json.dumps(result.as_json()), file=sys.stderr, flush=True)  # kept if a later size fails
    print(f"[{tag}] {units} units: wall {wall_s:.1f} s, stages {stages:.1f} s, overhead/unit "
          f"{result.overhead_per_unit_s:.2f} s, rerun {rerun_s:.1f} s, lost {result.lost}", file=sys.stderr, flush=True)
    return result


def parse_sizes(text: str) -> list[int]:
    sizes = [int(s) for s in text.split(",") if s.strip()]
    if len(sizes) < 2 or any(s < 1 for s in sizes) or sum(sizes) > 4095:
        raise argparse.ArgumentTypeError("two or more sizes ≥ 1, together at most 4095 units")
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=parse_sizes, default=[5, 10, 20], help="unit counts, e.g. 25,100,200")
    parser.add_argument("--tolerance", type=float, default=0.25,
                        help="flat: overhead per unit at the largest size ≤ smallest × (1 + this)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, specs, summaries)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    # A TERM (a cancelled job) unwinds like Ctrl-C: the running command is killed, the stack stopped, the folder gone.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    root = Path(tempfile.mkdtemp(prefix="ef-scale-"))
    results: list[SizeResult] = []
    try:
        with private_stack(root) as env:
            first = 1
            for units in args.sizes:
                results.append(run_size(env, root, units, first, f"{units}u-{first}"))
                first += units
    finally:
        if args.keep:
            print(f"kept {root}", file=sys.stderr)
        else:
            import shutil

            shutil.rmtree(root, ignore_errors=True)
    found = verdict(results, args.tolerance)
    if args.json:
        print(json.dumps({"sizes": [r.as_json() for r in results], "verdict": {
            **dataclasses.asdict(found), "flat": found.flat, "ok": found.ok}}, indent=1))
    else:
        print(table(results))
        print(found.line())
    return 0 if found.ok else 1


if __name__ == "__main__":
    sys.exit(main())
