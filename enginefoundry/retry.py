"""Retry at the network edges: exponential backoff with full jitter, on transient errors only.

Transient: connection failures and timeouts, HTTP 5xx, throttling (429, S3 SlowDown/Throttling), and a
locked SQLite database (MLflow's local backend under concurrent runs). Everything else — a missing object,
a permission error, a bad request — fails at once: retrying cannot fix it and only hides it. The schedule is
the "full jitter" of the AWS Architecture Blog post "Exponential Backoff And Jitter" (2015): sleep a uniform
random time in [0, min(cap, base · 2^attempt)].

boto3 clients get the same behaviour from botocore's own "standard" retry mode (enginefoundry.store.s3); MLflow's
REST client retries connection errors, 429 and 5xx itself (MLFLOW_HTTP_REQUEST_MAX_RETRIES, default 7,
mlflow/environment_variables.py@3.17.2), so `retry_transient` there adds the cases that layer does not see.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from enginefoundry.errors import is_transient

__all__ = ["backoff_delays", "is_transient", "retry_transient"]

T = TypeVar("T")


def backoff_delays(attempts: int, base_s: float, cap_s: float, rng: random.Random | None = None) -> list[float]:
    """The sleeps between `attempts` tries: full jitter over an exponentially growing ceiling."""
    rand = rng or random
    return [rand.uniform(0, min(cap_s, base_s * 2**i)) for i in range(attempts - 1)]


def retry_transient(
    fn: Callable[[], T], *, what: str = "call", attempts: int = 5, base_s: float = 0.25, cap_s: float = 8.0,
    transient: Callable[[BaseException], bool] = is_transient, sleep: Callable[[float], None] = time.sleep,
    on_retry: Callable[[str], None] | None = None,
) -> T:
    """Call fn; on a transient error wait (backoff with jitter) and try again, up to `attempts` calls in all.
    A non-transient error, or the last transient one, is raised unchanged."""
    delays = backoff_delays(attempts, base_s, cap_s)
    for attempt in range(attempts):
        try:
            return fn()
        except Exception as err:
            if attempt == attempts - 1 or not transient(err):
                raise
            if on_retry is not None:
                on_retry(f"{what}: {type(err).__name__}, retry {attempt + 1}/{attempts - 1} "
                         f"in {delays[attempt]:.2f}s")
            sleep(delays[attempt])
    raise AssertionError("unreachable")  # pragma: no cover
