#!/usr/bin/env python3
"""Download, here, the wheels the pipeline needs on a GPU host without a package index (the device tool's lent
machine): the reference lane, the smoke gate, the benchmark (AIPerf), Prefect's embedded API, the MLflow client.

    python scripts/gpu_bundle.py [--out .gpu-bundle] [--python-version 3.12] [--limit-mib 56]

What goes in: the project's runtime requirements with the `reference` and `bench` extras (pyproject.toml), at the
versions tested here (this venv's `pip freeze` as constraints), resolved for CPython <python-version> on manylinux
x86-64, less
  * what the host already has at a version every requirer accepts (docs/facts/gpu-host-packages.txt, `pip freeze`
    as read on the lent host; PyTorch and its CUDA libraries always come from the host), and
  * what the lane and the benchmark do not import there (NOT_NEEDED below, each with its reason; the packages
    reachable only through them go too).
The wheels land in --out/wheels/; what travels is --out/site.tar.xz, their contents unpacked as `pip install --target`
lays them out and compressed as one xz stream (a third smaller than the wheels' own per-file deflate), and
--out/bundle.json (name, version, file, size, sha256 of each wheel; what was left out and why). It prints the wheels
by size, both totals, and exits 1 when the archive is over --limit-mib (the device tool carries 64 MiB with the
working tree). On the host, scripts/gpu_install.py unpacks it and writes the console scripts for the host's Python.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
HOST_PACKAGES = REPO / "docs" / "facts" / "gpu-host-packages.txt"
EXTRAS = ("reference", "bench")
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35)] + ["manylinux2014_x86_64",
                                                                                 "manylinux1_x86_64"]

# Always the host's: the CUDA build of PyTorch and what it brings (a CPU wheel from here would replace it).
HOST_ONLY = {"torch", "triton"}
HOST_ONLY_PATTERN = re.compile(r"^(nvidia-.*-cu\d+|cuda-.*)$")  # nvidia-cublas-cu12 …, cuda-bindings: not nvidia-ml-py

# The host's release is used although the project pins another: what the dry run showed to work with it. The lane
# records the version it ran in every manifest (the reference lane's `transformers` version).
HOST_ACCEPTED: dict[str, str] = {
    "transformers": "the reference lane and `transformers serve` ran the whole DAG with the host's 5.17.0 in the dry "
                    "run; carrying 5.24.0 costs 13 MiB of the 64",
    "psutil": "AIPerf pins psutil~=7.0.0; the pipeline's and AIPerf's calls ran with the host's 7.x in the dry run",
    "pillow": "AIPerf pins pillow~=12.3 for image inputs (not used); matplotlib's PNG output ran with the host's",
}

# Not imported by the reference lane, the gate or the benchmark on the GPU host. Each was left out of the dry run
# that ran the whole DAG in a venv holding only the host's packages and this bundle (docs/scale.md, GPU run).
NOT_NEEDED: dict[str, str] = {
    "boto3": "the run uses a file:// store; enginefoundry.store.s3 imports boto3 only for s3:// URIs",
    "pyarrow": "AIPerf's public-dataset loaders (via datasets); the benchmark's prompts are synthetic",
    "datasets": "AIPerf's public-dataset loaders; the benchmark's prompts are synthetic",
    "dash": "AIPerf's dashboard UI, not run by `aiperf profile`",
    "dash-bootstrap-components": "AIPerf's dashboard UI",
    "plotly": "AIPerf's plot exports, not asked for (the pipeline plots with matplotlib)",
    "kaleido": "AIPerf's plot image exports, not asked for",
    "seaborn": "AIPerf's plot exports, not asked for",
    "kopf": "AIPerf's Kubernetes operator mode",
    "kubernetes-asyncio": "AIPerf's Kubernetes mode",
    "optuna": "AIPerf's parameter search, not run by `aiperf profile`",
    "soundfile": "AIPerf's audio inputs; the benchmark is text only",
    "docker": "Prefect's Docker work pools; the embedded default runs in-process",
    "apprise": "Prefect's notification blocks, not used",
    "pandas": "imported by MLflow and AIPerf only for features the run does not use",
    "zstandard": "optional zstd decoding in urllib3/httpx; nothing here sends zstd",
    "brotli": "optional brotli compression (starlette-compress, urllib3); loopback traffic is not compressed",
    "textual": "AIPerf's terminal dashboard; the bench stage runs it with --ui-type none",
    "contourpy": "matplotlib's contour plots; the pipeline draws lines and points",
    "httptools": "uvicorn's optional C HTTP parser; h11 is used without it",
    "watchfiles": "uvicorn's --reload, not used",
}


@dataclass
class Node:
    name: str
    version: str
    requires: list[str] = field(default_factory=list)


def roots() -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in EXTRAS:
        reqs += project["optional-dependencies"][extra]
    return [r for r in reqs if canonicalize_name(Requirement(r).name) not in HOST_ONLY]


def constraints(path: Path) -> None:
    """This venv's versions, so the bundle holds what the tests here ran against."""
    frozen = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"], check=True,
                            capture_output=True, text=True).stdout.splitlines()
    keep = [line for line in frozen if "==" in line and not _host_only(line.split("==")[0])]
    path.write_text("\n".join(keep) + "\n")


