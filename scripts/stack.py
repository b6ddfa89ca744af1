#!/usr/bin/env python3
"""Start, stop and inspect a local loopback stack of real services for tests, CI and the cluster-mode demo.

    python scripts/stack.py up [--state-dir .stack] [--services s3,mlflow,prefect,hub] [--worker-pools cpu]
    python scripts/stack.py down [--state-dir .stack]
    python scripts/stack.py status [--state-dir .stack]

Services: SeaweedFS (`weed mini`) as S3, an MLflow server with its artifacts in S3, a Prefect server
(with UI) plus one process worker per pool, and the test Hugging Face hub (tests/services/hub_server.py).
All bind to 127.0.0.1. Each service runs detached in its own process group, logs to
<state>/logs/<name>.log and has its PID in <state>/pids/<name>.pid. `up` writes <state>/env (sourceable)
and <state>/env.json for clients.

Run it with the project's venv python: the service binaries are looked up next to that interpreter.
Only the standard library and boto3 (imported lazily, for the buckets) are used.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import re
import secrets
import shlex
import shutil
import signal
import socket
import string
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, MutableMapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
HUB_SCRIPT = REPO_ROOT / "tests" / "services" / "hub_server.py"
HOST = "127.0.0.1"
REGION = "us-east-1"
BUCKETS = ("enginefoundry", "mlflow")
STACK_STORE = "s3://enginefoundry/store"  # the workers' EF_STORE
SERVICES = ("s3", "mlflow", "prefect", "hub")
DEFAULT_PORTS = {"s3": 8333, "mlflow": 5000, "prefect": 4200, "hub": 8765}
DEFAULT_POOL = "cpu"
WORKER_PREFIX = "worker-"
# How long a service may take to answer its health check (a busy CI machine needs more).
READY_TIMEOUT_S = float(os.environ.get("EF_STACK_READY_TIMEOUT_S", 60.0))
# Marker put into every child's environment; `down`/`status` only touch processes that carry the marker for
# this state dir, so a recycled PID never gets a signal from us.
MARKER_ENV = "EF_STACK_DIR"
# weed mini opens these HTTP listeners besides S3 (facts §1.2), each with a gRPC twin at port + 10000. They
# are picked once per state dir and persisted, so a second stack (e.g. the pytest one) never collides with the
# dev stack on 9333/8888/9340/23646 (8888 is also Jupyter's default). The twins keep the +10000 default on
# purpose: mini's maintenance worker dials admin.port + 10000 even when -admin.port.grpc says otherwise
# (4.48, seen in the log), so the range keeps every twin below the kernel's ephemeral ports (32768+).
WEED_HTTP_PORTS = ("master.port", "filer.port", "volume.port", "admin.port")
WEED_GRPC_OFFSET = 10000
WEED_PORT_RANGE = range(10000, 22768)
# Seconds to wait after each signal. weed needs ~4 s for a clean stop after TERM and ignores a second signal
# meanwhile (measured), so it gets a longer window before KILL; everything else gets ~2 s steps (facts §3.4).
STOP_STEPS: dict[str, tuple[tuple[signal.Signals, float], ...]] = {
    "default": ((signal.SIGTERM, 2.0), (signal.SIGINT, 2.0), (signal.SIGKILL, 2.0)),
    "s3": ((signal.SIGTERM, 2.0), (signal.SIGINT, 8.0), (signal.SIGKILL, 2.0)),
}


class StackError(Exception):
    """A failure that is reported as one line (plus an optional log tail) and makes the command exit 1."""


# --------------------------------------------------------------------------------------------- state dir


@dataclass(frozen=True)
class State:
    root: Path

    @property
    def pids(self) -> Path:
        return self.root / "pids"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def pid_file(self, name: str) -> Path:
        return self.pids / f"{name}.pid"

    def log_file(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def prepare(self) -> None:
        for sub in (self.pids, self.logs, self.root / "s3", self.root / "prefect", self.root / "hub"):
            sub.mkdir(parents=True, exist_ok=True)

    def read_pid(self, name: str) -> int | None:
        try:
            return int(self.pid_file(name).read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def recorded_names(self) -> list[str]:
        return sorted(p.stem for p in self.pids.glob("*.pid")) if self.pids.is_dir() else []

    def load_registry(self) -> dict[str, dict[str, object]]:
        """Ports/URLs of the services ever started here, so `status` and `env` know them without flags."""
        try:
            return json.loads((self.root / "stack.json").read_text())
        except FileNotFoundError:
            return {}

    def save_registry(self, registry: dict[str, dict[str, object]]) -> None:
        write_private(self.root / "stack.json", json.dumps(registry, indent=2, sort_keys=True) + "\n")


def write_private(path: Path, text: str) -> None:
    """Write atomically with 0600 perms: these files hold the S3 secret."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(tmp, 0o600)  # O_CREAT's mode is ignored when the tmp file already existed
    os.replace(tmp, path)


