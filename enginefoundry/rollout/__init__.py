"""When to rebuild and whether to switch: a source's change, the toolchain channel, champion-vs-candidate
comparison (compare, side_by_side) and a fleet of specs under pool limits.

Its face (`__all__`): what other packages use of it, loaded on first use (enginefoundry/_face.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from enginefoundry._face import lazy_face

if TYPE_CHECKING:
    from enginefoundry.rollout.compare import ComparisonRow, comparison_rows, markdown
    from enginefoundry.rollout.fleet import (
        FleetMember,
        FleetNotOk,
        FleetSummary,
        check_pool_limit,
        fleet_spec_paths,
        parse_pool_limits,
        pool_limit_name,
    )
    from enginefoundry.rollout.side_by_side import measure, not_servable_here, pending_comparison
    from enginefoundry.rollout.source_change import ChangeReport, RolloutReport, detect_change
    from enginefoundry.rollout.toolchain_channel import channel_status, with_channel

__all__ = ["ChangeReport", "ComparisonRow", "FleetMember", "FleetNotOk", "FleetSummary", "RolloutReport",
           "channel_status", "check_pool_limit", "comparison_rows", "detect_change", "fleet_spec_paths", "markdown",
           "measure", "not_servable_here", "parse_pool_limits", "pending_comparison", "pool_limit_name", "with_channel"]

__getattr__, __dir__ = lazy_face(__name__)
