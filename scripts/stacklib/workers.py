"""One Prefect process worker per work pool; ready once the server has its heartbeat."""

from __future__ import annotations

import hashlib
import shlex
import subprocess
import time
from datetime import datetime

from stacklib.envfiles import STACK_STORE
from stacklib.net import http_json
from stacklib.prefect_server import prefect_env
from stacklib.state import StackError
from stacklib.supervisor import Context, Outcome, child_env, executable, launch, owned_members

DEFAULT_POOL = "cpu"


WORKER_PREFIX = "worker-"


def start_worker(ctx: Context, pool: str) -> Outcome:
    name = WORKER_PREFIX + pool
    started = time.monotonic()
    # Flow runs inherit the worker's environment (facts §3.4), so it gets the whole stack env, and the stack's
    # bucket as the store: a run started from the UI with default parameters publishes to SeaweedFS (EF_STORE
    # outranks the spec's store; enginefoundry.settings). The sourced .stack/env has the same (envfiles.py).
    store = {"EF_STORE": STACK_STORE} if "AWS_ENDPOINT_URL_S3" in ctx.stack_env else {}
    env = child_env(ctx.state, {**ctx.stack_env, **store, **prefect_env(ctx), "PREFECT_WORKER_QUERY_SECONDS": "2"})
    # A running worker heartbeats every 30 s, so any heartbeat proves it; a new one must show a fresh one
    # (its name is stable per state dir, so rows from earlier runs exist). 2 s of slack for clock rounding.
    since = 0.0 if owned_members(ctx.state, ctx.state.read_pid(name)) else time.time() - 2.0
    if since:
        create_work_pool(ctx, pool, env)
    worker_name = f"ef-{pool}-{hashlib.sha256(str(ctx.state.root).encode()).hexdigest()[:8]}"
    argv = [executable("prefect"), "--no-prompt", "worker", "start", "--pool", pool, "--name", worker_name]
    outcome = launch(ctx, name, lambda: argv, env, lambda: worker_heartbeat_since(ctx, pool, worker_name, since))
    outcome.url = f"pool {pool}"
    outcome.seconds = time.monotonic() - started  # includes the work-pool CLI call
    return outcome


def create_work_pool(ctx: Context, pool: str, env: dict[str, str]) -> None:
    argv = [executable("prefect"), "--no-prompt", "work-pool", "create", pool, "--type", "process"]
    result = subprocess.run(argv, env=env, cwd=ctx.state.root, capture_output=True, text=True, timeout=120)
    output = result.stdout + result.stderr
    with ctx.state.log_file(WORKER_PREFIX + pool).open("a") as log:
        log.write(f"\n=== {shlex.join(argv)} -> rc {result.returncode}\n{output}")
    if result.returncode != 0 and "already exists" not in output:
        raise StackError(f"work pool {pool}: `prefect work-pool create` failed (rc {result.returncode}):\n{output}")


def worker_heartbeat_since(ctx: Context, pool: str, worker_name: str, since: float) -> bool:
    """A worker counts as ready once the server has its heartbeat, i.e. it polls for runs."""
    url = f"{ctx.url('prefect')}/api/work_pools/{pool}/workers/filter"
    try:
        workers = http_json(url, "POST", {"limit": 200})
    except (OSError, ValueError):
        return False
    for worker in workers if isinstance(workers, list) else []:
        beat = worker.get("last_heartbeat_time")
        if worker.get("name") == worker_name and beat and datetime.fromisoformat(beat).timestamp() >= since:
            return True
    return False
