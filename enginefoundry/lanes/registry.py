"""The built-in lanes. Adding a lane = a folder (its module: the Lane subclass and its options model) plus one
`register_lane` line here (or, for a plugin, its own module under the `enginefoundry.lanes` entry-point group; for a
test, one `register_lane` call).

A lane owns its knowledge: its options model (the spec's `lane_options` for that lane), its validation, its
preflight checks and its memory model are methods of its Lane class (enginefoundry.lanes.base.Lane); nothing
outside the lane's folder names it. The catalog the entries go into is the spec's (enginefoundry.spec.lane_catalog):
the spec validates `lane_options` against it without importing any lane.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from enginefoundry.spec.lane_catalog import (
    LaneEntry,
    entry,
    lane_names,
    load,
    on_change,
    options_model,
    register_lane,
    unregister_lane,
)

if TYPE_CHECKING:
    from enginefoundry.lanes.base import Lane

__all__ = ["LaneEntry", "get_lane", "lane_names", "lanes_serving", "options_model", "register_lane",
           "unregister_lane"]


@functools.cache
def get_lane(name: str) -> Lane:
    """One lane instance per name and process: a TensorRT-LLM lane detects its toolchain in a subprocess
    (importing tensorrt_llm takes tens of seconds) and keeps the result, so every stage reuses it."""
    lane: Lane = load(entry(name).lane)()
    return lane


on_change(get_lane.cache_clear)


# --- the lanes ---------------------------------------------------------------------------------------------------
register_lane(LaneEntry("reference", "enginefoundry.lanes.reference:ReferenceLane",
                        "enginefoundry.lanes.reference_options:ReferenceOptions", "transformers + PyTorch, any device"))
register_lane(LaneEntry("trtllm", "enginefoundry.lanes.trtllm:TrtllmLane",
                        "enginefoundry.lanes.trtllm_options:TrtllmOptions", "TensorRT-LLM ≥ 1.0, PyTorch backend",
                        explain_key="enginefoundry.lanes.trtllm_flags:explain_unknown_key"))
register_lane(LaneEntry("trtllm-engine", "enginefoundry.lanes.trtllm_engine:TrtllmEngineLane",
                        "enginefoundry.lanes.trtllm_options:EngineOptions", "TensorRT-LLM 1.0 – 1.2.x, engines",
                        explain_key="enginefoundry.lanes.trtllm_flags:explain_unknown_key"))


def lanes_serving(algorithm: str) -> list[str]:
    """The registered lanes that serve a `speculative.algorithm`."""
    return [name for name in lane_names() if algorithm in get_lane(name).speculative_algorithms]
