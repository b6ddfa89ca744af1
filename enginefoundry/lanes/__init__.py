"""Lanes: one module per toolchain behind one interface (see base.py)."""

from __future__ import annotations

import functools

from enginefoundry.errors import InputError
from enginefoundry.lanes.base import BuildResult, Command, ConvertResult, Lane, ServeCommand


@functools.cache
def get_lane(name: str) -> Lane:
    """One lane instance per name and process: a TensorRT-LLM lane detects its toolchain in a subprocess
    (importing tensorrt_llm takes tens of seconds) and keeps the result, so every stage reuses it."""
    if name == "reference":
        from enginefoundry.lanes.reference import ReferenceLane

        return ReferenceLane()
    if name == "trtllm":
        from enginefoundry.lanes.trtllm import TrtllmLane

        return TrtllmLane()
    if name == "trtllm-engine":
        from enginefoundry.lanes.trtllm_engine import TrtllmEngineLane

        return TrtllmEngineLane()
    raise InputError(f"lane '{name}' is unknown: use reference, trtllm or trtllm-engine")


__all__ = ["BuildResult", "Command", "ConvertResult", "Lane", "ServeCommand", "get_lane"]
