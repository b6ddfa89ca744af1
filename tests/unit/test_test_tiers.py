"""The tests keep their tiers: every test module lives in tests/unit, tests/integration or tests/e2e, and no
test module imports another test module or a conftest (shared code goes to tests/support, fixtures to a
conftest)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.paths import REPO

TESTS = REPO / "tests"
TIERS = ("unit", "integration", "e2e")


def _test_modules() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if "fixtures" not in p.relative_to(TESTS).parts)


def test_every_test_module_is_in_a_tier() -> None:
    outside = [str(p.relative_to(REPO)) for p in _test_modules() if p.relative_to(TESTS).parts[0] not in TIERS]
    assert outside == [], f"move these into tests/unit, tests/integration or tests/e2e: {outside}"


def _imported_modules(path: Path) -> list[str]:
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytest_plugins"
                                                  for t in node.targets):
            found.append("pytest_plugins")
    return found


def test_no_test_module_imports_another_or_a_conftest() -> None:
    bad = {}
    for path in [*_test_modules(), *TESTS.rglob("conftest.py"), *(TESTS / "support").rglob("*.py")]:
        wrong = [m for m in _imported_modules(path)
                 if m == "pytest_plugins" or m.split(".")[-1].startswith("test_") or m.endswith("conftest")]
        if wrong:
            bad[str(path.relative_to(REPO))] = wrong
    assert bad == {}, ("import shared helpers from tests.support (paths: REPO, TINY_MODEL, TINY_PROMPTS; cluster: "
                       f"PrefectServer, write_spec …); the cluster fixtures come from tests/conftest.py: {bad}")
