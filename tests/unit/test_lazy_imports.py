"""Lazy imports are declared in one place (pyproject.toml): a function-level import in enginefoundry/ (flows/ and
tasks/ included) is of a heavy third-party module that ruff's TID253 keeps off every module's top
(`banned-module-level-imports`), or of enginefoundry itself within `[tool.enginefoundry.deferred-imports]`'s
per-file budget (the CLI defers the domain so `enginefoundry --help` stays fast; a few break an import cycle),
which only goes down; and none re-imports a module its file already imports at the top."""

from __future__ import annotations

import ast
import tomllib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from tests.support.paths import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
HEAVY = set(PYPROJECT["tool"]["ruff"]["lint"]["flake8-tidy-imports"]["banned-module-level-imports"])
DEFERRED = PYPROJECT["tool"]["enginefoundry"]["deferred-imports"]
BUDGET: dict[str, int] = DEFERRED["budget"]
EXCEPTIONS: set[str] = set(DEFERRED["exceptions"])


def _sources() -> list[Path]:
    found = {p.resolve() for d in ("enginefoundry", "flows", "tasks") for p in (REPO / d).rglob("*.py")}
    return sorted(found)


def _function_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement inside a function (once, however deeply the functions nest)."""
    seen: set[int] = set()
    for func in ast.walk(tree):
        if isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(func):
                if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in seen:
                    seen.add(id(node))
                    yield node


def _modules(node: ast.Import | ast.ImportFrom) -> list[str]:
    return [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]


def _top_modules(tree: ast.Module) -> set[str]:
    return {m for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom) for m in _modules(node)}


def test_no_function_re_imports_a_module_its_file_imports_at_the_top() -> None:
    again = []
    for path in _sources():
        tree = ast.parse(path.read_text(), str(path))
        top = _top_modules(tree)
        again += [f"{path.relative_to(REPO)}:{node.lineno} {m}" for node in _function_imports(tree)
                  for m in _modules(node) if m in top]
    assert again == [], f"import these names with the top-level import of the same module: {again}"


def test_function_level_imports_are_heavy_modules_or_budgeted_deferrals() -> None:
    deferred: Counter[str] = Counter()
    undeclared = []
    for path in _sources():
        rel = str(path.relative_to(REPO))
        for node in _function_imports(ast.parse(path.read_text(), str(path))):
            for module in _modules(node):
                root = module.split(".")[0]
                if root == "enginefoundry":
                    deferred[rel] += 1
                elif root not in HEAVY and f"{rel}:{module}" not in EXCEPTIONS:
                    undeclared.append(f"{rel}:{node.lineno} {module}")
    assert undeclared == [], ("import these at the module's top, or declare the module heavy in pyproject.toml "
                              f"(banned-module-level-imports): {undeclared}")
    over = {f: (n, BUDGET.get(f, 0)) for f, n in deferred.items() if n > BUDGET.get(f, 0)}
    assert over == {}, ("(found, budget): import enginefoundry modules at the top; defer one only to keep "
                        f"`enginefoundry --help` fast or to break a cycle, and say so: {over}")
    stale = {f: (deferred.get(f, 0), n) for f, n in BUDGET.items() if deferred.get(f, 0) < n}
    assert stale == {}, f"(found, budget): lower the budget in pyproject.toml to what is found: {stale}"

