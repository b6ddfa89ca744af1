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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.support.paths import REPO, TINY_MODEL, TINY_PROMPTS

pytestmark = pytest.mark.e2e

RUN_TIMEOUT_S = 900
# The stage boundaries, as the run's own log announces them (first line of each stage).
STAGES = {
    "fetch": r"Beginning flow run 'build ",
    "convert": r"convert: \S+ with lane",
    "build": r"build: \S+ on \S+$",
    "serve": r"serve: .* starting",
    "smoke": r"smoke: (reference answers \S+ from|computing \d+ reference answers)",
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
    spec = yaml.safe_load((REPO / "configs" / "tiny-cpu.yaml").read_text())
    spec["model"]["source"] = str(TINY_MODEL)
    spec["smoke"]["prompts"] = str(TINY_PROMPTS)
    spec["benchmark"].update({"concurrency": [1], "request_count": 8, "warmup_request_count": 1})
    spec["publish"] = {"store": f"file://{tmp}/store"}
    spec["tracking"] = {"mlflow_uri": f"sqlite:///{tmp}/mlflow.db", "experiment": "faults"}
    path = tmp / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture
def row(tmp_path: Path, unique: str) -> Row:
    marker = f"fault-{unique}"
    env = {**os.environ, "EF_FAULT_MARK": marker, "EF_WORK_DIR": str(tmp_path / "work"),
           "EF_CACHE_DIR": str(tmp_path / "cache"), "PREFECT_HOME": str(tmp_path / "prefect"),
           "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1",
           # A loaded CI host starts the temporary Prefect server slowly; its default wait is 20 s.
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "300"}
    return Row(tmp=tmp_path, marker=marker, spec=_write_spec(tmp_path), env=env)


def _start(row: Row, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-m", "enginefoundry.cli", "run", str(row.spec), *args], cwd=REPO,
                            env=row.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            row.lines.append(line.rstrip("\n"))

    threading.Thread(target=pump, daemon=True).start()
    return proc


def _wait_for_stage(row: Row, proc: subprocess.Popen[str], stage: str, timeout_s: float = RUN_TIMEOUT_S) -> None:
    pattern = re.compile(STAGES[stage])
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(pattern.search(line) for line in list(row.lines)):
            return
        if proc.poll() is not None:
            pytest.fail(f"the run ended (rc {proc.returncode}) before stage {stage}:\n" + "\n".join(row.lines[-40:]))
        time.sleep(0.05)
    pytest.fail(f"stage {stage} not reached in {timeout_s:.0f}s:\n" + "\n".join(row.lines[-40:]))


def marked_processes(marker: str) -> list[str]:
    """Live (not zombie) processes whose environment carries the marker: 'pid cmdline' each."""
    needle = f"EF_FAULT_MARK={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:160]
        except (OSError, IndexError):
            continue
        if state != "Z":
            found.append(f"{entry.name} {cmd}")
    return found


def _assert_no_orphans(marker: str, within_s: float = 20.0) -> None:
    deadline = time.monotonic() + within_s
    left = marked_processes(marker)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
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
    from enginefoundry.verify import open_build, verify_build

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
    proc = _start(row)
    _wait_for_stage(row, proc, stage)
    os.kill(proc.pid, signal.SIGKILL)  # the CLI only: its children must follow by themselves
    proc.wait(timeout=30)
    _assert_no_orphans(row.marker)
    if stage not in MAY_HAVE_PUBLISHED:
        assert _manifests(row.store) == [], f"a unit was published although the run died at {stage}"
    rc, out = _run_to_end(row)
    assert rc == 0, out[-4000:]
    _assert_no_orphans(row.marker, within_s=5)
    _assert_store_complete(row)
    statuses = _mlflow_runs(row)
    assert ("RUNNING" not in {s for _, s in statuses}), f"runs left RUNNING after the next run: {statuses}"


def test_sigterm_ends_runs_killed_and_leaves_nothing(row: Row) -> None:
    """A cancelled run (SIGTERM, as Prefect and Kubernetes stop a process) during the benchmark."""
    proc = _start(row)
    _wait_for_stage(row, proc, "bench")
    deadline = time.monotonic() + 60  # AIPerf itself is running: the cancel lands mid-measurement
    while time.monotonic() < deadline and not any("aiperf" in p for p in marked_processes(row.marker)):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGTERM)
    rc = proc.wait(timeout=120)
    assert rc != 0
    _assert_no_orphans(row.marker)
    assert _manifests(row.store) == []
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
