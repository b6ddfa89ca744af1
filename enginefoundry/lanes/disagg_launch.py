"""Start one disaggregated replica (lane trtllm): every context and generation worker, then the router.

Copied into a disaggregated unit's bundle as `disagg_launch.py` (enginefoundry.lanes.trtllm_disagg.bundle_files) and
run there by the smoke and benchmark stages and by the published serve.sh, so it imports the standard library only:
the serving image has TensorRT-LLM and Python, not enginefoundry.

    python disagg_launch.py --checkpoint DIR --host HOST --port PORT [--serve trtllm-serve] [--timeout S]

It reads `disagg.json` beside itself (the router's config and each worker's role, YAML and GPU ids), starts each
worker as NVIDIA's example does (`CUDA_VISIBLE_DEVICES=<its GPUs> trtllm-serve <checkpoint> --host --port
--extra_llm_api_options <role>.yaml`; examples/disaggregated/README.md), each on a free port with its log
`<role>-<n>.log` in the working folder, waits until every worker's /health answers 200, writes the router's config
with those urls and HOST:PORT as `disagg_config.yaml` in the working folder, and runs `trtllm-serve disaggregated
--config_file` on it; the router's own /health answers 200 once it is ready for requests
(tensorrt_llm/serve/openai_disagg_server.py@3e53e4adfea6e24674eaec876c3009551cb25134 `health`). Where
CUDA_VISIBLE_DEVICES is already set, a worker's GPU ids index that list.

Every process it starts stays in its process group, so stopping the group (the pipeline's server stop, Ctrl-C in a
shell) stops them all; each also dies with it (Linux PDEATHSIG). When any of them exits, it stops the rest and exits
with that code; a worker that exits before it is healthy is reported with its log's tail.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

PLAN = "disagg.json"
ROUTER_CONFIG = "disagg_config.yaml"
_MAX_PLAN_BYTES = 1 << 20
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class WorkerPlan:
    role: str  # context | generation
    config: str  # its LLM-API YAML, a file beside the plan
    gpus: list[int]


def read_plan(folder: Path) -> tuple[dict[str, object], list[WorkerPlan]]:
    """The launch plan beside the launcher: the router's config and the workers, checked for the shape this launcher
    starts (a file name beside the plan, GPU ids)."""
    path = folder / PLAN
    if path.stat().st_size > _MAX_PLAN_BYTES:
        raise SystemExit(f"{path}: larger than {_MAX_PLAN_BYTES} bytes: not a launch plan")
    plan = json.loads(path.read_text())
    router = plan.get("router") if isinstance(plan, dict) else None
    workers = plan.get("workers") if isinstance(plan, dict) else None
    if not isinstance(router, dict) or not isinstance(workers, list) or not workers:
        raise SystemExit(f"{path}: needs `router` (the router's config) and `workers` (a list): rebuild the unit")
    out = []
    for w in workers:
        config = w.get("config") if isinstance(w, dict) else None
        gpus = w.get("gpus") if isinstance(w, dict) else None
        if (not isinstance(w, dict) or w.get("role") not in ("context", "generation")
                or not isinstance(config, str) or "/" in config or config.startswith(".")
                or not isinstance(gpus, list) or not all(isinstance(g, int) and 0 <= g < 4096 for g in gpus)):
            raise SystemExit(f"{path}: a worker needs role context|generation, a config file name beside the plan "
                             f"and GPU ids: {w!r}")
        out.append(WorkerPlan(role=str(w["role"]), config=config, gpus=list(gpus)))
    return dict(router), out


def router_config(router: dict[str, object], host: str, port: int,
                  urls: list[tuple[str, str]]) -> dict[str, object]:
    """The router's config for this start: the plan's, with HOST:PORT and each role's workers' urls."""
    config = dict(router)
    config["hostname"], config["port"] = host, port
    for role, key in (("context", "context_servers"), ("generation", "generation_servers")):
        mine = [u for r, u in urls if r == role]
        given = config.get(key)
        config[key] = {**(given if isinstance(given, dict) else {}), "num_instances": len(mine), "urls": mine}
    return config


def gpu_env(ids: list[int]) -> str:
    """CUDA_VISIBLE_DEVICES for a worker's GPU ids: indices into the one already set, else the ids themselves."""
    visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible:
        if max(ids, default=-1) >= len(visible):
            raise SystemExit(f"the worker's GPUs {ids} are not all among CUDA_VISIBLE_DEVICES={','.join(visible)}")
        return ",".join(visible[i] for i in ids)
    return ",".join(str(i) for i in ids)


def _tail(path: Path, lines: int = 30) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + 10
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        if proc.poll() is None:
            proc.kill()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--serve", default="trtllm-serve", help="the trtllm-serve command")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds for every worker to be healthy")
    args = ap.parse_args(argv)
    here = Path(__file__).resolve().parent
    router, workers = read_plan(here)
    procs: list[subprocess.Popen[bytes]] = []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        urls, logs = [], []
        counts: dict[str, int] = {}
        for w in workers:
            role, port = w.role, free_port(args.host)
            n = counts[role] = counts.get(role, -1) + 1
            log = Path(f"{role}-{n}.log")
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu_env(w.gpus)}
            cmd = [args.serve, args.checkpoint, "--host", args.host, "--port", str(port),
                   "--extra_llm_api_options", str(here / w.config)]
            with log.open("wb") as out:
                procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                              env=env, preexec_fn=_die_with_parent))
            print(f"disagg: {role} worker {n} pid {procs[-1].pid} on {args.host}:{port}, GPUs "
                  f"{env['CUDA_VISIBLE_DEVICES']}: {' '.join(cmd)} (log {log.resolve()})", flush=True)
            urls.append((role, f"{args.host}:{port}"))
            logs.append(log)
        deadline = time.monotonic() + args.timeout
        waiting = list(range(len(procs)))
        while waiting:
            for i in list(waiting):
                if procs[i].poll() is not None:
                    print(f"disagg: {urls[i][0]} worker at {urls[i][1]} exited with code {procs[i].returncode} "
                          f"before it was healthy; {logs[i]}:\n{_tail(logs[i])}", file=sys.stderr, flush=True)
                    return procs[i].returncode or 1
                if _healthy(f"http://{urls[i][1]}/health"):
                    waiting.remove(i)
            if waiting and time.monotonic() > deadline:
                print(f"disagg: workers {[urls[i][1] for i in waiting]} not healthy within {args.timeout:.0f} s",
                      file=sys.stderr, flush=True)
                return 1
            time.sleep(0.5)
        config = Path(ROUTER_CONFIG)
        config.write_text(json.dumps(router_config(router, args.host, args.port, urls), indent=1) + "\n")  # JSON: YAML
        cmd = [args.serve, "disaggregated", "--config_file", str(config.resolve())]
        print(f"disagg: every worker healthy; router on {args.host}:{args.port}: {' '.join(cmd)}", flush=True)
        procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent))
        while True:
            for proc in procs:
                if proc.poll() is not None:
                    print(f"disagg: {proc.args!r} exited with code {proc.returncode}: stopping the replica",
                          file=sys.stderr, flush=True)
                    return proc.returncode or 1
            time.sleep(0.5)
    finally:
        _stop(procs)


if __name__ == "__main__":
    sys.exit(main())
