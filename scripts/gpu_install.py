#!/usr/bin/env python3
"""On the GPU host (no package index): unpack the bundle scripts/gpu_bundle.py made here and write its console
scripts (aiperf, prefect, …) for this host's Python. Standard library only: it runs before anything is installed.

    python3 scripts/gpu_install.py [--bundle .gpu-bundle] [--into /tmp/ef-site]

Then: export PYTHONPATH=$PWD:/tmp/ef-site PATH=/tmp/ef-site/bin:$PATH. It checks the archive's sha256 against
bundle.json, refuses members that would land outside --into, and prints what the host itself must provide
(PyTorch, transformers, …) with the versions it finds, so a run's record says what it ran on.
"""

from __future__ import annotations

import argparse
import configparser
import hashlib
import importlib.metadata
import json
import shutil
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAUNCHER = """#!{python}
import sys
from {module} import {head}
sys.exit({call}())
"""


def unpack(archive: Path, into: Path) -> None:
    staging = into.with_name(into.name + ".part")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    with tarfile.open(archive, "r:xz") as tf:
        tf.extractall(staging, filter="data")  # the data filter refuses absolute paths, '..' and links out of it
    if into.exists():
        shutil.rmtree(into)
    (staging / "site").replace(into)
    staging.rmdir()


def write_launchers(site: Path) -> list[str]:
    bin_dir = site / "bin"
    bin_dir.mkdir(exist_ok=True)
    written: list[str] = []
    for entry_points in sorted(site.glob("*.dist-info/entry_points.txt")):
        parser = configparser.ConfigParser(delimiters=("=",), interpolation=None)
        parser.optionxform = str  # type: ignore[assignment,method-assign]  # keep the scripts' case
        parser.read(entry_points)
        if not parser.has_section("console_scripts"):
            continue
        for name, target in parser.items("console_scripts"):
            module, _, attr = target.strip().partition(":")
            attr = attr.split("[")[0].strip()
            head = attr.split(".")[0]
            path = bin_dir / name
            path.write_text(LAUNCHER.format(python=sys.executable, module=module.strip(), head=head, call=attr))
            path.chmod(0o755)
            written.append(name)
    return written


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, default=REPO / ".gpu-bundle")
    ap.add_argument("--into", type=Path, default=Path("/tmp/ef-site"))
    args = ap.parse_args()
    info = json.loads((args.bundle / "bundle.json").read_text())
    archive = args.bundle / info["archive"]
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    if digest != info["archive_sha256"]:
        print(f"{archive}: sha256 {digest} is not bundle.json's {info['archive_sha256']}: make gpu-bundle again",
              file=sys.stderr)
        return 1
    want = info["python_version"]
    have = f"{sys.version_info.major}.{sys.version_info.minor}"
    if have != want:
        print(f"the bundle is for CPython {want}; this is {have}: make gpu-bundle PYTHON_VERSION={have}",
              file=sys.stderr)
        return 1
    unpack(archive, args.into)
    scripts = write_launchers(args.into)
    host: dict[str, str | None] = {}
    for name in sorted(info["left_to_the_host"]):
        try:
            host[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            host[name] = None
    missing = [n for n, v in host.items() if v is None and not n.startswith(("nvidia-", "cuda-"))]
    print(json.dumps({"installed_into": str(args.into), "wheels": len(info["wheels"]), "console_scripts": scripts,
                      "host_packages": host, "host_missing": missing}, indent=1))
    if missing:  # said, not fatal: the run shows whether anything it imports is among them
        print(f"warning: the host lacks {', '.join(missing)}, which the bundle leaves to it: remove them from "
              f"docs/facts/gpu-host-packages.txt and make gpu-bundle again if the run needs them", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
