"""Before anything runs: preflight (refusals with the field and the fix), the cache plan (hits, misses, leases),
the all-hits path that runs no flow (noop_run), the plan report, validate, explain, the Prefect job variables of
a unit (cluster_jobs) and the release of a parent's units to their pools (release): data only, this package never
imports Prefect.

Its face (`__all__`): what other packages use of it, loaded on first use (enginefoundry/_face.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from enginefoundry._face import lazy_face

if TYPE_CHECKING:
    from enginefoundry.planning.cache_plan import CachePlan, find_hit, hit_signature_policy, plan_cache, unit_keys
    from enginefoundry.planning.cluster_jobs import SECRET_ENV_VARIABLE, secret_env_map, unit_job_variables
    from enginefoundry.planning.explain import explain
    from enginefoundry.planning.noop_run import flush_in_background
    from enginefoundry.planning.plan_report import plan_report, refuse_on_preflight
    from enginefoundry.planning.preflight import dequantizes, preflight, reference_summary
    from enginefoundry.planning.release import PoolRelease, release_limit
    from enginefoundry.planning.validate import validate_deep, validate_file

__all__ = [
    "SECRET_ENV_VARIABLE",
    "CachePlan",
    "PoolRelease",
    "dequantizes",
    "explain",
    "find_hit",
    "flush_in_background",
    "hit_signature_policy",
    "plan_cache",
    "plan_report",
    "preflight",
    "reference_summary",
    "refuse_on_preflight",
    "release_limit",
    "secret_env_map",
    "unit_job_variables",
    "unit_keys",
    "validate_deep",
    "validate_file",
]

__getattr__, __dir__ = lazy_face(__name__)
