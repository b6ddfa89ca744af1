"""Retries for tasks that cross the network (hub, S3, MLflow): exponential backoff with jitter, and only for
transient errors (enginefoundry.errors.is_transient); a bad input or a failed gate fails at once.

    @task(name="…", cache_policy=NO_CACHE, **NETWORK_RETRIES)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

from prefect.tasks import exponential_backoff

from enginefoundry.errors import is_transient


def transient_only(_task: Any, _task_run: Any, state: Any) -> bool:
    """Prefect's retry_condition_fn: retry when the failure is a transient network error."""
    err = state.data if isinstance(state.data, BaseException) else None
    if err is None:
        try:
            result = state.result(raise_on_failure=False)
        except Exception as exc:
            result = exc
        err = result if isinstance(result, BaseException) else None
    return err is not None and is_transient(err)


class RetryOptions(TypedDict):
    """The retry keywords of Prefect's @task that NETWORK_RETRIES sets."""

    retries: int
    retry_delay_seconds: Callable[[int], list[float]]
    retry_jitter_factor: float
    retry_condition_fn: Callable[[Any, Any, Any], bool]


NETWORK_RETRIES: RetryOptions = {
    "retries": 3,
    "retry_delay_seconds": exponential_backoff(backoff_factor=2),  # 2 s, 4 s, 8 s
    "retry_jitter_factor": 0.5,
    "retry_condition_fn": transient_only,
}
