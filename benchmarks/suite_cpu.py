#!/usr/bin/env python3
"""Where a command's CPU time goes, by kind of process: run it (e.g. `make test` or `bash .ci/run`), sample
every process under /proc twice a second, and print the CPU-seconds of each kind (model servers, CLI runs,
Prefect servers, AIPerf, …) against the host's busy CPU-seconds from /proc/stat over the same window.
A benchmark, not a test (issue 12: the suite under 8 minutes needs its CPU work halved; this says which).

    .venv/bin/python benchmarks/suite_cpu.py [--json] -- make test

Linux only. Each process is counted from when the sampler first saw it (processes already running count from
the start); one that lives less than half a second may be missed, so the table prints its coverage: the
sampled sum against /proc/stat's busy time (which includes the kernel and everything else on the host).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")
INTERVAL_S = 0.5


@dataclass
class Seen:
    argv: list[str]
    first_ticks: int
    last_ticks: int


def busy_ticks() -> int:
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4]  # all but idle and iowait


def read_argv(pid: str) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part for part in raw.decode(errors="replace").split("\0") if part][:8]


def sample(seen: dict[str, Seen], first_round: bool) -> None:
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        ticks, started = int(fields[11]) + int(fields[12]), fields[19]  # utime + stime, start time
        key = f"{pid}:{started}"
        entry = seen.get(key)
        if entry is None:
            seen[key] = Seen(read_argv(pid), ticks if first_round else 0, ticks)
        else:
            entry.last_ticks = ticks
            if not entry.argv:  # sampled between fork and exec
                entry.argv = read_argv(pid)


def kind(argv: list[str]) -> str:
    """A short name for what the process is, from its command line."""
    if not argv:
        return "(no command line: kernel threads, exited)"
    exe = Path(argv[0]).name
    args = argv[1:]
    if exe.startswith("python") and args:
        if args[0] == "-m" and len(args) > 1:
            module = args[1]
            if module.startswith("enginefoundry"):
                return f"enginefoundry {args[2] if len(args) > 2 else ''}".strip()
            if module == "uvicorn" and any("prefect" in a for a in args):
                return "prefect temporary API server"
            return f"python -m {module}"
        if args[0] in ("-c", "-u"):
            return "python -c (pytest-xdist workers, test helpers)"
        exe, args = Path(args[0]).name, args[1:]
    if exe in ("enginefoundry", "transformers", "prefect", "mlflow") and args:
        return f"{exe} {' '.join(args[:2]) if exe == 'prefect' else args[0]}"
    if exe.startswith("aiperf") or exe == "aiperf":
        return "aiperf (all its processes)"
    if exe.startswith(("chrom", "playwright")):
        return "chromium"
    return exe


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the command to run after --, e.g. -- make test")
    seen: dict[str, Seen] = {}
    busy0, t0 = busy_ticks(), time.monotonic()
    sample(seen, first_round=True)
    proc = subprocess.Popen(command)
    while proc.poll() is None:
        time.sleep(INTERVAL_S)
        sample(seen, first_round=False)
    wall, busy = time.monotonic() - t0, (busy_ticks() - busy0) / HZ
    by_kind: dict[str, list[float]] = {}
    for entry in seen.values():
        cpu = (entry.last_ticks - entry.first_ticks) / HZ
        if cpu > 0:
            row = by_kind.setdefault(kind(entry.argv), [0.0, 0])
            row[0] += cpu
            row[1] += 1
    sampled = sum(cpu for cpu, _ in by_kind.values())
    rows = sorted(by_kind.items(), key=lambda item: -item[1][0])
    if args.json:
        print(json.dumps({"exit_code": proc.returncode, "wall_s": round(wall, 1), "busy_cpu_s": round(busy, 1),
                          "cores": os.cpu_count(), "sampled_cpu_s": round(sampled, 1),
                          "by_kind": {k: {"cpu_s": round(c, 1), "processes": n} for k, (c, n) in rows}}, indent=2))
    else:
        cores = os.cpu_count() or 1
        print(f"\nwall {wall:.0f} s; busy CPU {busy:.0f} s of {wall * cores:.0f} on {cores} cores "
              f"({100 * busy / (wall * cores):.0f}%); sampled {sampled:.0f} s ({100 * sampled / busy:.0f}% of busy)")
        print(f"{'CPU s':>8} {'share':>6} {'procs':>6}  kind")
        for name, (cpu, count) in rows[:25]:
            print(f"{cpu:8.1f} {100 * cpu / busy:5.1f}% {count:6d}  {name}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
