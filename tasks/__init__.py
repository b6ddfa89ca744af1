"""Prefect tasks: one module per stage. Each task is a thin wrapper over enginefoundry/ domain code and
the unit of retry and observability in the Prefect UI. Large artifacts never travel as task results:
only paths, URIs and digests do.

Its face (`__all__`): what the flows use of it, loaded on first use (enginefoundry/_face.py), so importing one task
module does not import Prefect's tasks for every stage."""

from __future__ import annotations

from typing import TYPE_CHECKING

from enginefoundry._face import lazy_face

if TYPE_CHECKING:
    from enginefoundry.tasks._log import progress_logger, quiet_expected_failures
    from enginefoundry.tasks.bench import benchmark, twin_benchmark, twin_served_apart
    from enginefoundry.tasks.build import build_bundle
    from enginefoundry.tasks.cancel_watch import track_child, watching
    from enginefoundry.tasks.convert import convert_variant
    from enginefoundry.tasks.events import emit_registry_move, emit_unit_outcome
    from enginefoundry.tasks.fetch import fetch_adapters, fetch_draft, fetch_source, merge_adapter
    from enginefoundry.tasks.fleet import FleetRun, finish_fleet_run, link_to_fleet, start_fleet_run
    from enginefoundry.tasks.pool_limits import pool_slot, set_pool_limits
    from enginefoundry.tasks.promote import (
        compare_rebuilt,
        detect_source_change,
        end_orphaned_runs,
        follow_channel,
        measure_side_by_side,
        promote_units,
    )
    from enginefoundry.tasks.publish import build_now_current, publish_unit
    from enginefoundry.tasks.serve import start_unit_server, stop_unit_server
    from enginefoundry.tasks.serve_files import write_serving
    from enginefoundry.tasks.smoke import smoke_reference, smoke_served_adapters, smoke_test, smoke_twin
    from enginefoundry.tasks.track import (
        finish_parent_run,
        prefect_context,
        record_cache_hit,
        record_unit,
        register_published_unit,
        start_parent_run,
        start_unit_run,
    )

__all__ = [
    "FleetRun",
    "benchmark",
    "build_bundle",
    "build_now_current",
    "compare_rebuilt",
    "convert_variant",
    "detect_source_change",
    "emit_registry_move",
    "emit_unit_outcome",
    "end_orphaned_runs",
    "fetch_adapters",
    "fetch_draft",
    "fetch_source",
    "finish_fleet_run",
    "finish_parent_run",
    "follow_channel",
    "link_to_fleet",
    "measure_side_by_side",
    "merge_adapter",
    "pool_slot",
    "prefect_context",
    "progress_logger",
    "promote_units",
    "publish_unit",
    "quiet_expected_failures",
    "record_cache_hit",
    "record_unit",
    "register_published_unit",
    "set_pool_limits",
    "smoke_reference",
    "smoke_served_adapters",
    "smoke_test",
    "smoke_twin",
    "start_fleet_run",
    "start_parent_run",
    "start_unit_run",
    "start_unit_server",
    "stop_unit_server",
    "track_child",
    "twin_benchmark",
    "twin_served_apart",
    "watching",
    "write_serving",
]

__getattr__, __dir__ = lazy_face(__name__)
