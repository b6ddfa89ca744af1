"""The stack's PostgreSQL (scripts/stacklib/postgres.py) as `stack.py` starts it, in a temp state dir: a cluster made
on the first `up`, each server's role and database, passwords on no command line, `status` naming the release and
the databases, the data kept across `down` and `up`, and nothing left running after `down`. Crash-safe: a
`kill -9` of the server and its children, with a postmaster.pid naming a live process that is no server (a
recycled PID), and an initdb cut short, are all handled by the next `up` unaided."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.paths import STACK_SCRIPT
from tests.support.private_stack import stack_database

psycopg = pytest.importorskip("psycopg", reason="the `server` extra (psycopg[binary]) is not installed")

pytestmark = pytest.mark.services


def _stack(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(STACK_SCRIPT), *args, "--state-dir", str(state)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "EF_POSTGRES"))}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)


def _up(state: Path) -> None:
    up = _stack(state, "up", "--services", "postgres", "--owner-pid", str(os.getpid()))
    assert up.returncode == 0, up.stdout + up.stderr


def _serving(state: Path) -> list[int]:
    """Live (not zombie) processes whose working folder is the stack's data directory: the postmaster and each of
    its children (PostgreSQL chdirs there; its children leave the postmaster's process group)."""
    data = (state / "postgres").resolve()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cwd = Path(os.readlink(entry / "cwd"))
        except OSError:
            continue
        if cwd == data and stat[stat.rfind(")") + 2] not in "ZX":
            found.append(int(entry.name))
    return found


def _command_lines() -> str:
    lines = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                lines.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                continue
    return "\n".join(lines)


def test_up_roles_status_data_kept_and_down(tmp_path: Path) -> None:
    state = tmp_path / "stack"
    try:
        _up(state)
        assert (state / "postgres" / "PG_VERSION").is_file() and not (state / "postgres.init").exists()
        assert oct((state / "postgres.env").stat().st_mode & 0o777) == "0o600"
        passwords = [line.split("=", 1)[1] for line in (state / "postgres.env").read_text().splitlines()]
        assert len(passwords) == 3 and not any(p in _command_lines() for p in passwords)

        with stack_database(state, "prefect") as prefect:
            assert prefect.execute("SELECT current_user, current_database()").fetchone() == ("prefect", "prefect")
            # Prefect's migrations need pg_trgm (https://docs.prefect.io/v3/concepts/server).
            assert prefect.execute("SELECT extname FROM pg_extension WHERE extname = 'pg_trgm'").fetchone()
        with stack_database(state, "mlflow") as mlflow:
            mlflow.execute("CREATE TABLE kept (note text)")
            mlflow.execute("INSERT INTO kept VALUES ('across down and up')")
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            stack_database(state, "mlflow", password="not-the-password")
        # One server's role cannot write into the other's database.
        with (stack_database(state, "mlflow", dbname="prefect") as other,
              pytest.raises(psycopg.errors.InsufficientPrivilege)):
            other.execute("CREATE TABLE intruder (i int)")

        status = _stack(state, "status")
        line = next(row for row in status.stdout.splitlines() if row.strip().startswith("postgres"))
        assert "running" in line and "PostgreSQL 1" in line and "mlflow " in line and "prefect " in line, line

        down = _stack(state, "down")
        assert down.returncode == 0, down.stdout + down.stderr
        assert not _serving(state) and not (state / "pids" / "postgres.pid").exists()

        _up(state)  # the same cluster again: no new initdb, the data is there
        with stack_database(state, "mlflow") as mlflow:
            assert mlflow.execute("SELECT note FROM kept").fetchall() == [("across down and up",)]
    finally:
        down = _stack(state, "down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert not _serving(state), _serving(state)


def _long_query(state: Path) -> None:
    with contextlib.suppress(psycopg.Error), stack_database(state, "prefect") as prefect:
        prefect.execute("SELECT count(*) FROM generate_series(1, 10000000000)")


def _active_query(state: Path) -> bool:
    with stack_database(state, "ef") as admin:
        found = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%generate_series(1, 1000%'"
                              " AND state = 'active' AND pid <> pg_backend_pid()").fetchone()
    return bool(found and found[0])


def test_killed_server_stale_lock_and_cut_initdb_are_handled_by_the_next_up(tmp_path: Path) -> None:
    state = tmp_path / "stack"
    # What an initdb cut short leaves: a half-made scratch cluster, never taken for the real one.
    (state / "postgres.init" / "base").mkdir(parents=True)
    (state / "postgres.init" / "PG_VERSION").write_text("15\n")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        _up(state)
        assert not (state / "postgres.init").exists()

        # The postmaster alone, killed while a backend computes: its children leave its process group, and a
        # backend busy in a query does not notice its death; left running, it holds the shared memory that makes
        # the next start refuse. The next `up` ends it.
        busy = threading.Thread(target=_long_query, args=(state,), daemon=True)
        busy.start()
        deadline = time.monotonic() + 60
        while not _active_query(state) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _active_query(state)
        postmaster = int((state / "pids" / "postgres.pid").read_text())
        os.kill(postmaster, signal.SIGKILL)
        _up(state)
        busy.join(timeout=60)
        with stack_database(state, "prefect") as prefect:
            assert prefect.execute("SELECT 1").fetchone() == (1,)

        # The whole server killed (-9), and the PID its postmaster.pid names recycled by a live process.
        for pid in _serving(state):
            with contextlib.suppress(ProcessLookupError):  # one may exit on its own meanwhile
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while _serving(state) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _serving(state)
        lock = state / "postgres" / "postmaster.pid"
        lines = lock.read_text().splitlines()
        lock.write_text("\n".join([str(sleeper.pid), *lines[1:]]) + "\n")
        _up(state)
        with stack_database(state, "mlflow") as mlflow:
            assert mlflow.execute("SELECT current_user").fetchone() == ("mlflow",)
        assert sleeper.poll() is None  # the process that held the recycled PID is left alone
    finally:
        sleeper.kill()
        down = _stack(state, "down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert not _serving(state), _serving(state)
