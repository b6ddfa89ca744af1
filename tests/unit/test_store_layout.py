"""The store's layout has one home (enginefoundry/store/layout.py, issue 20): no other module spells an object
prefix or key shape. The code of enginefoundry/, flows/ and tasks/ is read as Python (string literals and the
literal parts of f-strings; docstrings describe, they build no key) and every literal that starts with a store
prefix, or names one between slashes, is a failure naming its file and line."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from enginefoundry.store import layout

ROOT = Path(__file__).resolve().parents[2]
LAYOUT = (ROOT / "enginefoundry" / "store" / "layout.py").resolve()
# Prefixes that are also ordinary words of local folders, URLs and commands (`work_root() / "runs"`, the hub
# cache's `blobs`, the `leases` subcommand, MLflow's `…/#/experiments/1/runs/<id>`): only a literal that starts
# with `<prefix>/` is a key. The others are flagged alone and between slashes too.
COMMON_WORDS = {layout.RUN_OUTCOMES, layout.REFERENCES, layout.BLOB_PREFIX.split("/")[0], layout.LEASES,
                layout.LEGACY_CHECKPOINTS, layout.LEGACY_UNITS}
# File names of the layout that a literal builds a key with (`f"{prefix}/current.json"`).
KEY_NAMES = (layout.POINTER_NAME,)


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def layout_literal(text: str) -> str | None:
    """The store prefix or key name a string literal spells, or None."""
    for prefix in layout.PREFIXES:
        if text.startswith(f"{prefix}/"):
            return prefix
        if prefix not in COMMON_WORDS and (text == prefix or f"/{prefix}/" in text):
            return prefix
    return next((name for name in KEY_NAMES if name in text), None)


def offenders(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            spelled = layout_literal(node.value)
            if spelled is not None:
                found.append(f"{path.relative_to(root)}:{node.lineno}: {spelled!r} in {node.value[:60]!r}")
    return found


def code_files() -> list[Path]:
    seen: dict[Path, Path] = {}
    for top in ("enginefoundry", "flows", "tasks"):
        for path in sorted((ROOT / top).rglob("*.py")):
            seen.setdefault(path.resolve(), path)
    return [p for real, p in seen.items() if real != LAYOUT]


def test_no_store_prefix_is_spelled_outside_layout() -> None:
    files = code_files()
    assert len(files) > 100  # the whole code base was read (flows/ and tasks/ are links into enginefoundry/)
    bad = [line for path in files for line in offenders(path)]
    assert not bad, ("store prefixes spelled outside enginefoundry/store/layout.py (build the key with its "
                     "functions):\n" + "\n".join(bad))


@pytest.mark.parametrize(("literal", "spelled"), [
    ("blobs/sha256", "blobs"), ("manifests/", "manifests"), ("leases/m/k.json", "leases"), ("/manifests/", "manifests"),
    ("quarantine/x", "quarantine"), ("attestations/m/k", "attestations"), ("verifications/", "verifications"),
    ("runs/m/p/u.json", "runs"), ("references/d.json", "references"), ("artifacts/m/", "artifacts"),
    ("/current.json", "current.json"), ("checkpoints", None), ("quarantine", "quarantine"), ("manifests", "manifests"),
    ("runs", None), ("references", None), ("/#/experiments/1/runs/abc", None), ("hello", None),
])
def test_the_check_recognises_each_prefix(literal: str, spelled: str | None) -> None:
    assert layout_literal(literal) == spelled


def test_the_check_finds_a_key_built_by_hand(tmp_path: Path) -> None:
    mod = tmp_path / "probe.py"
    mod.write_text('"""Docstring: manifests/<model>/<key>/current.json is described, not built."""\n'
                   'def f(m, k):\n    return f"leases/{m}/{k}.json"\n')
    assert offenders(mod, tmp_path) == ["probe.py:3: 'leases' in 'leases/'"]
