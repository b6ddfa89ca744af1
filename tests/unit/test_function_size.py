"""The unit's path stays lean (issue 35, "lean hubs"): no function in these modules is over 60 lines or takes more
than 8 parameters (`self`/`cls` not counted; *args and **kwargs count one each). A function that must stay larger
is listed below with the reason; the list only shrinks (a listed function that fits again fails the test until its
entry is removed)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAX_LINES = 60
MAX_PARAMS = 8

# The modules on one unit's path that this test holds: the flows and tasks, the smoke stage, the Prefect server
# package, the unit-path modules the lean-hubs work split, and the build, lane, publish and records modules.
SCOPE = [
    "flows", "tasks", "enginefoundry/smoke", "flows/prefect_server",
    "enginefoundry/cli/build.py", "enginefoundry/runner.py", "enginefoundry/model_server.py",
    "enginefoundry/retry.py", "enginefoundry/planning/checkpoint_reuse.py",
    # the unit's build (fetch, key, convert), its lane, its publish and its records
    "enginefoundry/inputs", "enginefoundry/lanes/base.py", "enginefoundry/lanes/reference.py",
    "enginefoundry/store/publish.py", "enginefoundry/records",
]

# path:function → why it stays as it is.
EXEMPT = {
    # Prefect deployment entry points: their parameters are the deployment's public form (the UI, `prefect
    # deployment run -p`, automations.yaml, API callers), each documented under Args; bundling them breaks callers.
    "flows/build_engines.py:build_engines": "deployment parameters are its public API",
    "flows/rollout.py:rollout": "deployment parameters are its public API",
    "flows/fleet.py:rollout_fleet": "deployment parameters are its public API",
}


def _param_count(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [*a.posonlyargs, *a.args, *a.kwonlyargs]
    n = len(names) + (a.vararg is not None) + (a.kwarg is not None)
    return n - 1 if a.args and a.args[0].arg in ("self", "cls") else n


def _functions() -> dict[str, tuple[int, int]]:
    """path:function → (lines, parameters), for every function (nested ones too) in SCOPE."""
    found: dict[str, tuple[int, int]] = {}
    for entry in SCOPE:
        root = REPO / entry
        for path in sorted(root.rglob("*.py")) if root.is_dir() else [root]:
            rel = path.relative_to(REPO).as_posix()
            for node in ast.walk(ast.parse(path.read_text(), filename=rel)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
                    found[f"{rel}:{node.name}"] = (node.end_lineno - node.lineno + 1, _param_count(node))
    return found


def test_no_function_on_the_units_path_is_over_60_lines_or_8_parameters() -> None:
    over = {name: size for name, size in _functions().items()
            if (size[0] > MAX_LINES or size[1] > MAX_PARAMS) and name not in EXEMPT}
    assert not over, "split these (lines, parameters), or list one with its reason in EXEMPT: " + ", ".join(
        f"{name} {size}" for name, size in sorted(over.items()))


def test_every_exemption_is_still_needed() -> None:
    sizes = _functions()
    stale = [name for name in EXEMPT
             if name not in sizes or (sizes[name][0] <= MAX_LINES and sizes[name][1] <= MAX_PARAMS)]
    assert not stale, f"these fit now (or are gone): remove them from EXEMPT: {stale}"


def test_the_scan_counts_lines_and_parameters_as_documented() -> None:
    code = "class C:\n    def m(self, a, *args, b=1, **kw):\n        return a\n"
    method = next(n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.FunctionDef))
    assert _param_count(method) == 4 and method.end_lineno is not None
    assert method.end_lineno - method.lineno + 1 == 2