def _host_only(name: str) -> bool:
    n = canonicalize_name(name)
    return n in HOST_ONLY or HOST_ONLY_PATTERN.match(n) is not None


def target_args(python_version: str) -> list[str]:
    args = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp"]
    for platform in PLATFORMS:
        args += ["--platform", platform]
    return args


def resolve(python_version: str, tmp: Path) -> dict[str, Node]:
    cons = tmp / "constraints.txt"
    constraints(cons)
    report = tmp / "report.json"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed",
                    "--report", str(report), "--target", str(tmp / "never"), "-c", str(cons),
                    *target_args(python_version), *roots()], check=True)
    nodes: dict[str, Node] = {}
    for item in json.loads(report.read_text())["install"]:
        meta = item["metadata"]
        nodes[canonicalize_name(meta["name"])] = Node(meta["name"], meta["version"], meta.get("requires_dist") or [])
    return nodes


def marker_env(python_version: str) -> dict[str, str]:
    env: dict[str, str] = {k: str(v) for k, v in default_environment().items()}
    env.update({"python_version": python_version, "python_full_version": python_version + ".0",
                "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
                "os_name": "posix", "implementation_name": "cpython", "platform_python_implementation": "CPython"})
    return env


def walk(nodes: dict[str, Node], root_reqs: list[str],
         python_version: str) -> tuple[set[str], dict[str, list[Requirement]]]:
    """The names reachable from the roots without passing through NOT_NEEDED, and every requirement on each."""
    env = marker_env(python_version)
    seen: set[str] = set()
    wanted: dict[str, list[Requirement]] = {}
    stack = [Requirement(r) for r in root_reqs]
    extras_seen: dict[str, set[str]] = {}
    while stack:
        req = stack.pop()
        name = canonicalize_name(req.name)
        if name in NOT_NEEDED or name not in nodes:
            continue
        wanted.setdefault(name, []).append(req)
        new_extras = set(req.extras) - extras_seen.setdefault(name, set())
        if name in seen and not new_extras:
            continue
        seen.add(name)
        extras_seen[name] |= set(req.extras)
        for spec in nodes[name].requires:
            child = Requirement(spec)
            active = ["", *sorted(extras_seen[name])]
            if child.marker is None or any(child.marker.evaluate({**env, "extra": e}) for e in active):
                stack.append(child)
    return seen, wanted


def host_packages(path: Path) -> dict[str, Version | None]:
    """`name==version` as read on the host; a bare `name` is present at a version not read (a requirement of a
    listed package), accepted as it is."""
    found: dict[str, Version | None] = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, version = line.partition("==")
        found[canonicalize_name(name.strip())] = Version(version.strip()) if version else None
    return found


