"""`up`, `down`, `status`: plan what to start, start services in parallel, report, write the env files."""

from __future__ import annotations

import argparse
import functools
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from stacklib.envfiles import stack_env, write_env_files
from stacklib.hub import start_hub
from stacklib.mlflow_server import start_mlflow
from stacklib.net import DEFAULT_PORTS, HOST, free_port, port_is_free, service_port
from stacklib.postgres import describe as describe_postgres
from stacklib.postgres import start_postgres
from stacklib.postgres import stop_orphans as stop_postgres_orphans
from stacklib.prefect_server import start_prefect
from stacklib.s3 import start_s3
from stacklib.state import StackError, State, load_or_create_credentials
from stacklib.supervisor import (
    OWNER_WATCH,
    Context,
    Outcome,
    add_no_proxy,
    group_members,
    marked_processes,
    owned_members,
    stop_group,
    stop_stragglers,
    wait_for_exit,
    watch_owner,
)
from stacklib.workers import DEFAULT_POOL, WORKER_PREFIX, start_worker

SERVICES = ("s3", "postgres", "mlflow", "prefect", "hub")
# The servers that keep their state in the stack's PostgreSQL: asking for one brings the database up with it.
ON_POSTGRES = ("mlflow", "prefect")


def parse_list(raw: str | None) -> list[str]:
    return [item.strip() for item in (raw or "").split(",") if item.strip()]


def plan_up(state: State, services: list[str], pools: list[str] | None) -> tuple[list[str], list[str]]:
    """Validate the request against what already runs; returns (services, worker pools) to bring up."""
    unknown = sorted(set(services) - set(SERVICES))
    if unknown:
        raise StackError(f"unknown service(s) {', '.join(unknown)}; choose from {','.join(SERVICES)}")
    running = {name for name in SERVICES if owned_members(state, state.read_pid(name))}
    if any(s in services for s in ON_POSTGRES) and "postgres" not in services and "postgres" not in running:
        services = ["postgres", *services]
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
        if name == "postgres" and not os.environ.get("EF_POSTGRES_PORT"):
            # No fixed default (a system PostgreSQL may hold 5432, and every test stack has one): the port of the
            # last start while it is free, else one the kernel picks.
            ports[name] = recorded if isinstance(recorded, int) and port_is_free(recorded) else free_port()
            continue
        ports[name] = service_port(name)
        if name in services and not port_is_free(ports[name]):
            busy.append(f"port {ports[name]} for {name} is in use (set EF_{name.upper()}_PORT to another port)")
    if busy:
        raise StackError("; ".join(busy))
    return ports


