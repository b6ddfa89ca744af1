"""The layer contracts and the package list in pyproject.toml stay complete as rooms are added."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
OUTER_LAYERS = {"cli", "flows", "orchestration", "tasks"}  # may import Prefect


def domain_modules() -> set[str]:
    pkg = REPO / "enginefoundry"
    names = {p.stem for p in pkg.glob("*.py") if p.stem != "__init__"}
    names |= {p.name for p in pkg.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    return {f"enginefoundry.{n}" for n in names - OUTER_LAYERS}


def test_every_domain_module_is_bound_by_the_forbidden_contract() -> None:
    contracts = PYPROJECT["tool"]["importlinter"]["contracts"]
    forbidden = next(c for c in contracts if c["type"] == "forbidden")
    assert set(forbidden["source_modules"]) == domain_modules()
    assert {"prefect", "enginefoundry.flows", "enginefoundry.tasks", "enginefoundry.cli"} <= set(
        forbidden["forbidden_modules"])


def test_flows_and_tasks_install_inside_the_package() -> None:
    """Nothing named `flows` or `tasks` at the top of site-packages: they ship as enginefoundry.flows/tasks."""
    packages = set(PYPROJECT["tool"]["setuptools"]["packages"])
    found = {".".join(Path(d).relative_to(REPO).parts)
             for d, _, files in os.walk(REPO / "enginefoundry", followlinks=True) if "__init__.py" in files}
    assert packages == found
    assert not any(p.split(".")[0] in {"flows", "tasks"} for p in packages)
    assert (REPO / "enginefoundry" / "flows").resolve() == REPO / "flows"
    assert (REPO / "enginefoundry" / "tasks").resolve() == REPO / "tasks"


