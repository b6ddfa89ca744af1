"""Loose types are counted per package against a budget that only goes down (issue 35; replaces the "JSON edge" check).

Counted, per package of enginefoundry/ (a subpackage, or a top-level module by its file name) and the top-level
flows/ and tasks/ folders, in code (comments and strings are not code, so prose never counts):

- `dict[str, Any]`: lines that spell the raw loose dict;
- `Any`: lines that use `Any` otherwise (not a `dict[str, Any]` line, not an import);
- each alias of enginefoundry/schemas/loose.py (`JsonObject`, `HfModelConfig`, ...): lines that use it (not its
  definition in loose.py, not an import).

The budget is tests/unit/loose_budget.json. A count above its budget fails (a loose type came in: type it, or use the
alias that names whose JSON it is). A count below its budget also fails until the budget is lowered, so the budget
only ever goes down: `python tests/unit/test_loose_budget.py --write` rewrites it from the tree and prints what
changed. Raising a number by hand is a decision for review to see in the diff.

The old `# JSON edge: <what JSON>` marker is no longer required. A raw `dict[str, Any]` that remains may keep its
marker where it says whose JSON it is; where an alias from loose.py replaced the dict, the alias says it and the
marker went.
"""

from __future__ import annotations

import ast
import io
import json
import sys
import tokenize
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "enginefoundry"
ROOTS = [PACKAGE, REPO / "flows", REPO / "tasks"]
LOOSE = PACKAGE / "schemas" / "loose.py"
BUDGET = Path(__file__).with_name("loose_budget.json")
RAW_DICT = "dict[str, Any]"
BARE_ANY = "Any"
_DICT_TOKENS = ["dict", "[", "str", ",", "Any", "]"]


def aliases() -> list[str]:
    """The names loose.py defines as `Name: TypeAlias = ...`, in file order."""
    tree = ast.parse(LOOSE.read_text())
    return [node.target.id for node in tree.body
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
            and isinstance(node.annotation, ast.Name) and node.annotation.id == "TypeAlias"]


def package_of(path: Path) -> str:
    if path.is_relative_to(PACKAGE):
        parts = path.relative_to(PACKAGE).parts
        return parts[0]  # a subpackage's folder, or a top-level module's file name
    return path.relative_to(REPO).parts[0]  # flows, tasks


def count_file(path: Path, names: list[str]) -> Counter[str]:
    """Per-line counts of the raw dict, bare Any and each alias in one file's code tokens."""
    lines: dict[int, list[str]] = {}
    in_import = False
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if tok.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
            in_import = False
            continue
        if tok.type not in (tokenize.NAME, tokenize.OP):
            continue
        if tok.type == tokenize.NAME and tok.string in ("import", "from") and not lines.get(tok.start[0]):
            in_import = True  # `from x import (...)` spans lines until its NEWLINE
        if not in_import:
            lines.setdefault(tok.start[0], []).append(tok.string)
    counts: Counter[str] = Counter()
    defining = path.resolve() == LOOSE.resolve()
    for toks in lines.values():
        if any(toks[i:i + len(_DICT_TOKENS)] == _DICT_TOKENS for i in range(len(toks))):
            counts[RAW_DICT] += 1
        elif BARE_ANY in toks:
            counts[BARE_ANY] += 1
        if not defining:
            for name in names:
                if name in toks:
                    counts[name] += 1
    return counts


def measure() -> dict[str, dict[str, int]]:
    names = aliases()
    found: dict[str, Counter[str]] = {}
    for root in ROOTS:
        for path in sorted(root.rglob("*.py")):
            if root == PACKAGE and path.relative_to(root).parts[0] in ("flows", "tasks"):
                continue  # links to the top-level folders, counted there
            found.setdefault(package_of(path), Counter()).update(count_file(path, names))
    kinds = [RAW_DICT, BARE_ANY, *names]
    return {pkg: {k: c[k] for k in kinds if c[k]} for pkg, c in sorted(found.items()) if any(c.values())}


def read_budget() -> dict[str, dict[str, int]]:
    data: dict[str, dict[str, int]] = json.loads(BUDGET.read_text())
    return data


def over_and_under(now: dict[str, dict[str, int]],
                   budget: dict[str, dict[str, int]]) -> tuple[list[str], list[str]]:
    over: list[str] = []
    under: list[str] = []
    for pkg in sorted(set(now) | set(budget)):
        has, may = now.get(pkg, {}), budget.get(pkg, {})
        for kind in sorted(set(has) | set(may)):
            n, b = has.get(kind, 0), may.get(kind, 0)
            if n > b:
                fix = ("use the loose.py alias that names whose JSON it is, or a model for a shape we own"
                       if kind == RAW_DICT else "type it (a model, a TypedDict, a Protocol)"
                       if kind == BARE_ANY else "type it if we own the shape; this alias is for outside JSON only")
                over.append(f"{pkg}: {n} lines with `{kind}`, budget {b}: {fix}")
            elif n < b:
                under.append(f"{pkg}: `{kind}` is down to {n} from a budget of {b}: lower it to {n} in "
                             f"{BUDGET.relative_to(REPO)} (or run `python {Path(__file__).relative_to(REPO)} --write`)")
    return over, under


def test_no_package_grows_its_loose_types() -> None:
    over, _ = over_and_under(measure(), read_budget())
    assert not over, "loose types over budget:\n  " + "\n  ".join(over)


def test_the_budget_follows_every_count_down() -> None:
    _, under = over_and_under(measure(), read_budget())
    assert not under, "the budget only goes down; lower it:\n  " + "\n  ".join(under)


def test_the_counter_sees_code_not_prose(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from typing import (\n    Any,\n)\n"
        "from enginefoundry.schemas.loose import JsonObject\n"
        "def f(a: dict[str, Any], b: Any) -> JsonObject:  # Any in a comment, dict[str, Any] too\n"
        "    '''Any prose, dict[str, Any] in a docstring.'''\n"
        "    x: Any = b\n"
        "    return {'k': [a, x]}\n")
    assert count_file(sample, ["JsonObject"]) == Counter({RAW_DICT: 1, BARE_ANY: 1, "JsonObject": 1})


def _write() -> None:
    before = read_budget() if BUDGET.exists() else {}
    now = measure()
    for pkg in sorted(set(before) | set(now)):
        for kind in sorted(set(before.get(pkg, {})) | set(now.get(pkg, {}))):
            b, n = before.get(pkg, {}).get(kind), now.get(pkg, {}).get(kind)
            if b != n:
                print(f"{pkg:>20}  {kind:<20} {b if b is not None else '-':>4} -> {n if n is not None else '-'}")
    BUDGET.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
    total = Counter[str]()
    for counts in now.values():
        total.update(counts)
    print(f"wrote {BUDGET.relative_to(REPO)}: " + ", ".join(f"{k} {v}" for k, v in sorted(total.items())))


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: python {Path(__file__).relative_to(REPO)} --write  (rewrites the budget from the tree)")
    _write()
