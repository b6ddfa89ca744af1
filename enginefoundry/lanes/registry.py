"""The one list of lanes. Adding a lane = a folder (its module: the Lane subclass and its options model) plus one
`register_lane` line here (or, for a plugin or a test, one `register_lane` call).

A lane owns its knowledge: its options model (the spec's `lane_options` for that lane), its validation, its
preflight checks and its memory model are methods of its Lane class (enginefoundry.lanes.base.Lane); nothing
outside the lane's folder names it. Entries name their classes by import path, so reading the registry imports no
toolchain code, and the spec can validate `lane_options` against it without an import cycle.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from enginefoundry.errors import InputError

if TYPE_CHECKING:
    from enginefoundry.lanes.base import Lane
    from enginefoundry.spec.lane_options import LaneOptions


@dataclass(frozen=True)
class LaneEntry:
    name: str
    lane: str  # "module:Class" of the Lane subclass
    options: str  # "module:Class" of its LaneOptions model
    summary: str = ""


LANES: dict[str, LaneEntry] = {}


def register_lane(entry: LaneEntry) -> LaneEntry:
    """Add (or replace) a lane. The registration hook for plugins and tests."""
    LANES[entry.name] = entry
    get_lane.cache_clear()
    return entry


def unregister_lane(name: str) -> None:
    LANES.pop(name, None)
    get_lane.cache_clear()


def lane_names() -> list[str]:
    return list(LANES)


def _load(path: str) -> Any:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def entry(name: str) -> LaneEntry:
    try:
        return LANES[name]
    except KeyError:
        raise InputError(f"lane '{name}' is unknown: use one of {', '.join(LANES)}") from None


def options_model(name: str) -> type[LaneOptions]:
    return _load(entry(name).options)


@functools.cache
def get_lane(name: str) -> Lane:
    """One lane instance per name and process: a TensorRT-LLM lane detects its toolchain in a subprocess
    (importing tensorrt_llm takes tens of seconds) and keeps the result, so every stage reuses it."""
    return _load(entry(name).lane)()


# --- the lanes ---------------------------------------------------------------------------------------------------
register_lane(LaneEntry("reference", "enginefoundry.lanes.reference:ReferenceLane",
                        "enginefoundry.spec.lane_options:NoOptions", "transformers + PyTorch, any device"))
register_lane(LaneEntry("trtllm", "enginefoundry.lanes.trtllm:TrtllmLane",
                        "enginefoundry.lanes.trtllm_options:TrtllmOptions", "TensorRT-LLM ≥ 1.0, PyTorch backend"))
register_lane(LaneEntry("trtllm-engine", "enginefoundry.lanes.trtllm_engine:TrtllmEngineLane",
                        "enginefoundry.lanes.trtllm_options:EngineOptions", "TensorRT-LLM 1.0 – 1.2.x, engines"))