def choose(nodes: dict[str, Node], root_reqs: list[str], python_version: str,
           host_file: Path) -> tuple[list[Node], dict[str, str]]:
    """What travels (reachable, not the host's at an accepted version) and what is left to the host, with why."""
    seen, wanted = walk(nodes, root_reqs, python_version)
    host = host_packages(host_file)
    carry: list[Node] = []
    skipped: dict[str, str] = {}
    for name in sorted(seen):
        if _host_only(name):
            skipped[name] = "the host's (CUDA PyTorch and its libraries)"
            continue
        if name in host:
            have = host[name]
            if have is None:
                skipped[name] = "the host has it (version not read)"
                continue
            if name in HOST_ACCEPTED or all(r.specifier.contains(have, prereleases=True) for r in wanted[name]):
                skipped[name] = f"the host has {have}"
                continue
        carry.append(nodes[name])
    return carry, skipped


def download(carry: list[Node], python_version: str, out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(out),
                    *target_args(python_version), *(f"{n.name}=={n.version}" for n in carry)], check=True)


def wheel_name(path: Path) -> str:
    return canonicalize_name(re.split(r"-\d", path.name, maxsplit=1)[0])


def unpack(wheels: list[Path], site: Path) -> None:
    """Each wheel's files as `pip install --target` places them: the archive root, and `<name>.data/purelib` and
    `platlib` merged into it. Console scripts are written on the host (gpu_install.py) for its own Python, so the
    `.data/scripts`, `headers` and `data` parts are left out."""
    for whl in wheels:
        with zipfile.ZipFile(whl) as zf:
            for info in zf.infolist():
                parts = info.filename.split("/")
                if parts[0].endswith(".data"):
                    if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                        continue
                    parts = parts[2:]
                if info.is_dir() or ".." in parts or info.filename.startswith("/"):
                    continue
                dest = site.joinpath(*parts)
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(zf.read(info))
                mode = (info.external_attr >> 16) & 0o777
                if mode:
                    dest.chmod(mode | 0o600)


def pack(wheels: list[Path], archive: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="ef-site-") as tmp:
        site = Path(tmp) / "site"
        unpack(wheels, site)
        tmp_archive = archive.with_name(archive.name + ".part")
        subprocess.run(["tar", "-C", tmp, "-cf", str(tmp_archive), "--use-compress-program", "xz -9 -T2", "site"],
                       check=True)
        tmp_archive.replace(archive)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / ".gpu-bundle")
    ap.add_argument("--python-version", default="3.12", help="the host's CPython (the lent H200: 3.12)")
    ap.add_argument("--host-packages", type=Path, default=HOST_PACKAGES,
                    help="what the host has (`pip freeze` there; default: the lent host's, read 2026-12)")
    ap.add_argument("--limit-mib", type=float, default=56.0,
                    help="largest bundle accepted (the device tool carries 64 MiB with the working tree)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ef-bundle-") as tmp:
        nodes = resolve(args.python_version, Path(tmp))
    carry, skipped = choose(nodes, roots(), args.python_version, args.host_packages)
    wheel_dir = args.out / "wheels"
    download(carry, args.python_version, wheel_dir)
    wheels = sorted(wheel_dir.glob("*.whl"))
    archive = args.out / "site.tar.xz"
    pack(wheels, archive)
    rows = []
    for whl in wheels:
        data = whl.read_bytes()
        rows.append({"name": wheel_name(whl), "file": whl.name, "size": len(data),
                     "sha256": hashlib.sha256(data).hexdigest()})
    total = sum(r["size"] for r in rows)
    packed = archive.stat().st_size
    (args.out / "bundle.json").write_text(json.dumps({
        "python_version": args.python_version, "wheels": rows, "wheel_bytes": total, "archive": archive.name,
        "archive_bytes": packed, "archive_sha256": hashlib.sha256(archive.read_bytes()).hexdigest(),
        "left_to_the_host": skipped, "not_needed": NOT_NEEDED, "host_release_accepted": HOST_ACCEPTED},
        indent=1) + "\n")
    for r in sorted(rows, key=lambda r: -r["size"]):
        print(f"{r['size'] / 2**20:8.2f} MiB  {r['file']}")
    print(f"{len(rows)} wheels, {total / 2**20:.1f} MiB; packed for the trip: {archive} {packed / 2**20:.1f} MiB "
          f"(limit {args.limit_mib} MiB); {len(skipped)} left to the host, {len(NOT_NEEDED)} not needed there")
    if packed > args.limit_mib * 2**20:
        print(f"over the limit by {(packed - args.limit_mib * 2**20) / 2**20:.1f} MiB", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