def run_parallel(ctx: Context, services: list[str], pools: list[str]) -> tuple[list[Outcome], list[str]]:
    """Every service starts at once; prefect and mlflow wait for postgres (their databases must exist), mlflow for
    s3 too (its bucket must exist), workers for prefect."""
    starters = {"s3": start_s3, "postgres": start_postgres, "hub": start_hub}
    futures: dict[str, Future[Outcome]] = {}

    def after(dependencies: tuple[str, ...], name: str, fn: Callable[[], Outcome]) -> Outcome:
        for dependency in dependencies:
            if dependency in futures:
                try:
                    futures[dependency].result()
                except Exception:
                    raise StackError(f"{name}: skipped because {dependency} failed") from None
        return fn()

    with ThreadPoolExecutor(max_workers=max(1, len(services) + len(pools))) as pool_exec:
        for name in ("s3", "postgres", "hub"):
            if name in services:
                futures[name] = pool_exec.submit(starters[name], ctx)
        if "prefect" in services:
            futures["prefect"] = pool_exec.submit(after, ("postgres",), "prefect", lambda: start_prefect(ctx))
        if "mlflow" in services:
            futures["mlflow"] = pool_exec.submit(after, ("postgres", "s3"), "mlflow", lambda: start_mlflow(ctx))
        for pool in pools:
            futures[WORKER_PREFIX + pool] = pool_exec.submit(
                after, ("prefect",), WORKER_PREFIX + pool, functools.partial(start_worker, ctx, pool)
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
    if args.owner_pid is not None:
        watch_owner(state, args.owner_pid)
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
    names = [n for n in state.recorded_names() if n != OWNER_WATCH]
    watcher = state.read_pid(OWNER_WATCH)
    workers = [n for n in names if n.startswith(WORKER_PREFIX)]
    database = [n for n in names if n == "postgres"]
    others = [n for n in names if n not in workers and n not in database]
    all_stopped = True
    # Workers first: a worker whose server vanished did not exit within 15 s (facts §3.4). The database last, once
    # its clients (Prefect, MLflow) are gone, so its fast shutdown ends no open transaction.
    for group in (workers, others, database):
        if not group:
            continue
        with ThreadPoolExecutor(max_workers=max(1, len(group))) as pool_exec:
            for name, (stopped, detail) in zip(
                group, pool_exec.map(lambda n: stop_group(state, n), group), strict=True
            ):
                all_stopped &= stopped
                print(f"  {name:<14} {detail}", flush=True)
    if database:
        try:
            orphans = stop_postgres_orphans(state)  # PostgreSQL's children leave its process group (postgres.py)
        except StackError as err:
            all_stopped = False
            print(f"  {'postgres':<14} {err}", flush=True)
        else:
            if orphans:
                print(f"  {'postgres':<14} killed {len(orphans)} process(es) left of it: {orphans}", flush=True)
    # What the services left outside their groups (a worker's flow run, in a session of its own, and the model
    # servers it started): every process still carrying this state dir's marker, but the owner's watcher.
    stragglers = stop_stragglers(state, keep=set(group_members(watcher)) if watcher else set())
    if stragglers:
        print(f"  {'left over':<14} stopped {len(stragglers)} process(es) the services started outside their "
              f"groups: {stragglers}", flush=True)
        all_stopped &= not marked_processes(state, keep=set(group_members(watcher)) if watcher else set())
    # The owner's watcher goes last: a `down` by hand that is interrupted halfway (a second Ctrl-C, a CI runner's
    # kill of a cancelled test session) leaves it armed to stop the rest once its owner exits.
    if watcher is not None and watcher != os.getpid():
        stop_group(state, OWNER_WATCH)
    if watcher == os.getpid():
        state.pid_file(OWNER_WATCH).unlink(missing_ok=True)
    print(f"stack down in {time.monotonic() - started:.1f} s" if names else "stack down: nothing was running")
    return 0 if all_stopped else 1


def cmd_watch_owner(state: State, args: argparse.Namespace) -> int:
    """The detached watcher of `up --owner-pid`: waits for the owner to exit, then stops the stack."""
    wait_for_exit(args.owner_pid)
    print(f"owner {args.owner_pid} exited: stopping the stack", flush=True)
    return cmd_down(state, args)


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
        if name == "postgres":
            port = registry.get(name, {}).get("port")
            if running and isinstance(port, int):
                detail += f"  {describe_postgres(state, port)}"
            elif (state.root / "postgres").is_dir():
                detail += f"data {state.root / 'postgres'}"
        print(f"  {name:<14} {'running' if running else 'stopped':<8} {url:<24} {detail}")
    return 0


def main(argv: list[str] | None = None, description: str | None = None) -> int:
    parser = argparse.ArgumentParser(description=(description or __doc__).split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("up", "down", "status", "watch-owner"):
        cmd = sub.add_parser(name)
        cmd.add_argument("--state-dir", default=".stack", help="where pids, logs, data and env files live")
        if name in ("up", "watch-owner"):
            cmd.add_argument("--owner-pid", type=int, default=None, required=name == "watch-owner",
                             help="stop the stack when this process exits (a test session), however it exits")
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
    commands = {"up": cmd_up, "down": cmd_down, "status": cmd_status, "watch-owner": cmd_watch_owner}
    try:
        return commands[args.command](state, args)
    except StackError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"interrupted; what started keeps running: stack.py down --state-dir {args.state_dir}")
        return 130
