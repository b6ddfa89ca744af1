"""Lanes: one module per toolchain behind one interface (base.py), listed once in registry.py.

Attributes load lazily, so the spec can consult the registry while it is being imported."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names __getattr__ serves, for the type checker
    from enginefoundry.lanes.base import BuildResult as BuildResult
    from enginefoundry.lanes.base import Command as Command
    from enginefoundry.lanes.base import ConvertResult as ConvertResult
    from enginefoundry.lanes.base import Lane as Lane
    from enginefoundry.lanes.base import ServeCommand as ServeCommand
    from enginefoundry.lanes.registry import LaneEntry as LaneEntry
    from enginefoundry.lanes.registry import get_lane as get_lane
    from enginefoundry.lanes.registry import register_lane as register_lane

_LAZY = {
    "BuildResult": "enginefoundry.lanes.base", "Command": "enginefoundry.lanes.base",
    "ConvertResult": "enginefoundry.lanes.base", "Lane": "enginefoundry.lanes.base",
    "ServeCommand": "enginefoundry.lanes.base", "get_lane": "enginefoundry.lanes.registry",
    "register_lane": "enginefoundry.lanes.registry", "LaneEntry": "enginefoundry.lanes.registry",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_LAZY)
