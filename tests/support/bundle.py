"""The tiny model's reference bundle, built the way the pipeline builds it (about 5 s)."""

from __future__ import annotations

from pathlib import Path

from enginefoundry.inputs.units import expand_units
from enginefoundry.lanes.reference import ReferenceLane
from enginefoundry.spec import load_spec
from tests.support.paths import CONFIGS, TINY_MODEL

TINY_SPEC = CONFIGS / "tiny-cpu.yaml"


def build_tiny_bundle(work: Path) -> Path:
    spec = load_spec(TINY_SPEC)
    unit = expand_units(spec)[0]
    lane = ReferenceLane()
    ckpt = lane.convert(spec, unit.variant, TINY_MODEL, work)
    return Path(lane.build(spec, unit, Path(ckpt.checkpoint_dir), work).bundle_dir)
