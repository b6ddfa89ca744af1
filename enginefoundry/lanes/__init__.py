"""Lanes: one module per toolchain behind one interface (base.py), registered once in registry.py into the spec's
lane catalog (enginefoundry.spec.lane_catalog)."""

from __future__ import annotations

from enginefoundry.lanes.base import BuildResult, Command, ConvertResult, Lane, ServeCommand
from enginefoundry.lanes.registry import LaneEntry, get_lane, register_lane

__all__ = ["BuildResult", "Command", "ConvertResult", "Lane", "LaneEntry", "ServeCommand", "get_lane",
           "register_lane"]
