#!/usr/bin/env python3
"""Publish throughput and memory, and the cost of a cold vs an all-hits run. A benchmark, not a test.

    .venv/bin/python benchmarks/publish.py [--size-gib 2] [--skip-spec-runs]

It starts a private SeaweedFS (scripts/stack.py) unless EF_S3_ENDPOINT and credentials are set, writes a
synthetic artifact of the given size, and prints, each measured in its own child process so that peak
RSS belongs to that method alone:
  * reading the bytes from disk (plain, and with sha256 as publish does),
  * enginefoundry's S3Store.put_file (multipart, parallel, hashing in the same pass),
  * a plain boto3 upload_file of the same bytes (default TransferConfig),
then the wall time of a cold run and of a second (all cache hits) run of configs/tiny-cpu.yaml.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHILD = r"""
import hashlib, json, os, resource, sys, time
from pathlib import Path
method, path = sys.argv[1], Path(sys.argv[2])
size = path.stat().st_size
t0 = time.monotonic()
if method == "read":
    with path.open("rb") as f:
        while f.read(8 << 20):
            pass
elif method == "read+sha256":
    from enginefoundry.identity import sha256_file
    sha256_file(path)
elif method == "enginefoundry":
    from enginefoundry.store.backends import S3Store
    S3Store("s3://enginefoundry/bench-publish").put_file(path, f"ef/{path.name}")
elif method == "boto3":
    from enginefoundry.store.s3 import s3_client
    s3_client().upload_file(str(path), "enginefoundry", f"bench-publish/boto3/{path.name}")
wall = time.monotonic() - t0
print(json.dumps({"method": method, "wall_s": wall, "mib_s": size / 2**20 / wall,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def synthetic(path: Path, size: int) -> None:
    block = os.urandom(64 << 20)  # incompressible; repeated so writing 2 GiB stays quick
    with path.open("wb") as f:
        left = size
        while left > 0:
            f.write(block[: min(left, len(block))])
            left -= len(block)


def measure(method: str, path: Path, env: dict[str, str]) -> dict[str, float]:
    # Drop the page cache effect as far as an unprivileged run can: every method reads the same warm file.
    out = subprocess.run([sys.executable, "-c", CHILD, method, str(path)], env=env, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def spec_runs(tmp: Path) -> tuple[float, float]:
    env = {**os.environ, "EF_WORK_DIR": str(tmp / "work"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "enginefoundry.cli", "run", "configs/tiny-cpu.yaml",
           "--store", f"file://{tmp}/store", "--mlflow-uri", f"sqlite:///{tmp}/mlflow.db"]
    walls = []
    for _ in range(2):
        t0 = time.monotonic()
        subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True)
        walls.append(time.monotonic() - t0)
    return walls[0], walls[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gib", type=float, default=2.0)
    ap.add_argument("--skip-spec-runs", action="store_true")
    args = ap.parse_args()
    size = int(args.size_gib * 2**30)
    env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="ef-bench-") as tmpdir:
        tmp = Path(tmpdir)
        state = tmp / "stack"
        started = not env.get("EF_S3_ENDPOINT")
        if started:
            subprocess.run([sys.executable, str(REPO / "scripts" / "stack.py"), "up", "--state-dir", str(state),
                            "--services", "s3"], env={**env, "EF_S3_PORT": env.get("EF_S3_PORT", "18433")},
                           check=True, capture_output=True)
            env.update(json.loads((state / "env.json").read_text()))
        try:
            artifact = tmp / "artifact.bin"
            print(f"writing a {size / 2**30:.2f} GiB synthetic artifact …", flush=True)
            synthetic(artifact, size)
            rows = [measure(m, artifact, env) for m in ("read", "read+sha256", "enginefoundry", "boto3")]
            print(f"\n{'method':<16}{'wall s':>10}{'MiB/s':>10}{'peak RSS MiB':>15}")
            for r in rows:
                print(f"{r['method']:<16}{r['wall_s']:>10.1f}{r['mib_s']:>10.1f}{r['peak_rss_mib']:>15.0f}")
            ours, plain = rows[2], rows[3]
            print(f"\nenginefoundry vs boto3 upload_file: {ours['mib_s'] / plain['mib_s']:.2f}× throughput "
                  f"(and it also computes the sha256 the manifest needs)")
            artifact.unlink()
            if not args.skip_spec_runs:
                cold, warm = spec_runs(tmp)
                print(f"tiny spec: cold run {cold:.1f} s, second run (all hits) {warm:.1f} s")
        finally:
            if started:
                subprocess.run([sys.executable, str(REPO / "scripts" / "stack.py"), "down", "--state-dir",
                                str(state)], capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
