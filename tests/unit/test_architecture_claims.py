"""docs/architecture.md's claims that a tool can check, checked here in one place: the package map lists exactly
the domain's packages and modules, in the import-linter contract's order; every package has a face (a docstring
that says what it is, `__all__` that resolves); the domain never imports Prefect; flows are composition only and
tasks thin (no class in flows/, no function over 60 lines in flows/ or tasks/); the unit tier starts no process.

PENDING names what other work of issue 35 removes (i35hubs moves the Prefect server management out of flows/ and
splits the long functions; i35cat adds enginefoundry/catalog/): an entry that no longer applies fails the test, so
the list only shrinks."""

from __future__ import annotations

import ast
import importlib
import re
import socket
import subprocess
import tomllib

import pytest

from tests.support.paths import REPO

ARCHITECTURE = (REPO / "docs" / "architecture.md").read_text()
CONTRACTS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
PKG = REPO / "enginefoundry"
OUTER = {"cli", "flows", "tasks"}
MAX_LINES = 60  # issue 35: no function on the unit's path over 60 lines

PENDING_MAP: set[str] = set()  # a package the map describes before it exists
PENDING_NO_FACE: dict[str, str] = {}  # package → why its __all__ is not there yet
PENDING_FLOW_CLASSES: set[str] = set()  # a class in flows/ on its way to the domain
PENDING_LONG: set[str] = set()


def _map_block() -> list[str]:
    section = ARCHITECTURE.split("### Package map (the domain)", 1)[1]
    return section.split("```", 2)[1].splitlines()[2:]  # past the fence's language line and `enginefoundry/`


def _map_names() -> list[str]:
    """The names in the map's first column, in order (the foundation line: each of its modules)."""
    names: list[str] = []
    for line in _map_block():
        m = re.match(r"^  (\S+)", line)
        if not m:
            continue
        head = m.group(1)
        if head == "foundation":
            names += [n.strip() for n in line.split("foundation", 1)[1].split(",")]
        else:
            names.append(head.removesuffix("/").removesuffix(".py"))
    return names


def _domain() -> set[str]:
    modules = {p.stem for p in PKG.glob("*.py") if p.stem != "__init__"}
    packages = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    return (modules | packages) - OUTER


def test_the_package_map_lists_exactly_the_domain() -> None:
    listed = _map_names()
    assert len(listed) == len(set(listed)), f"listed twice: {listed}"
    domain = _domain()
    assert set(listed) - PENDING_MAP == domain - PENDING_MAP, (
        f"docs/architecture.md#package-map: add {sorted(domain - set(listed))}, remove "
        f"{sorted(set(listed) - domain - PENDING_MAP)}")
    assert not PENDING_MAP & domain, f"{PENDING_MAP & domain} exists now: drop it from PENDING_MAP"


def test_the_package_map_is_in_the_contracts_order() -> None:
    layers = next(c for c in CONTRACTS if c["type"] == "layers" and "enginefoundry.search" in c["layers"])["layers"]
    index = {name.strip().removeprefix("enginefoundry."): i for i, layer in enumerate(layers)
             for name in layer.split("|")}
    listed = [n for n in _map_names() if n not in PENDING_MAP]
    assert set(listed) == set(index), f"map ≠ contract: {set(listed) ^ set(index)}"
    order = [index[n] for n in listed]
    assert order == sorted(order), f"the map's order breaks the contract's: {list(zip(listed, order, strict=True))}"
    foundation = {n.strip() for n in _map_block()[-1].split("foundation", 1)[1].split(",")}
    assert foundation == {n for n, i in index.items() if i == len(layers) - 1}


def test_the_layer_diagram_is_the_outer_contract() -> None:
    outer = next(c for c in CONTRACTS if c["type"] == "layers" and "enginefoundry.cli" in c["layers"])["layers"]
    assert outer == ["enginefoundry.cli", "enginefoundry.flows", "enginefoundry.tasks"]
    diagram = ARCHITECTURE.split("## Layers", 1)[1].split("```", 2)[1]
    assert [m.group(1) for m in re.finditer(r"^ (Entry|Flows|Tasks|Domain) ", diagram, re.M)] == [
        "Entry", "Flows", "Tasks", "Domain"]


@pytest.mark.parametrize("package", sorted(p.name for p in PKG.iterdir()
                                           if p.is_dir() and (p / "__init__.py").exists()))
def test_every_package_has_a_face(package: str) -> None:
    module = importlib.import_module(f"enginefoundry.{package}")
    assert (module.__doc__ or "").strip(), f"enginefoundry/{package}/__init__.py: say what the package is"
    if package in PENDING_NO_FACE:
        return
    names = getattr(module, "__all__", None)
    assert names, f"enginefoundry/{package}/__init__.py: export the package's API in __all__"
    missing = [n for n in names if not hasattr(module, n)]
    assert missing == [], f"enginefoundry.{package}.__all__ names what it does not have: {missing}"


def test_the_domain_never_imports_prefect() -> None:
    found = []
    for path in PKG.rglob("*.py"):
        if path.relative_to(PKG).parts[0] in OUTER:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(REPO)}:{node.lineno}" for m in mods if m.split(".")[0] == "prefect"]
    assert found == []


def _layer_files(folder: str) -> list[tuple[str, ast.Module]]:
    return [(f"{folder}/{p.name}", ast.parse(p.read_text(), str(p))) for p in sorted((REPO / folder).glob("*.py"))]


def test_flows_are_composition_only_and_tasks_thin() -> None:
    classes = {rel for rel, tree in _layer_files("flows") if any(isinstance(n, ast.ClassDef) for n in tree.body)}
    assert classes <= PENDING_FLOW_CLASSES, f"a class is domain logic: move it out of flows/ {classes}"
    long = {f"{rel}:{n.name}" for folder in ("flows", "tasks") for rel, tree in _layer_files(folder)
            for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            and (n.end_lineno or n.lineno) - n.lineno + 1 > MAX_LINES}
    assert long <= PENDING_LONG, f"over {MAX_LINES} lines: split it, the logic into the domain: {long - PENDING_LONG}"
    assert classes >= PENDING_FLOW_CLASSES, f"done: drop {PENDING_FLOW_CLASSES - classes} from PENDING_FLOW_CLASSES"
    assert long >= PENDING_LONG, f"done: drop {PENDING_LONG - long} from PENDING_LONG"


def test_the_unit_tier_starts_no_process_and_no_server() -> None:
    """tests/unit/conftest.py refuses both while a unit test runs (and while a unit module is collected)."""
    with pytest.raises(AssertionError, match="the unit tier starts no process"):
        subprocess.run(["true"], check=False)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        with pytest.raises(AssertionError, match="the unit tier starts no process or server"):
            sock.listen()
