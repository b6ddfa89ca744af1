"""Retry at the network edges: exponential backoff with full jitter, on transient errors only.

Transient: connection failures and timeouts, HTTP 5xx, throttling (429, S3 SlowDown/Throttling), and a
locked SQLite database (MLflow's local backend under concurrent runs). Everything else — a missing object,
a permission error, a bad request — fails at once: retrying cannot fix it and only hides it. The schedule is
the "full jitter" of the AWS Architecture Blog post "Exponential Backoff And Jitter" (2015): sleep a uniform
random time in [0, min(cap, base · 2^attempt)].

boto3 clients get the same behaviour from botocore's own "standard" retry mode (enginefoundry.s3); MLflow's
REST client retries connection errors, 429 and 5xx itself (MLFLOW_HTTP_REQUEST_MAX_RETRIES, default 7,
mlflow/environment_variables.py@3.17.2), so `retry_transient` there adds the cases that layer does not see.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_THROTTLING = {"Throttling", "ThrottlingException", "SlowDown", "RequestLimitExceeded", "TooManyRequests",
               "RequestThrottled", "ProvisionedThroughputExceededException", "RESOURCE_EXHAUSTED",
               "REQUEST_LIMIT_EXCEEDED", "TEMPORARILY_UNAVAILABLE"}
_TRANSIENT_TEXT = ("database is locked", "connection refused", "connection reset", "connection aborted",
                   "max retries exceeded", "timed out", "temporarily unavailable", "remote end closed")


def is_transient(err: BaseException) -> bool:
    """True for errors a later attempt may not see: connection, timeout, 5xx, throttling, a locked database."""
    if isinstance(err, (ConnectionError, TimeoutError)):
        return True
    response = getattr(err, "response", None)
    if isinstance(response, dict):  # botocore ClientError
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        code = response.get("Error", {}).get("Code", "")
        return status >= 500 or status == 429 or code in _THROTTLING
    name = type(err).__name__
    if name in ("EndpointConnectionError", "ConnectionClosedError", "ReadTimeoutError", "ConnectTimeoutError",
                "ConnectionError", "Timeout", "ReadTimeout", "ConnectTimeout", "OperationalError"):
        return name != "OperationalError" or "locked" in str(err).lower()
    error_code = getattr(err, "error_code", None)  # MlflowException
    if isinstance(error_code, str):
        if error_code in _THROTTLING:
            return True
        text = str(err).lower()
        if any(t in text for t in _TRANSIENT_TEXT):
            return True
        status = getattr(err, "get_http_status_code", lambda: 0)()
        return status >= 500 or status == 429
    return False


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
