"""The fault table (issue 9, docs/reliability.md): each row injects one fault into a real CLI run (tiny model,
reference lane, file:// store, MLflow on SQLite) and asserts what the user sees, the store's state, that no
process of the run survives, and that the next run completes unaided.

Every run carries a per-row marker in its environment (EF_FAULT_MARK); children inherit it, so "no orphan"
means: no live process under /proc has that marker in its environ. `kill -9` goes to the CLI process only
(the group leader), never to the group: what must die with it has to do so by itself.

Slow (a partial and a full run per row): run it with `pytest tests/e2e/test_fault_table.py` (see the doc).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.support.paths import REPO, TINY_MODEL, TINY_PROMPTS
from tests.support.processes import marked_processes as processes_with
from tests.support.processes import poll

pytestmark = pytest.mark.e2e

RUN_TIMEOUT_S = 900
# The stage boundaries, as the run's own log announces them (first line of each stage).
STAGES = {
    "fetch": r"Beginning flow run 'build ",
    "convert": r"convert: \S+ with lane",
    "reference": r"smoke: (reference answers \S+ from|computing \d+ reference answers)",  # before the build
    "build": r"build: \S+ on \S+$",
    "serve": r"serve: .* starting",
    "smoke": r"smoke: \d+/\d+ prompts answered",  # the server up, the gate asking it
    "bench": r"bench: \S+ \(\d+ requests",  # the sweep's first point starts (aiperf may finish within 10 s)
    "publish": r"publish: (?!checkpoint)",
    "register": r"Task run 'record unit",  # the unit's run is recorded right before registration
}


@dataclass
class Row:
    tmp: Path
    marker: str
    spec: Path
    env: dict[str, str]
    lines: list[str] = field(default_factory=list)

    @property
    def store(self) -> Path:
        return self.tmp / "store"


def _write_spec(tmp: Path) -> Path:
    """The tiny spec with its benchmark off: a benchmark point costs a fresh AIPerf (~15 s of CPU), and only the
    rows that fault the benchmark need one (`_with_benchmark`)."""
    spec = yaml.safe_load((REPO / "configs" / "tiny-cpu.yaml").read_text())
    spec["model"]["source"] = str(TINY_MODEL)
    spec["smoke"]["prompts"] = str(TINY_PROMPTS)
    spec["benchmark"].update({"enabled": False, "concurrency": [1], "request_count": 8, "warmup_request_count": 1})
    spec["publish"] = {"store": f"file://{tmp}/store"}
    spec["tracking"] = {"mlflow_uri": f"sqlite:///{tmp}/mlflow.db", "experiment": "faults"}
    path = tmp / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _with_benchmark(row: Row) -> Row:
    """The row's spec with its one-point benchmark on."""
    spec = yaml.safe_load(row.spec.read_text())
    spec["benchmark"]["enabled"] = True
    row.spec.write_text(yaml.safe_dump(spec))
    return row


@pytest.fixture
def row(tmp_path: Path, unique: str) -> Row:
    marker = f"fault-{unique}"
    env = {**os.environ, "EF_FAULT_MARK": marker, "EF_WORK_DIR": str(tmp_path / "work"),
           "EF_CACHE_DIR": str(tmp_path / "cache"), "PREFECT_HOME": str(tmp_path / "prefect"),
           "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1",
           # A loaded CI host starts the temporary Prefect server slowly; its default wait is 20 s.
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "300"}
    return Row(tmp=tmp_path, marker=marker, spec=_write_spec(tmp_path), env=env)


