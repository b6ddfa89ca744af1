"""Network tasks retry with backoff on transient errors only."""

from __future__ import annotations

import httpx
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError
from mlflow.exceptions import MlflowException
from prefect.states import Failed

from enginefoundry.errors import (
    InputError,
    PipelineError,
    SourceError,
    SourceUnreachable,
    SpecError,
    StoreError,
    StoreUnavailable,
    is_transient,
    store_error,
)
from enginefoundry.tasks._retry import NETWORK_RETRIES, transient_only


def _wrapped(inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as err:
            raise PipelineError("stage failed") from err
    except PipelineError as outer:
        return outer


def _client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")


@pytest.mark.parametrize("err", [
    EndpointConnectionError(endpoint_url="http://127.0.0.1:9"),
    httpx.ConnectError("refused"),
    ConnectionResetError(),
    _client_error("SlowDown", 503),
    MlflowException("API request to http://mlflow:5000/api/2.0/mlflow/runs/create failed with exception ..."),
    SourceUnreachable("model.source: cannot reach the hub at http://hub (ConnectError); set HF_ENDPOINT"),
    StoreUnavailable("put failed on s3://b/p: EndpointConnectionError: Could not connect"),
    store_error("put failed on s3://b/p: SlowDown", _client_error("SlowDown", 503)),
    _wrapped(httpx.ReadTimeout("slow")),
])
def test_transient_errors_are_retried(err: BaseException) -> None:
    assert is_transient(err)
    assert transient_only(None, None, Failed(data=err))


@pytest.mark.parametrize("err", [
    InputError("bad input"), SpecError([("smoke.prompts", "missing")]), _client_error("AccessDenied", 403),
    StoreError("s3://b/p/manifest.json is not a valid manifest"), PipelineError("smoke gate rejected"),
    ValueError("boom"), store_error("put failed on s3://b/p: AccessDenied", _client_error("AccessDenied", 403)),
    # the type decides, never the text: an error that only names a transient client error is not one
    StoreError("put failed on s3://b/p: EndpointConnectionError: Could not connect"),
    SourceError("model.source: cannot reach the hub at http://hub (ConnectError); set HF_ENDPOINT"),
])
def test_other_errors_fail_at_once(err: BaseException) -> None:
    assert not is_transient(err)
    assert not transient_only(None, None, Failed(data=err))


def test_backoff_is_exponential() -> None:
    assert NETWORK_RETRIES["retries"] == 3
    assert NETWORK_RETRIES["retry_delay_seconds"](3) == [2, 4, 8]


def test_the_typed_transient_errors_keep_their_family_and_exit_code() -> None:
    """A wrapper's transient error is still its own family's error: callers that catch StoreError or SourceError
    (and the CLI's exit codes) see no difference."""
    assert isinstance(store_error("x", _client_error("SlowDown", 503)), StoreError)
    assert SourceUnreachable("x").exit_code == SourceError("x").exit_code
    assert StoreUnavailable("x").exit_code == StoreError("x").exit_code