def load_or_create_credentials(state: State) -> dict[str, str]:
    """The S3 admin pair; created once per state dir and reused, because weed's data outlives one `up`."""
    path = state.root / "credentials.env"
    if not path.exists():
        alphabet = string.ascii_letters + string.digits  # no symbols: safe unquoted in env files and URLs
        key = "EF" + "".join(secrets.choice(string.ascii_uppercase + string.digits) for _ in range(18))
        secret = "".join(secrets.choice(alphabet) for _ in range(40))
        write_private(path, f"AWS_ACCESS_KEY_ID={key}\nAWS_SECRET_ACCESS_KEY={secret}\n")
    os.chmod(path, 0o600)
    creds = dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    if not creds.get("AWS_ACCESS_KEY_ID") or not creds.get("AWS_SECRET_ACCESS_KEY"):
        raise StackError(f"{path} lacks AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY; delete it to regenerate")
    return {k: creds[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}


# --------------------------------------------------------------------------------------------- processes


def executable(name: str) -> str:
    """Console scripts of the venv live next to its interpreter (unresolved: the venv python is a symlink)."""
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if not found:
        raise StackError(f"'{name}' not found next to {sys.executable} nor on PATH; run with the project's venv")
    return found


def add_no_proxy(env: MutableMapping[str, str]) -> None:
    """An http_proxy from the environment would otherwise get the loopback traffic (urllib, botocore)."""
    for key in ("NO_PROXY", "no_proxy"):
        items = [i for i in env.get(key, "").split(",") if i]
        env[key] = ",".join(items + [h for h in ("127.0.0.1", "localhost") if h not in items])


def child_env(state: State, extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    # A stray session token or profile from the caller's shell would be signed into requests and break auth.
    for key in ("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE"):
        env.pop(key, None)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env[MARKER_ENV] = str(state.root)
    add_no_proxy(env)
    env.update(extra)
    return env


def spawn(state: State, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start detached: own session (so its process group is ours to signal and Ctrl-C in the terminal that ran
    `up` does not reach it), output appended to the service log, PID recorded."""
    log = state.log_file(name).open("ab")
    log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(argv)}\n".encode())
    log.flush()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=state.root,
        start_new_session=True,
    )
    log.close()  # the child holds its own copy of the descriptor
    state.pid_file(name).write_text(f"{proc.pid}\n")
    return proc


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, process group) from /proc/<pid>/stat; comm may hold spaces and parens: split at the last
    ')'."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    return fields[0], int(fields[2])


def group_members(pgid: int) -> list[int]:
    """Live processes in the group; a zombie whose parent never reaps it must not count as alive."""
    if not Path("/proc/self/stat").exists():  # no procfs (macOS): best effort through signal 0
        try:
            os.killpg(pgid, 0)
            return [pgid]
        except (ProcessLookupError, PermissionError):
            return []
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _proc_stat(int(entry.name))
            if stat and stat[1] == pgid and (stat[0] not in ("Z", "X") or _threads_left(entry)):
                members.append(int(entry.name))
    return members


def _threads_left(proc_dir: Path) -> bool:
    """A multi-threaded process (weed, uvicorn) shows 'Z' as soon as its main thread is gone, while the other
    threads still hold its sockets; only a single-threaded zombie is really finished."""
    try:
        return sum(1 for _ in (proc_dir / "task").iterdir()) > 1
    except OSError:
        return False


def carries_marker(pid: int, state: State) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except FileNotFoundError:
        return not Path("/proc/self/environ").exists()  # no procfs: cannot tell, trust the pid file
    except (ProcessLookupError, PermissionError):
        return False
    return f"{MARKER_ENV}={state.root}".encode() in environ.split(b"\0")


def owned_members(state: State, pgid: int | None) -> list[int]:
    """Members of the recorded group that we started; empty means stopped (or the PID was recycled)."""
    if pgid is None:
        return []
    members = group_members(pgid)
    return members if any(carries_marker(pid, state) for pid in members) else []


def stop_group(state: State, name: str) -> tuple[bool, str]:
    """TERM -> INT -> KILL to the whole process group, waiting between steps. The pid file goes once nothing
    of ours is left, and stays (so a later `down` retries) if even KILL did not work."""
    pgid = state.read_pid(name)
    started = time.monotonic()
    if not owned_members(state, pgid):
        state.pid_file(name).unlink(missing_ok=True)
        return True, "not running"
    assert pgid is not None
    for sig, wait_s in STOP_STEPS.get(name, STOP_STEPS["default"]):
        with contextlib.suppress(ProcessLookupError):  # the group may vanish between check and signal
            os.killpg(pgid, sig)
        if wait_until(lambda: not group_members(pgid), wait_s):
            state.pid_file(name).unlink(missing_ok=True)
            return True, f"stopped by {sig.name} in {time.monotonic() - started:.1f} s"
    return False, f"STILL RUNNING after SIGKILL: pids {group_members(pgid)}"


def wait_until(check: Callable[[], bool], timeout_s: float, interval_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


def log_tail(state: State, name: str, lines: int = 30) -> str:
    try:
        text = state.log_file(name).read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no log)"
    return "\n".join("    | " + line for line in text[-lines:])


# --------------------------------------------------------------------------------------------- network


# Loopback only, so never through a proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_status(url: str, method: str = "GET", body: bytes | None = None, timeout_s: float = 2.0) -> int | None:
    """The HTTP status of any answer (4xx/5xx included), or None when nothing answered."""
    request = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": "application/json"})
    try:
        with _OPENER.open(request, timeout=timeout_s) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code
    except (OSError, urllib.error.URLError):
        return None


def http_json(url: str, method: str = "GET", payload: object = None, timeout_s: float = 2.0) -> object:
    body = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": "application/json"})
    with _OPENER.open(request, timeout=timeout_s) as response:
        return json.loads(response.read())


def port_is_free(port: int) -> bool:
    # SO_REUSEADDR so a socket in TIME_WAIT from a just-stopped stack does not count as busy; a listener does.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def service_port(name: str) -> int:
    raw = os.environ.get(f"EF_{name.upper()}_PORT", "")
    port = int(raw) if raw.isdigit() else DEFAULT_PORTS[name] if not raw else -1
    if not 0 < port < 65536:
        raise StackError(f"EF_{name.upper()}_PORT={raw!r} is not a port number")
    return port


def weed_internal_ports(state: State, avoid: set[int]) -> dict[str, int]:
    """HTTP ports for weed's internal servers plus an explicit S3 gRPC port (the S3 port itself may be high
    enough that its +10000 twin does not exist); reused from the last start while still free."""
    path = state.root / "s3-internal-ports.json"
    names = (*WEED_HTTP_PORTS, "s3.port.grpc")
    try:
        ports: dict[str, int] = json.loads(path.read_text())
        if set(ports) == set(names) and all(weed_pair_free(p, avoid) for p in ports.values()):
            return ports
    except FileNotFoundError:
        pass
    chosen: list[int] = []
    taken = set(avoid)
    for port in random.sample(WEED_PORT_RANGE, len(WEED_PORT_RANGE)):
        if weed_pair_free(port, taken):
            chosen.append(port)
            taken |= {port, port + WEED_GRPC_OFFSET}
            if len(chosen) == len(names):
                break
    else:
        raise StackError(f"s3: no free port pairs (p, p+{WEED_GRPC_OFFSET}) left in {WEED_PORT_RANGE}")
    ports = dict(zip(names, chosen, strict=True))
    path.write_text(json.dumps(ports, indent=2) + "\n")
    return ports


def weed_pair_free(port: int, avoid: set[int]) -> bool:
    pair = (port, port + WEED_GRPC_OFFSET)
    return not avoid.intersection(pair) and all(port_is_free(p) for p in pair)


# --------------------------------------------------------------------------------------------- services


@dataclass
class Outcome:
    name: str
    url: str
    seconds: float
    pid: int | None
    note: str


@dataclass
class Context:
    state: State
    ports: dict[str, int]
    creds: dict[str, str]
    stack_env: dict[str, str]  # what <state>/env will hold; workers export it to their flow runs
    abort: threading.Event

    def url(self, name: str) -> str:
        return f"http://{HOST}:{self.ports[name]}"


def launch(
    ctx: Context, name: str, command: Callable[[], list[str]], env: dict[str, str], ready: Callable[[], bool]
) -> Outcome:
    """Start one service (unless it already runs from this state dir) and wait for its readiness probe.
    `command` is only evaluated when a process is spawned (weed's port choice must not rerun while it runs).
    """
    started = time.monotonic()
    pid = ctx.state.read_pid(name)
    if owned_members(ctx.state, pid):
        alive: Callable[[], bool] = lambda: bool(owned_members(ctx.state, pid))  # noqa: E731
        note = "already running"
    else:
        proc = spawn(ctx.state, name, command(), env)
        pid = proc.pid
        alive = lambda: proc.poll() is None  # noqa: E731
        note = "started"
    deadline = started + READY_TIMEOUT_S
    while not ready():
        if ctx.abort.is_set():
            raise StackError(f"{name}: aborted")
        if not alive():
            raise StackError(
                f"{name} exited before it was ready; log {ctx.state.log_file(name)}:\n" + log_tail(ctx.state, name)
            )
        if time.monotonic() > deadline:
            raise StackError(
                f"{name} not ready after {READY_TIMEOUT_S:.0f} s; log {ctx.state.log_file(name)}:\n"
                + log_tail(ctx.state, name)
            )
        time.sleep(0.2)
    return Outcome(name, ctx.url(name) if name in ctx.ports else "", time.monotonic() - started, pid, note)


def start_s3(ctx: Context) -> Outcome:
    # The pair in weed's environment becomes its only identity; without it the S3 API is open (facts §1.2).
    env = child_env(ctx.state, ctx.creds)
    outcome = launch(ctx, "s3", lambda: weed_argv(ctx), env, lambda: http_status(ctx.url("s3") + "/") is not None)
    check_s3_auth(ctx)
    create_buckets(ctx)
    return outcome


def weed_argv(ctx: Context) -> list[str]:
    avoid = {p + d for p in ctx.ports.values() for d in (0, WEED_GRPC_OFFSET)}
    internal = weed_internal_ports(ctx.state, avoid)
    # Every port flag is explicit: weed mini reloads flags of earlier starts from <dir>/mini.options for any
    # flag left out, so an omitted one would silently come back with an old (maybe now taken) port.
    ports = [f"-{flag}={port}" for flag, port in internal.items()]
    ports += [f"-{flag}.grpc={internal[flag] + WEED_GRPC_OFFSET}" for flag in WEED_HTTP_PORTS]
    return [
        executable("weed"),
        "mini",
        f"-dir={ctx.state.root / 's3'}",
        f"-ip={HOST}",
        f"-ip.bind={HOST}",
        "-master.telemetry=false",
        "-admin.ui=false",
        "-webdav=false",
        f"-s3.port={ctx.ports['s3']}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        *ports,
    ]


def check_s3_auth(ctx: Context) -> None:
    """Guard against the credential trap: an unsigned ListBuckets must be refused."""
    status = http_status(ctx.url("s3") + "/")
    if status != 403:
        raise StackError(
            f"s3 answered an unsigned request with HTTP {status} (expected 403): the credentials "
            "were not applied and the store is open; run `down` and check the s3 log"
        )


def create_buckets(ctx: Context) -> None:
    import boto3  # lazy: boto3 costs ~0.5 s to import and only `up` with s3 needs it
    from botocore.config import Config
    from botocore.exceptions import ClientError, EndpointConnectionError

    client = boto3.client(
        "s3",
        endpoint_url=ctx.url("s3"),
        region_name=REGION,
        aws_access_key_id=ctx.creds["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=ctx.creds["AWS_SECRET_ACCESS_KEY"],
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}),
    )
    deadline = time.monotonic() + READY_TIMEOUT_S
    for bucket in BUCKETS:
        # The S3 port answers a moment before the filer behind it accepts writes, hence the retry loop.
        while True:
            try:
                client.create_bucket(Bucket=bucket)
                break
            except ClientError as err:
                if err.response["Error"]["Code"] in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    break
                if time.monotonic() > deadline:
                    raise StackError(f"s3: cannot create bucket {bucket}: {err}") from err
            except EndpointConnectionError as err:
                if time.monotonic() > deadline:
                    raise StackError(f"s3: cannot create bucket {bucket}: {err}") from err
            time.sleep(0.3)


def start_mlflow(ctx: Context) -> Outcome:
    argv = [
        executable("mlflow"),
        "server",
        "--host",
        HOST,
        "--port",
        str(ctx.ports["mlflow"]),
        "--workers",
        "1",
        "--backend-store-uri",
        f"sqlite:///{ctx.state.root / 'mlflow.db'}",
        "--artifacts-destination",
        "s3://mlflow/artifacts",
    ]
    env = child_env(
        ctx.state,
        {
            **ctx.creds,
            "AWS_DEFAULT_REGION": REGION,
            "MLFLOW_S3_ENDPOINT_URL": ctx.url("s3"),
            # The huey job runner is a second ~270 MB process and doubles start time; nothing here uses it.
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        },
    )
    return launch(ctx, "mlflow", lambda: argv, env, lambda: http_status(ctx.url("mlflow") + "/health") == 200)


def prefect_env(ctx: Context) -> dict[str, str]:
    """Shared by the server, the CLI and the workers: a private PREFECT_HOME keeps ~/.prefect profiles (which
    may point at Prefect Cloud) out of the picture."""
    return {
        "PREFECT_HOME": str(ctx.state.root / "prefect"),
        "PREFECT_API_URL": ctx.url("prefect") + "/api",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }


def start_prefect(ctx: Context) -> Outcome:
    argv = [
        executable("prefect"),
        "server",
        "start",
        "--host",
        HOST,
        "--port",
        str(ctx.ports["prefect"]),
        "--analytics-off",
    ]
    env = child_env(ctx.state, {**prefect_env(ctx), "PREFECT_SERVER_UI_ENABLED": "true"})
    return launch(ctx, "prefect", lambda: argv, env, lambda: http_status(ctx.url("prefect") + "/api/health") == 200)


def start_hub(ctx: Context) -> Outcome:
    if not HUB_SCRIPT.exists():
        raise StackError(f"hub: {HUB_SCRIPT.relative_to(REPO_ROOT)} does not exist")
    argv = [
        sys.executable,
        str(HUB_SCRIPT),
        "--root",
        str(ctx.state.root / "hub"),
        "--host",
        HOST,
        "--port",
        str(ctx.ports["hub"]),
    ]
    return launch(
        ctx,
        "hub",
        lambda: argv,
        child_env(ctx.state, {}),
        lambda: http_status(ctx.url("hub") + "/") is not None,
    )


def start_worker(ctx: Context, pool: str) -> Outcome:
    name = WORKER_PREFIX + pool
    started = time.monotonic()
    # Flow runs inherit the worker's environment (facts §3.4), so it gets the whole stack env, and the stack's
    # bucket as the store: a run started from the UI with default parameters publishes to SeaweedFS (EF_STORE
    # outranks the spec's store; enginefoundry.settings). Only workers get it: the CLI and tests keep their own.
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


# --------------------------------------------------------------------------------------------- env files


def stack_env(state: State, ports: dict[str, int], creds: dict[str, str], names: Iterable[str]) -> dict[str, str]:
    """Client settings for the given services, in a stable, readable order."""
    names = set(names)
    url = {name: f"http://{HOST}:{port}" for name, port in ports.items()}
    env: dict[str, str] = {}
    if "s3" in names:
        env |= {
            **creds,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ENDPOINT_URL_S3": url["s3"],
            "EF_S3_ENDPOINT": url["s3"],
        }
    if "mlflow" in names:
        env |= {"MLFLOW_S3_ENDPOINT_URL": url["s3"], "MLFLOW_TRACKING_URI": url["mlflow"]}
    if "prefect" in names:
        env |= {
            "PREFECT_API_URL": url["prefect"] + "/api",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_WORKER_QUERY_SECONDS": "2",
        }
    if "hub" in names:
        env |= {"HF_ENDPOINT": url["hub"], "EF_HUB_ROOT": str(state.root / "hub"), "HF_HUB_DISABLE_XET": "1"}
    return env


def write_env_files(state: State, env: dict[str, str]) -> None:
    lines = [f"# written by scripts/stack.py up; source it: . {state.root}/env"]
    lines += [f"export {key}={shlex.quote(value)}" for key, value in env.items()]
    write_private(state.root / "env", "\n".join(lines) + "\n")
    write_private(state.root / "env.json", json.dumps(env, indent=2) + "\n")


# --------------------------------------------------------------------------------------------- commands


def parse_list(raw: str | None) -> list[str]:
    return [item.strip() for item in (raw or "").split(",") if item.strip()]


def plan_up(state: State, services: list[str], pools: list[str] | None) -> tuple[list[str], list[str]]:
    """Validate the request against what already runs; returns (services, worker pools) to bring up."""
    unknown = sorted(set(services) - set(SERVICES))
    if unknown:
        raise StackError(f"unknown service(s) {', '.join(unknown)}; choose from {','.join(SERVICES)}")
    running = {name for name in SERVICES if owned_members(state, state.read_pid(name))}
    if "mlflow" in services and "s3" not in services and "s3" not in running:
        raise StackError("mlflow stores its artifacts in s3: add s3 to --services (or start it first)")
    if pools is None:  # the default pool comes with a Prefect server we start, not with every `up`
        pools = [DEFAULT_POOL] if "prefect" in services else []
    if pools and "prefect" not in services and "prefect" not in running:
        raise StackError("workers need prefect: add prefect to --services (or start it first)")
    bad = [p for p in pools if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", p)]
    if bad:
        raise StackError(f"invalid work pool name(s): {', '.join(bad)}")
    return services, pools


def resolve_ports(state: State, services: list[str]) -> dict[str, int]:
    """Ports of running services come from the registry (they may predate an EF_*_PORT change); the others
    from EF_<NAME>_PORT or the defaults, and must be free."""
    registry = state.load_registry()
    ports: dict[str, int] = {}
    busy: list[str] = []
    for name in SERVICES:
        recorded = registry.get(name, {}).get("port")
        if isinstance(recorded, int) and owned_members(state, state.read_pid(name)):
            ports[name] = recorded
            continue
        ports[name] = service_port(name)
        if name in services and not port_is_free(ports[name]):
            busy.append(f"port {ports[name]} for {name} is in use (set EF_{name.upper()}_PORT to another port)")
    if busy:
        raise StackError("; ".join(busy))
    return ports


def run_parallel(ctx: Context, services: list[str], pools: list[str]) -> tuple[list[Outcome], list[str]]:
    """Every service starts at once; mlflow waits for s3 (its bucket must exist), workers for prefect."""
    starters = {"s3": start_s3, "mlflow": start_mlflow, "prefect": start_prefect, "hub": start_hub}
    futures: dict[str, Future[Outcome]] = {}

    def after(dependency: str, name: str, fn: Callable[[], Outcome]) -> Outcome:
        if dependency in futures:
            try:
                futures[dependency].result()
            except Exception:
                raise StackError(f"{name}: skipped because {dependency} failed") from None
        return fn()

    with ThreadPoolExecutor(max_workers=max(1, len(services) + len(pools))) as pool_exec:
        for name in ("s3", "prefect", "hub"):
            if name in services:
                futures[name] = pool_exec.submit(starters[name], ctx)
        if "mlflow" in services:
            futures["mlflow"] = pool_exec.submit(after, "s3", "mlflow", lambda: start_mlflow(ctx))
        for pool in pools:
            futures[WORKER_PREFIX + pool] = pool_exec.submit(
                after, "prefect", WORKER_PREFIX + pool, lambda pool=pool: start_worker(ctx, pool)
            )
        try:
            return collect(futures)
        except KeyboardInterrupt:
            ctx.abort.set()  # lets the waiting threads return; started processes stay up (`down` stops them)
            raise


def collect(futures: dict[str, Future[Outcome]]) -> tuple[list[Outcome], list[str]]:
    """Print each service as soon as it is ready, in completion order."""
    outcomes: list[Outcome] = []
    errors: list[str] = []
    pending = dict(futures)
    while pending:
        for name, future in list(pending.items()):
            if not future.done():
                continue
            del pending[name]
            try:
                outcome = future.result()
            except StackError as err:
                errors.append(str(err))
                print(f"  {name:<14} FAILED  {err}", flush=True)
                continue
            outcomes.append(outcome)
            pid = f"pid {outcome.pid}" if outcome.pid else ""
            print(
                f"  {name:<14} {outcome.note:<16} {outcome.url:<24} {outcome.seconds:5.1f} s  {pid}",
                flush=True,
            )
        time.sleep(0.05)
    return outcomes, errors


def cmd_up(state: State, args: argparse.Namespace) -> int:
    started = time.monotonic()
    state.prepare()
    pools_arg = None if args.worker_pools is None else parse_list(args.worker_pools)
    services, pools = plan_up(state, parse_list(args.services), pools_arg)
    ports = resolve_ports(state, services)
    creds = load_or_create_credentials(state)
    running = [n for n in SERVICES if n not in services and owned_members(state, state.read_pid(n))]
    ctx = Context(state, ports, creds, stack_env(state, ports, creds, [*services, *running]), threading.Event())
    print(f"starting in {state.root}: {', '.join(services + [WORKER_PREFIX + p for p in pools]) or 'nothing'}")
    outcomes, errors = run_parallel(ctx, services, pools)

    registry = state.load_registry()
    for outcome in outcomes:
        registry[outcome.name] = {
            "url": outcome.url,
            **({"port": ports[outcome.name]} if outcome.name in ports else {}),
        }
    state.save_registry(registry)
    alive = [n for n in SERVICES if owned_members(state, state.read_pid(n))]
    write_env_files(state, stack_env(state, ports, creds, alive))
    elapsed = time.monotonic() - started
    if errors:
        print(f"stack up FAILED after {elapsed:.1f} s ({len(errors)} error(s)); `down` stops what did start")
        return 1
    print(
        f"stack up in {elapsed:.1f} s; prefect UI {ctx.url('prefect')} | env: . {state.root / 'env'}"
        if "prefect" in alive
        else f"stack up in {elapsed:.1f} s | env: . {state.root / 'env'}"
    )
    return 0


def cmd_down(state: State, _args: argparse.Namespace) -> int:
    started = time.monotonic()
    names = state.recorded_names()
    workers = [n for n in names if n.startswith(WORKER_PREFIX)]
    others = [n for n in names if n not in workers]
    all_stopped = True
    # Workers first: a worker whose server vanished did not exit within 15 s (facts §3.4).
    for group in (workers, others):
        with ThreadPoolExecutor(max_workers=max(1, len(group))) as pool_exec:
            for name, (stopped, detail) in zip(
                group, pool_exec.map(lambda n: stop_group(state, n), group), strict=True
            ):
                all_stopped &= stopped
                print(f"  {name:<14} {detail}", flush=True)
    print(f"stack down in {time.monotonic() - started:.1f} s" if names else "stack down: nothing was running")
    return 0 if all_stopped else 1


def cmd_status(state: State, _args: argparse.Namespace) -> int:
    registry = state.load_registry()
    workers = sorted({n for n in [*registry, *state.recorded_names()] if n.startswith(WORKER_PREFIX)})
    for name in [*SERVICES, *workers]:
        pid = state.read_pid(name)
        running = bool(owned_members(state, pid))
        url = str(registry.get(name, {}).get("url", "")) or (
            f"http://{HOST}:{service_port(name)}" if name in DEFAULT_PORTS else ""
        )
        detail = f"pid {pid}" if running else ""
        print(f"  {name:<14} {'running' if running else 'stopped':<8} {url:<24} {detail}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("up", "down", "status"):
        cmd = sub.add_parser(name)
        cmd.add_argument("--state-dir", default=".stack", help="where pids, logs, data and env files live")
        if name == "up":
            cmd.add_argument("--services", default=",".join(SERVICES), help="comma-separated subset of %(default)s")
            cmd.add_argument(
                "--worker-pools",
                default=None,
                help=f"comma-separated Prefect process pools to run a worker for (default: "
                f"{DEFAULT_POOL} when prefect is in --services; '' for none)",
            )
    args = parser.parse_args(argv)
    # Absolute, so the marker in the children's env and the paths in env files do not depend on the cwd.
    state = State(Path(args.state_dir).resolve())
    add_no_proxy(os.environ)  # for our own probes through boto3
    commands = {"up": cmd_up, "down": cmd_down, "status": cmd_status}
    try:
        return commands[args.command](state, args)
    except StackError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"interrupted; what started keeps running: stack.py down --state-dir {args.state_dir}")
        return 130


if __name__ == "__main__":
    sys.exit(main())