def _start(row: Row, *args: str, lines: list[str] | None = None) -> subprocess.Popen[str]:
    """Start `enginefoundry run` on the row's spec; its output goes to `lines` (default: the row's)."""
    sink = row.lines if lines is None else lines
    proc = subprocess.Popen([sys.executable, "-m", "enginefoundry.cli", "run", str(row.spec), *args], cwd=REPO,
                            env=row.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            sink.append(line.rstrip("\n"))

    threading.Thread(target=pump, daemon=True).start()
    return proc


def _wait_for_stage(row: Row, proc: subprocess.Popen[str], stage: str, timeout_s: float = RUN_TIMEOUT_S,
                    lines: list[str] | None = None) -> None:
    pattern = re.compile(STAGES[stage])
    seen = row.lines if lines is None else lines
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(pattern.search(line) for line in list(seen)):
            return
        if proc.poll() is not None:
            pytest.fail(f"the run ended (rc {proc.returncode}) before stage {stage}:\n" + "\n".join(seen[-40:]))
        time.sleep(0.05)
    pytest.fail(f"stage {stage} not reached in {timeout_s:.0f}s:\n" + "\n".join(seen[-40:]))


def marked_processes(marker: str) -> list[str]:
    return processes_with("EF_FAULT_MARK", marker)


def _assert_no_orphans(marker: str, within_s: float = 20.0) -> None:
    if not poll(lambda: not marked_processes(marker), within_s, interval_s=0.2):
        left = marked_processes(marker)
        assert not left, f"processes of the killed run still alive after {within_s:.0f}s:\n" + "\n".join(left)


def _manifests(store: Path) -> list[Path]:
    """Published unit builds (converted checkpoints share manifests/ and are not units)."""
    docs = sorted(p for p in store.glob("manifests/*/*/*.json") if p.name != "current.json")
    return [p for p in docs if "unit" in json.loads(p.read_text())]


def _run_to_end(row: Row, *args: str) -> tuple[int, str]:
    row.lines.clear()
    proc = _start(row, *args)
    try:
        rc = proc.wait(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("the next run did not finish:\n" + "\n".join(row.lines[-40:]))
    time.sleep(0.2)  # the pump thread drains the last lines
    return rc, "\n".join(row.lines)


def _mlflow_runs(row: Row) -> list[tuple[str, str]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{row.tmp}/mlflow.db")
    exp = client.get_experiment_by_name("faults")
    if exp is None:
        return []
    return [(r.info.run_name, r.info.status) for r in client.search_runs([exp.experiment_id], max_results=1000)]


def _assert_store_complete(row: Row) -> None:
    """Every current build in the store verifies (each blob's size and sha256 against its manifest), and no
    partial file is left anywhere: not in the store, not in the work folder."""
    from enginefoundry.store.verify import open_build, verify_build

    pointers = sorted((row.store / "manifests").glob("*/*/current.json"))
    assert pointers, "the next run published nothing"
    for pointer in pointers:
        store, build = open_build(f"file://{pointer.parent}")
        report = verify_build(store, build, record=False)
        assert report.ok, f"{build.uri}: " + "; ".join(p.line() for p in report.problems)
    assert not list(row.tmp.glob("**/*.partial*")), "a partial file was left behind"


# Stages after which the killed run may already have published the unit (the kill lands after the write).
MAY_HAVE_PUBLISHED = {"publish", "register"}


@pytest.mark.parametrize("stage", list(STAGES))
def test_kill_9_at_stage_boundary(row: Row, stage: str) -> None:
    if stage == "bench":
        _with_benchmark(row)
    proc = _start(row)
    _wait_for_stage(row, proc, stage)
    os.kill(proc.pid, signal.SIGKILL)  # the CLI only: its children must follow by themselves
    proc.wait(timeout=30)
    _assert_no_orphans(row.marker)
    if stage not in MAY_HAVE_PUBLISHED:
        assert _manifests(row.store) == [], f"a unit was published although the run died at {stage}"
    rc, out = _run_to_end(row)
    assert rc == 0, out[-4000:]
    # Where the killed run had published, the next run is all hits: it records them in MLflow from a background
    # process of its own (noop_run.py) that outlives the CLI until it is done, seconds on a loaded host.
    _assert_no_orphans(row.marker, within_s=60 if stage in MAY_HAVE_PUBLISHED else 5)
    _assert_store_complete(row)
    statuses = _mlflow_runs(row)
    assert ("RUNNING" not in {s for _, s in statuses}), f"runs left RUNNING after the next run: {statuses}"


@pytest.mark.parametrize("moment", ["aiperf-measuring", "aiperf-starting"])
def test_sigterm_ends_runs_killed_and_leaves_nothing(row: Row, moment: str) -> None:
    """A cancelled run (SIGTERM, as Prefect and Kubernetes stop a process) while AIPerf measures, and as the
    stage forks AIPerf: the signal then used to land inside Python's at-fork hooks, where its exception was
    swallowed and left logging's lock held (the run went on with a dead server, or hung at exit; row 25,
    runner.signals_held)."""
    proc = _start(_with_benchmark(row))
    _wait_for_stage(row, proc, "bench")
    if moment == "aiperf-measuring":
        deadline = time.monotonic() + 60  # AIPerf itself is running: the cancel lands mid-measurement
        while time.monotonic() < deadline and not any("aiperf" in p for p in marked_processes(row.marker)):
            time.sleep(0.05)
    os.kill(proc.pid, signal.SIGTERM)
    try:
        rc = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("the cancelled run did not exit within 120 s:\n" + "\n".join(row.lines[-40:]))
    assert rc == 143, "\n".join(row.lines[-40:])
    _assert_no_orphans(row.marker)
    assert _manifests(row.store) == [], "a cancelled run published its unit"
    statuses = dict(_mlflow_runs(row))
    assert statuses and set(statuses.values()) == {"KILLED"}, statuses


def test_work_disk_full(row: Row) -> None:
    """EF_WORK_DIR on a 256 KiB tmpfs (smaller than the model): the run fails naming the disk, publishes
    nothing, leaves no process; on a disk with room the next run completes."""
    work = row.tmp / "work"
    work.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(work)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        rc, out = _run_to_end(row)
        assert rc != 0
        assert "No space left on device" in out or "disk is full" in out.lower(), out[-3000:]
        _assert_no_orphans(row.marker)
        assert _manifests(row.store) == []
        subprocess.run(["mount", "-o", "remount,size=256m", str(work)], check=True)
        rc, out = _run_to_end(row)
        assert rc == 0, out[-4000:]
        _assert_store_complete(row)
    finally:
        subprocess.run(["umount", "-l", str(work)], capture_output=True)


@pytest.fixture
def hostile_checkpoint(tmp_path: Path) -> Iterator[Path]:
    src = tmp_path / "ckpt"
    src.mkdir()
    for f in TINY_MODEL.iterdir():
        (src / f.name).write_bytes(f.read_bytes())
    (tmp_path / "outside.txt").write_text("secret")
    (src / "notes.txt").symlink_to(tmp_path / "outside.txt")
    yield src


def test_hostile_local_source_is_refused_before_anything_runs(row: Row, hostile_checkpoint: Path) -> None:
    spec = yaml.safe_load(row.spec.read_text())
    spec["model"]["source"] = str(hostile_checkpoint)
    row.spec.write_text(yaml.safe_dump(spec))
    rc, out = _run_to_end(row)
    assert rc == 2, out[-2000:]
    assert "symlinks pointing outside" in out and "notes.txt" in out
    assert "Traceback" not in out
    _assert_no_orphans(row.marker, within_s=5)
    assert not row.store.exists()


@pytest.mark.parametrize(("field_path", "value"), [
    (("model", "name"), "../../etc"),
    (("targets", 0, "name"), "cpu/../../x"),
    (("publish", "store"), "s3://bucket/../../x"),
    (("model", "source"), "s3://bucket/models/../../x"),
])
def test_hostile_spec_values_are_refused_at_validate_time(row: Row, field_path: tuple, value: str) -> None:
    spec = yaml.safe_load(row.spec.read_text())
    node = spec
    for part in field_path[:-1]:
        node = node[part]
    node[field_path[-1]] = value
    row.spec.write_text(yaml.safe_dump(spec))
    done = subprocess.run([sys.executable, "-m", "enginefoundry.cli", "validate", str(row.spec)], cwd=REPO,
                          env=row.env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert ".".join(str(p) for p in field_path) in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr


def _builds_by_key(store: Path) -> dict[str, list[str]]:
    """Unit build ids per key folder (converted checkpoints excluded)."""
    out: dict[str, list[str]] = {}
    for doc in _manifests(store):
        out.setdefault(doc.parent.name, []).append(doc.stem)
    return out


def _wait_all(procs: list[subprocess.Popen[str]], outputs: list[list[str]]) -> list[int]:
    codes = []
    for proc, lines in zip(procs, outputs, strict=True):
        try:
            codes.append(proc.wait(timeout=RUN_TIMEOUT_S))
        except subprocess.TimeoutExpired:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
            pytest.fail("a concurrent run did not finish:\n" + "\n".join(lines[-40:]))
    time.sleep(0.2)  # the pump threads drain the last lines
    return codes


def test_three_concurrent_runs_of_one_spec_build_each_unit_once(row: Row) -> None:
    """Three runs of one spec at once: one of them builds each unit under its lease; the others wait for it
    and take its build as a verified hit. All exit 0; one build per key; the store verifies."""
    outputs: list[list[str]] = [[], [], []]
    procs = [_start(row, lines=lines) for lines in outputs]
    codes = _wait_all(procs, outputs)
    for code, lines in zip(codes, outputs, strict=True):
        assert code == 0, "\n".join(lines[-60:])
    _assert_no_orphans(row.marker, within_s=5)
    builds = _builds_by_key(row.store)
    assert builds and all(len(ids) == 1 for ids in builds.values()), builds
    hits = [any("cache hit" in line for line in lines) for lines in outputs]  # the summary table's status
    assert sum(hits) == 2, "\n\n".join("\n".join(lines[-30:]) for lines in outputs)
    _assert_store_complete(row)
    statuses = _mlflow_runs(row)
    assert "RUNNING" not in {s for _, s in statuses}, statuses


def test_force_while_another_run_publishes_makes_a_second_build(row: Row) -> None:
    """`run --force` started while a normal run of the same spec is publishing: neither adopts the other's
    build; the key ends with two complete builds, both verifiable, and the forced one is current."""
    first_lines: list[str] = []
    first = _start(row, lines=first_lines)
    _wait_for_stage(row, first, "publish", lines=first_lines)
    forced_lines: list[str] = []
    forced = _start(row, "--force", lines=forced_lines)
    codes = _wait_all([first, forced], [first_lines, forced_lines])
    assert codes == [0, 0], "\n".join([*first_lines[-40:], "----", *forced_lines[-40:]])
    assert not any("adopted" in line for line in forced_lines), "\n".join(forced_lines[-40:])
    _assert_no_orphans(row.marker, within_s=5)
    builds = _builds_by_key(row.store)
    assert builds and all(len(ids) == 2 for ids in builds.values()), builds
    from enginefoundry.store.verify import open_build, verify_build

    for key_dir, ids in builds.items():
        folder = next(row.store.glob(f"manifests/*/{key_dir}"))
        for build_id in ids:  # the earlier build stays complete after the forced one moved the pointer
            store, build = open_build(f"file://{folder}/{build_id}.json")
            report = verify_build(store, build, record=False)
            assert report.ok, f"{build.uri}: " + "; ".join(p.line() for p in report.problems)
        current = json.loads((folder / "current.json").read_text())["build_id"]
        assert current == max(ids), (current, ids)  # build ids sort by time: the forced build is the later one
    _assert_store_complete(row)


@pytest.fixture
def mlflow_server(row: Row) -> Iterator[tuple[str, Callable[[], None], Callable[[], None]]]:
    """A real MLflow tracking server (SQLite backend, local artifacts) that the test can kill and restart on
    the same port and database."""
    from enginefoundry.model_server import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port),
            "--backend-store-uri", f"sqlite:///{row.tmp}/server.db",
            "--default-artifact-root", f"file://{row.tmp}/mlartifacts", "--workers", "1"]
    env = {k: v for k, v in row.env.items() if k != "EF_FAULT_MARK"}  # the server is not the run's process
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        import httpx

        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True))
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=2, trust_env=False).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert procs[-1].poll() is None, "the MLflow server exited at start"
            time.sleep(0.2)
        pytest.fail("the MLflow server did not answer /health within 180 s")

    def kill() -> None:
        os.killpg(procs[-1].pid, signal.SIGKILL)
        procs[-1].wait(timeout=30)

    start()
    try:
        yield url, kill, start
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)


