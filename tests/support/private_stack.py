"""A private stack (scripts/stack.py with its own state dir and ports) for the tests that exercise the stack
itself as a user starts it, rather than the one CI starts for the whole suite."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.support.paths import STACK_SCRIPT as STACK


@contextlib.contextmanager
def private_stack(state: Path, env: dict[str, str], steps: Sequence[tuple[str, str]],
                  timeout_s: float = 900) -> Iterator[dict[str, str]]:
    """`stack.py up` once per (services, worker pools) step, in order; yields `env` plus what the stack
    wrote (its env.json) and its PREFECT_HOME; `stack.py down` whatever happens. Owned by this process
    (`--owner-pid`): a session killed before its teardown leaves nothing either."""
    try:
        for services, pools in steps:
            up = subprocess.run([sys.executable, str(STACK), "up", "--state-dir", str(state), "--services", services,
                                 "--worker-pools", pools, "--owner-pid", str(os.getpid())],
                                env=env, capture_output=True, text=True, timeout=timeout_s)
            assert up.returncode == 0, up.stdout + up.stderr
        yield {**env, **json.loads((state / "env.json").read_text()), "PREFECT_HOME": str(state / "prefect")}
    finally:
        stack_down(state, env)


def stack_down(state: Path, env: dict[str, str] | None = None, timeout_s: float = 300) -> None:
    """`stack.py down`, detached: in a session of its own, so the signal that cancels a test session (a second
    Ctrl-C, a CI runner's group signal) does not cut it halfway; and never killed here: if this process is
    interrupted while waiting, the `down` goes on by itself (and the owner watch, stopped last, stays armed
    until it is done)."""
    down = subprocess.Popen([sys.executable, str(STACK), "down", "--state-dir", str(state)], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    down.wait(timeout=timeout_s)


def stack_database(state: Path, role: str, password: str | None = None,
                   dbname: str | None = None):  # -> psycopg.Connection (imported here: the `server` extra)
    """A connection to a stack's PostgreSQL (scripts/stacklib/postgres.py) as `role` (`prefect`, `mlflow` or the
    admin `ef`) on its database (or `dbname`), with the password the stack keeps in <state>/postgres.env unless
    one is given."""
    import psycopg

    passwords = dict(line.split("=", 1) for line in (state / "postgres.env").read_text().splitlines() if "=" in line)
    port = json.loads((state / "stack.json").read_text())["postgres"]["port"]
    dbname = dbname or (role if role != "ef" else "postgres")
    return psycopg.connect(host="127.0.0.1", port=port, user=role, dbname=dbname,
                           password=passwords[role] if password is None else password, connect_timeout=10,
                           autocommit=True)
