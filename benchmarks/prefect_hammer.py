#!/usr/bin/env python3
"""The concurrent-create hammer (issue 40): threads creating flow runs of one deployment at once against a Prefect
server, each run's state set as it is made (the writes a worker and a running flow make), through a plain HTTP
client that never sends a request again. It counts every answer. A benchmark, not a test.

    .venv/bin/python benchmarks/prefect_hammer.py [--against env|postgres|sqlite] [--threads 8] [--creates 10] [--json]

--against env (default): the server of PREFECT_API_URL (`source .stack/env` after `make stack`: PostgreSQL).
--against postgres: a private stack (scripts/stack.py up --services prefect, so its own PostgreSQL) in a temporary
  folder, stopped afterwards.
--against sqlite: a private `prefect server start` on its default SQLite database in a temporary PREFECT_HOME,
  stopped afterwards (what the stack ran before issue 40, and what Prefect's temporary server of `make demo` uses).

On SQLite, create_flow_run reads the deployment and writes the run in one deferred transaction, and a write
committed by another connection in between fails it with 503 (docs/facts/infra.md §3.7). Exit status 1 when any
answer was not a success or a created run is missing from the server's list (nothing may be lost).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
STACK = REPO / "scripts" / "stack.py"
PREFECT = str(Path(sys.executable).parent / "prefect")
READY_TIMEOUT_S = 240.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def clean_env() -> dict[str, str]:
    """The caller's environment less any Prefect setting (a profile, an API URL, a database URL)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")} | {
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "NO_PROXY": "127.0.0.1,localhost"}


def wait_healthy(api: str, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    with httpx.Client(trust_env=False, timeout=5) as http:
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise SystemExit(f"the Prefect server exited (rc {proc.returncode}) before it was ready")
            with contextlib.suppress(httpx.HTTPError):
                if http.get(f"{api}/health").status_code == 200:
                    return
            time.sleep(0.5)
    raise SystemExit(f"no healthy Prefect server at {api} after {READY_TIMEOUT_S:.0f} s")


@contextlib.contextmanager
def sqlite_server(root: Path) -> Iterator[str]:
    port = free_port()
    env = clean_env() | {"PREFECT_HOME": str(root / "prefect-home")}
    with (root / "prefect.log").open("wb") as log:
        proc = subprocess.Popen([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port),
                                 "--analytics-off"], env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    api = f"http://127.0.0.1:{port}/api"
    try:
        wait_healthy(api, proc)
        yield api
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=15)
                break
            except subprocess.TimeoutExpired:
                continue


@contextlib.contextmanager
def postgres_stack(root: Path) -> Iterator[str]:
    state = root / "stack"
    port = free_port()
    env = clean_env() | {"EF_PREFECT_PORT": str(port)}
    stack = [sys.executable, str(STACK)]
    try:
        up = subprocess.run([*stack, "up", "--state-dir", str(state), "--services", "prefect", "--worker-pools", "",
                             "--owner-pid", str(os.getpid())], env=env, capture_output=True, text=True)
        if up.returncode != 0:
            raise SystemExit(f"stack.py up failed:\n{up.stdout}{up.stderr}")
        yield f"http://127.0.0.1:{port}/api"
    finally:
        subprocess.run([*stack, "down", "--state-dir", str(state)], env=env, capture_output=True, text=True)


@dataclasses.dataclass
class Result:
    against: str
    api: str
    threads: int
    creates: int
    seconds: float
    create_answers: dict[str, int]  # HTTP status, or the transport error's name → count
    set_state_answers: dict[str, int]
    answered_503: int
    created: int  # creates answered 201
    listed: int  # runs of the deployment the server lists afterwards
    missing: int  # created but not listed
    unannounced: int  # listed but never answered 201 (a create that went through although its answer failed)

    @property
    def ok(self) -> bool:
        return (set(self.create_answers) <= {"201"} and set(self.set_state_answers) <= {"200", "201"}
                and not self.missing)


def hammer(against: str, api: str, threads: int, creates: int) -> Result:
    name = f"hammer-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=api, trust_env=False, timeout=60) as http:
        flow = http.post("/flows/", json={"name": name})
        flow.raise_for_status()
        made = http.post("/deployments/", json={"name": name, "flow_id": flow.json()["id"]})  # no pool: never runs
        made.raise_for_status()
    deployment_id = made.json()["id"]
    create_answers: collections.Counter[str] = collections.Counter()
    state_answers: collections.Counter[str] = collections.Counter()
    run_ids: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(threads + 1)

    def worker() -> None:
        with httpx.Client(base_url=api, trust_env=False, timeout=60) as http:
            start.wait()
            for _ in range(creates):
                try:
                    run = http.post(f"/deployments/{deployment_id}/create_flow_run", json={"parameters": {}})
                except httpx.HTTPError as err:
                    with lock:
                        create_answers[type(err).__name__] += 1
                    continue
                outcome = str(run.status_code)
                state = None
                if run.status_code == 201:
                    try:
                        answer = http.post(f"/flow_runs/{run.json()['id']}/set_state",
                                           json={"state": {"type": "PENDING"}})
                        state = str(answer.status_code)
                    except httpx.HTTPError as err:
                        state = type(err).__name__
                with lock:
                    create_answers[outcome] += 1
                    if state is not None:
                        state_answers[state] += 1
                    if run.status_code == 201:
                        run_ids.append(run.json()["id"])

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in pool:
        thread.start()
    start.wait()
    began = time.monotonic()
    for thread in pool:
        thread.join()
    seconds = time.monotonic() - began
    with httpx.Client(base_url=api, trust_env=False, timeout=60) as http:
        listed = http.post("/flow_runs/filter", json={"flow_runs": {"deployment_id": {"any_": [deployment_id]}}})
        listed.raise_for_status()
    on_server = {r["id"] for r in listed.json()}
    return Result(
        against=against, api=api, threads=threads, creates=threads * creates, seconds=round(seconds, 2),
        create_answers=dict(sorted(create_answers.items())), set_state_answers=dict(sorted(state_answers.items())),
        answered_503=create_answers["503"] + state_answers["503"], created=len(run_ids), listed=len(on_server),
        missing=len(set(run_ids) - on_server), unannounced=len(on_server - set(run_ids)),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", choices=("env", "postgres", "sqlite"), default="env")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--creates", type=int, default=10, help="creates per thread")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not (1 <= args.threads <= 64 and 1 <= args.creates <= 1000):
        parser.error("--threads 1..64, --creates 1..1000")
    root = Path(tempfile.mkdtemp(prefix="ef-hammer-"))
    try:
        if args.against == "env":
            api = os.environ.get("PREFECT_API_URL", "")
            if not api:
                parser.error("PREFECT_API_URL is not set: `source .stack/env`, or --against postgres|sqlite")
            server: contextlib.AbstractContextManager[str] = contextlib.nullcontext(api.rstrip("/"))
        else:
            server = postgres_stack(root) if args.against == "postgres" else sqlite_server(root)
        with server as url:
            wait_healthy(url)
            result = hammer(args.against, url, args.threads, args.creates)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(dataclasses.asdict(result), indent=2))
    else:
        print(f"{result.against}: {result.threads} threads, {result.creates} creates in {result.seconds} s; "
              f"create answers {result.create_answers}, set_state answers {result.set_state_answers}; "
              f"503 answers: {result.answered_503}; created {result.created}, listed {result.listed}, "
              f"missing {result.missing}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
