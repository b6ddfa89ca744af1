"""A private stack (scripts/stack.py with its own state dir and ports) for the tests that exercise the stack
itself as a user starts it, rather than the one CI starts for the whole suite."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.support.paths import STACK_SCRIPT as STACK


@contextlib.contextmanager
def private_stack(state: Path, env: dict[str, str], steps: Sequence[tuple[str, str]],
                  timeout_s: float = 900) -> Iterator[dict[str, str]]:
    """`stack.py up` once per (services, worker pools) step, in order; yields `env` plus what the stack
    wrote (its env.json) and its PREFECT_HOME; `stack.py down` whatever happens."""
    try:
        for services, pools in steps:
            up = subprocess.run([sys.executable, str(STACK), "up", "--state-dir", str(state), "--services", services,
                                 "--worker-pools", pools], env=env, capture_output=True, text=True, timeout=timeout_s)
            assert up.returncode == 0, up.stdout + up.stderr
        yield {**env, **json.loads((state / "env.json").read_text()), "PREFECT_HOME": str(state / "prefect")}
    finally:
        subprocess.run([sys.executable, str(STACK), "down", "--state-dir", str(state)], capture_output=True,
                       timeout=300)
