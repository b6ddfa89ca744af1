"""What a run recorded in MLflow, through the one client wrapper (tracking): run records and summaries, unit
outcomes, model registration, promotion (aliases, champion and candidate), the lineage of a published unit,
alias lineage, and the servers' database templates.

Its face (`__all__`): what other packages use of it, loaded on first use (enginefoundry/_face.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from enginefoundry._face import lazy_face

if TYPE_CHECKING:
    from enginefoundry.records.alias_lineage import Lineage, refuse_alias_collisions, unit_lineage, version_lineage
    from enginefoundry.records.lineage import adapter_tags, lineage, read_manifest_uri, registry_anchor, resolve
    from enginefoundry.records.outcomes import (
        UnitCommands,
        build_run_tags,
        built_outcome,
        duplicate_outcome,
        failed_outcome,
        hit_outcome,
        read_outcome,
        save_outcome,
        stage_commands,
        unit_manifest,
        unit_metrics,
        unit_params,
    )
    from enginefoundry.records.promotion import (
        ACCURACY_KEYS,
        NOISE,
        Decision,
        PromotionPolicy,
        Registry,
        alias_stems,
        anchor_of,
        candidate_alias,
        champion_alias,
        compare,
        decide_promotions,
        manifest_uri_of,
        operating_point,
        read_version_manifest,
    )
    from enginefoundry.records.registration import candidate_alias_of, ensure_registered, version_tags
    from enginefoundry.records.run_records import (
        context_tags,
        finish_parent,
        mlflow_run_link,
        prepare_tracking,
        record_hit,
        report_dir,
        start_parent,
        tracker_for,
    )
    from enginefoundry.records.run_summary import (
        RunSummary,
        UnitNotPassed,
        UnitOutcome,
        UnitsNotPassed,
        best_profiles,
        refused_by_sibling,
        search_rows,
    )
    from enginefoundry.records.tracking import (
        OPEN_RUNS,
        Tracker,
        end_open_runs_cancelled,
        end_orphaned_runs,
        project_git_commit,
        redact,
    )

__all__ = [
    "ACCURACY_KEYS",
    "NOISE",
    "OPEN_RUNS",
    "Decision",
    "Lineage",
    "PromotionPolicy",
    "Registry",
    "RunSummary",
    "Tracker",
    "UnitCommands",
    "UnitNotPassed",
    "UnitOutcome",
    "UnitsNotPassed",
    "adapter_tags",
    "alias_stems",
    "anchor_of",
    "best_profiles",
    "build_run_tags",
    "built_outcome",
    "candidate_alias",
    "candidate_alias_of",
    "champion_alias",
    "compare",
    "context_tags",
    "decide_promotions",
    "duplicate_outcome",
    "end_open_runs_cancelled",
    "end_orphaned_runs",
    "ensure_registered",
    "failed_outcome",
    "finish_parent",
    "hit_outcome",
    "lineage",
    "manifest_uri_of",
    "mlflow_run_link",
    "operating_point",
    "prepare_tracking",
    "project_git_commit",
    "read_manifest_uri",
    "read_outcome",
    "read_version_manifest",
    "record_hit",
    "redact",
    "refuse_alias_collisions",
    "refused_by_sibling",
    "registry_anchor",
    "report_dir",
    "resolve",
    "save_outcome",
    "search_rows",
    "stage_commands",
    "start_parent",
    "tracker_for",
    "unit_lineage",
    "unit_manifest",
    "unit_metrics",
    "unit_params",
    "version_lineage",
    "version_tags",
]

__getattr__, __dir__ = lazy_face(__name__)
