"""The lanes a spec may name and each lane's options model: a catalog the spec reads and the lanes fill.

The spec validates `lane` and `lane_options` against this catalog and never imports a lane statically, so the
spec package sits below the lanes. On first use the catalog imports the built-in lanes' module (`BUILTIN`, by
name: the one place the spec names the lanes package) and every module of the `enginefoundry.lanes` entry-point
group (a plugin's, the way pytest loads its plugins); each registers its lanes with `register_lane`, as a test
does. Entries name their classes by import path, so reading the catalog imports no toolchain code.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from enginefoundry.errors import InputError

if TYPE_CHECKING:
    from enginefoundry.spec.lane_options import LaneOptions

GROUP = "enginefoundry.lanes"
BUILTIN = "enginefoundry.lanes.registry"


@dataclass(frozen=True)
class LaneEntry:
    name: str
    lane: str  # "module:Class" of the Lane subclass
    options: str  # "module:Class" of its LaneOptions model
    summary: str = ""
    # "module:function" that explains a spec key the lane knows as removed or moved (None if it does not know it)
    explain_key: str = ""


LANES: dict[str, LaneEntry] = {}
_listeners: list[Callable[[], None]] = []
_loaded = False


def _load_entry_points() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    importlib.import_module(BUILTIN)  # registers the built-in lanes with register_lane
    for ep in entry_points(group=GROUP):
        ep.load()  # a plugin's module registers its lanes the same way


def on_change(listener: Callable[[], None]) -> None:
    """Call `listener` whenever an entry is added or removed (the lanes' instance cache listens)."""
    _listeners.append(listener)


def register_lane(entry: LaneEntry) -> LaneEntry:
    """Add (or replace) a lane. The registration hook for plugins and tests."""
    _load_entry_points()
    LANES[entry.name] = entry
    for listener in _listeners:
        listener()
    return entry


def unregister_lane(name: str) -> None:
    _load_entry_points()
    LANES.pop(name, None)
    for listener in _listeners:
        listener()


def lane_names() -> list[str]:
    _load_entry_points()
    return list(LANES)


def load(path: str) -> Any:
    """The object at "module:attribute"."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def entry(name: str) -> LaneEntry:
    _load_entry_points()
    try:
        return LANES[name]
    except KeyError:
        raise InputError(f"lane '{name}' is unknown: use one of {', '.join(LANES)}") from None


def options_model(name: str) -> type[LaneOptions]:
    model: type[LaneOptions] = load(entry(name).options)
    return model


def explain_unknown_key(key: str) -> str | None:
    """The first registered lane's explanation of a spec key it knows as removed or moved, or None."""
    for e in [*LANES.values()] if _loaded else [entry(n) for n in lane_names()]:
        if e.explain_key:
            said: str | None = load(e.explain_key)(key)
            if said:
                return said
    return None
