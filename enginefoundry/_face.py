"""A package's face, loaded lazily (PEP 562): the package's `__init__` imports its API under `if TYPE_CHECKING:` and
lists the names in `__all__`; `lazy_face` reads those imports from the `__init__`'s own source and imports a name's
module the first time someone asks for it (`from enginefoundry.store import open_store`). The face costs nothing
at import time, so it can never slow `enginefoundry --help` nor close an import cycle between packages that import
each other's modules (huggingface_hub's `__init__` loads its API the same way, from one table). The unit test
tests/unit/test_architecture_claims.py checks that every name of every face resolves."""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _type_checking_imports(source: str) -> dict[str, tuple[str, str]]:
    """name → (module, attribute) of every `from module import attribute [as name]` under `if TYPE_CHECKING:`."""
    found: dict[str, tuple[str, str]] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom) and stmt.module:
                    for alias in stmt.names:
                        found[alias.asname or alias.name] = (stmt.module, alias.name)
    return found


def lazy_face(package: str) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of `package`, from the TYPE_CHECKING imports of its `__init__`."""
    module = sys.modules[package]
    origin = module.__file__
    assert origin is not None, f"{package} has no source file"
    table = _type_checking_imports(Path(origin).read_text(encoding="utf-8"))

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        where, attribute = table[name]
        value = getattr(importlib.import_module(where), attribute)
        setattr(module, name, value)  # the next lookup is a plain attribute
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(module), *table})

    return __getattr__, __dir__
