"""Lanes: one module per toolchain behind one interface (see base.py)."""

from __future__ import annotations

from enginefoundry.errors import InputError
from enginefoundry.lanes.base import BuildResult, Command, ConvertResult, Lane, ServeCommand


def get_lane(name: str) -> Lane:
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
