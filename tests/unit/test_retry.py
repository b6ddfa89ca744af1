"""retry_transient: backoff with jitter on transient errors only."""

from __future__ import annotations

import random

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from enginefoundry.retry import backoff_delays, is_transient, retry_transient


def _client_error(status: int, code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "x"}, "ResponseMetadata": {"HTTPStatusCode": status}},
                       "GetObject")


@pytest.mark.parametrize("err", [
    ConnectionError("refused"), TimeoutError(), EndpointConnectionError(endpoint_url="http://x"),
    _client_error(503, "ServiceUnavailable"), _client_error(500, "InternalError"), _client_error(429, "x"),
    _client_error(400, "SlowDown"), _client_error(400, "Throttling"),
])
def test_transient_errors(err: Exception) -> None:
    assert is_transient(err)


@pytest.mark.parametrize("err", [
    _client_error(404, "NoSuchKey"), _client_error(403, "AccessDenied"), _client_error(412, "PreconditionFailed"),
    ValueError("bad"), KeyError("k"), FileNotFoundError("x"),
])
def test_permanent_errors(err: Exception) -> None:
    assert not is_transient(err)


def test_mlflow_errors() -> None:
    from mlflow.exceptions import MlflowException
    from mlflow.protos import databricks_pb2 as codes

    assert is_transient(MlflowException("x", error_code=codes.TEMPORARILY_UNAVAILABLE))
    assert is_transient(MlflowException("(sqlite3.OperationalError) database is locked",
                                        error_code=codes.BAD_REQUEST))
    assert is_transient(MlflowException("API request failed: Max retries exceeded (connection refused)"))
    assert not is_transient(MlflowException("bad name", error_code=codes.INVALID_PARAMETER_VALUE))
    assert not is_transient(MlflowException("no such run", error_code=codes.RESOURCE_DOES_NOT_EXIST))


def test_retries_transient_until_it_succeeds_with_jittered_backoff() -> None:
    calls, sleeps = [], []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("refused")
        return "ok"

    assert retry_transient(flaky, attempts=5, base_s=1.0, cap_s=8.0, sleep=sleeps.append) == "ok"
    assert len(calls) == 3
    assert len(sleeps) == 2 and 0 <= sleeps[0] <= 1.0 and 0 <= sleeps[1] <= 2.0


def test_permanent_error_is_raised_at_once_and_the_last_transient_one_unchanged() -> None:
    sleeps: list[float] = []
    with pytest.raises(KeyError):
        retry_transient(lambda: {}["x"], sleep=sleeps.append)
    assert sleeps == []
    err = ConnectionError("down")

    def down() -> None:
        raise err

    with pytest.raises(ConnectionError) as got:
        retry_transient(down, attempts=3, sleep=sleeps.append)
    assert got.value is err and len(sleeps) == 2


def test_backoff_ceiling_grows_exponentially_and_is_capped() -> None:
    rng = random.Random(1)
    samples = [backoff_delays(6, 0.5, 4.0, rng) for _ in range(300)]
    for i, ceiling in enumerate([0.5, 1.0, 2.0, 4.0, 4.0]):
        column = [s[i] for s in samples]
        assert max(column) <= ceiling and max(column) > 0.8 * ceiling  # full jitter spans [0, ceiling]
        assert min(column) < 0.2 * ceiling
