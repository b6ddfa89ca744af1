"""What `pip install .` puts into site-packages: one top-level package (flows and tasks inside it, through the
enginefoundry/flows and enginefoundry/tasks links), and the MLflow client rather than the server."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def build_wheel(tmp_path: Path) -> zipfile.ZipFile:
    # A copy, so the build's build/ and *.egg-info never land in the checkout (links copied as links).
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for name in ("enginefoundry", "flows", "tasks"):
        shutil.copytree(REPO / name, src / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    assert (src / "enginefoundry" / "flows").is_symlink()
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           str(src), "-w", str(tmp_path / "dist")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = (tmp_path / "dist").glob("enginefoundry-*.whl")
    return zipfile.ZipFile(wheel)


def test_wheel_installs_one_package_with_flows_and_tasks_inside(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    names = wheel.namelist()
    top = {n.split("/")[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"enginefoundry"}, top
    for layer in ("flows", "tasks"):
        shipped = {n.removeprefix(f"enginefoundry/{layer}/") for n in names
                   if n.startswith(f"enginefoundry/{layer}/") and n.endswith(".py")}
        assert shipped == {p.relative_to(REPO / layer).as_posix() for p in (REPO / layer).rglob("*.py")
                           if "__pycache__" not in p.parts}, layer
    assert "enginefoundry/flows/prefect_server/ephemeral.py" in names  # a subpackage of a linked layer ships too
    assert "enginefoundry/schemas/manifest.schema.json" in names
    assert "enginefoundry/schemas/spec.schema.json" in names  # the spec's, for editors (scripts/gen_docs.py)

    (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    requires = [line.split(":", 1)[1].strip() for line in wheel.read(metadata).decode().splitlines()
                if line.startswith("Requires-Dist:")]
    core = [r for r in requires if "extra ==" not in r]
    assert "mlflow-skinny==3.17.2" in core
    assert not [r for r in core if re.match(r"mlflow\s*(==|>=|$)", r)], "full mlflow is a core dependency"
    assert any(re.match(r'mlflow==3\.17\.2; extra == "server"', r) for r in requires), requires


def test_bench_venv_pins_the_bench_extra() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    (pin,) = re.findall(r'^bench = \["(aiperf==[^"]+)"\]', pyproject, re.M)
    assert f"install -q '{pin}'" in (REPO / "Makefile").read_text()