def test_mlflow_down_during_registration_then_back(row: Row, mlflow_server) -> None:
    """The tracking server dies (SIGKILL) as the unit is recorded and registered: the unit, already published,
    stays published and complete; the run ends with a one-line error naming MLflow and the fix, no orphan. With
    the server back, the next run is a cache hit that registers the unit and sets its candidate alias."""
    url, kill, start = mlflow_server
    spec = yaml.safe_load(row.spec.read_text())
    spec["tracking"] = {"mlflow_uri": url, "experiment": "faults", "registered_model": "faults-tiny"}
    row.spec.write_text(yaml.safe_dump(spec))
    # MLflow's client retries an unreachable server 7 times with backoff factor 2 (minutes); one quick retry
    # keeps the row short (mlflow/environment_variables.py@3.x: MLFLOW_HTTP_REQUEST_MAX_RETRIES, _BACKOFF_FACTOR).
    row.env |= {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
    proc = _start(row)
    _wait_for_stage(row, proc, "register")
    kill()
    rc = proc.wait(timeout=RUN_TIMEOUT_S)
    time.sleep(0.2)
    out = "\n".join(row.lines)
    if rc != 0:  # the CLI's last word names MLflow and the fix (Prefect's own task log may hold a traceback)
        assert any(line.startswith("error: ") and "MLflow" in line for line in row.lines), out[-4000:]
    _assert_no_orphans(row.marker)
    assert _manifests(row.store), f"the unit was published before registration (rc {rc}):\n{out[-3000:]}"

    start()
    rc, out = _run_to_end(row)
    assert rc == 0, out[-4000:]
    _assert_store_complete(row)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(url)
    # An all-hits run records in MLflow from a background process (noop_run.py): poll for its registration.
    deadline = time.monotonic() + 180
    aliases: set[str] = set()
    while not any(alias.endswith("-candidate") for alias in aliases) and time.monotonic() < deadline:
        time.sleep(1)
        versions = client.search_model_versions("name = 'faults-tiny'")
        aliases = {alias for v in versions for alias in client.get_model_version(v.name, v.version).aliases}
    assert any(alias.endswith("-candidate") for alias in aliases), f"not registered: {aliases}\n{out[-3000:]}"
    _assert_no_orphans(row.marker, within_s=60)  # the background recorder exits once done
    exp = client.get_experiment_by_name("faults")
    assert exp is not None
    statuses = [r.info.status for r in client.search_runs([exp.experiment_id], max_results=1000)]
    assert "RUNNING" not in statuses, statuses
