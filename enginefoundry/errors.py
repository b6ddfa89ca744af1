"""One error hierarchy for the whole pipeline.

Every error a user can cause or fix carries a one-line message that names the thing and the fix.
The CLI maps `InputError` subclasses to exit code 2 and `PipelineError` subclasses to exit code 1,
and prints a traceback only with `--verbose`.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError

EXIT_OK = 0
EXIT_PIPELINE = 1
EXIT_INPUT = 2


class EngineFoundryError(Exception):
    """Base class. `exit_code` is what the CLI returns for it."""

    exit_code = EXIT_PIPELINE


class InputError(EngineFoundryError):
    """The user asked for something invalid: fix the input, nothing ran."""

    exit_code = EXIT_INPUT


class SpecError(InputError):
    """The build spec is invalid. `problems` lists every problem at once as (field path, message)."""

    def __init__(self, problems: list[tuple[str, str]], source: str = "spec") -> None:
        # An unknown key first: a misspelt key is the cause, a "required field is missing" of the same section
        # is often its consequence. The first problem is also on the first line, which is all the Prefect UI
        # shows of a state message before "See more".
        self.problems = sorted(problems, key=lambda p: not p[1].startswith("unknown key"))
        self.source = source
        lines = [f"  {path}: {msg}" for path, msg in self.problems]
        first_path, first_msg = self.problems[0] if self.problems else ("(spec)", "invalid")
        more = f" (+{len(self.problems) - 1} more below)" if len(self.problems) > 1 else ""
        super().__init__(f"{source} is invalid: {first_path}: {first_msg}{more}\n"
                         f"{len(self.problems)} problem(s):\n" + "\n".join(lines))


class SourceError(InputError):
    """The model source cannot be resolved (bad URI, unknown repo or revision, unreachable endpoint)."""


class TransientError(EngineFoundryError):
    """A call at a network edge failed in a way the same call may not (a connection refused or reset, a timeout,
    HTTP 429/5xx, throttling): the client wrappers raise it, as a subclass of their own error (StoreUnavailable,
    SourceUnreachable), so that a retry decides on the type and never on the message (`is_transient`)."""


class SourceUnreachable(SourceError, TransientError):
    """The model source's endpoint (the hub) did not answer: the same request may succeed later."""


class PreflightError(InputError):
    """A unit cannot succeed on its target (precision vs arch, memory budget, ...)."""


class PipelineError(EngineFoundryError):
    """A stage failed while running."""


class ToolError(PipelineError):
    """An external tool (server, benchmark client, converter) failed or is missing."""


class StoreError(PipelineError):
    """The artifact store refused or corrupted an operation."""


class StoreUnavailable(StoreError, TransientError):
    """The artifact store's client failed in a way the same call may not (store_error decides from the error)."""


def store_error(message: str, err: BaseException) -> StoreError:
    """The store wrapper's error for a client error it caught: StoreUnavailable where a retry may succeed."""
    return StoreUnavailable(message) if client_error_is_transient(err) else StoreError(message)


# Exception type names that mean "the network hiccuped, the same call may succeed": requests, httpx, urllib3,
# botocore and the standard library each have their own.
_TRANSIENT_TYPES = frozenset({
    "ConnectionError", "ConnectionResetError", "ConnectionRefusedError", "ConnectionAbortedError", "BrokenPipeError",
    "TimeoutError", "ConnectTimeout", "ReadTimeout", "Timeout", "ConnectError", "ReadError", "WriteError",
    "RemoteProtocolError", "PoolTimeout", "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
    "ConnectionClosedError", "ProtocolError", "ChunkedEncodingError", "IncompleteRead", "IncompleteReadError",
    "ResponseStreamingError",
})
# Error codes that mean "slow down" or "try later": S3 (botocore), AWS APIs in general, MLflow's REST errors.
_TRANSIENT_CODES = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "InternalError", "ServiceUnavailable",
    "RequestTimeTooSkewed", "RequestLimitExceeded", "TooManyRequests", "RequestThrottled",
    "ProvisionedThroughputExceededException", "RESOURCE_EXHAUSTED", "REQUEST_LIMIT_EXCEEDED",
    "TEMPORARILY_UNAVAILABLE",
})
# What an MlflowException's text says when the server or its database was briefly unavailable; a locked SQLite
# file is MLflow's local backend under concurrent runs.
_TRANSIENT_MLFLOW_TEXT = ("api request to", "database is locked", "connection refused", "connection reset",
                          "connection aborted", "max retries exceeded", "timed out", "temporarily unavailable",
                          "remote end closed")


def is_transient(err: BaseException) -> bool:
    """True for errors worth a retry: our own wrappers' TransientError (StoreUnavailable, SourceUnreachable), or a
    client's error they let through (`client_error_is_transient`); False for everything a retry cannot fix (bad
    input, a missing object, a permission error, a failed gate, integrity errors). Looks through the chain, since
    clients wrap what they caught. The one classifier for Prefect task retries (tasks/_retry.py),
    `retry.retry_transient` and `pull`."""
    return any(isinstance(e, TransientError) or client_error_is_transient(e) for e in exception_chain(err))


def client_error_is_transient(e: BaseException) -> bool:
    """One third-party client's error (requests, httpx, urllib3, botocore, MLflow, sqlite) that a retry may fix:
    a connection or timeout error, HTTP 429/5xx, a throttling code, a locked SQLite file. The wrappers ask it of
    what they caught; MLflow's client errors, whose type does not say, are read by their code and text here only."""
    name = type(e).__name__
    if name in _TRANSIENT_TYPES or isinstance(e, (ConnectionError, TimeoutError)):
        return True
    if name == "OperationalError":  # sqlite3 / SQLAlchemy: only a lock is worth waiting for
        return "locked" in str(e).lower()
    response = getattr(e, "response", None)
    if isinstance(response, dict):  # botocore ClientError
        code = response.get("Error", {}).get("Code", "")
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        return code in _TRANSIENT_CODES or status >= 500 or status == 429
    status = getattr(response, "status_code", None)
    if isinstance(status, int) and (status == 429 or status >= 500):
        return True
    error_code = getattr(e, "error_code", None)
    if name == "MlflowException" or isinstance(error_code, str):
        if error_code in _TRANSIENT_CODES:
            return True
        text = str(e).lower()
        if any(t in text for t in _TRANSIENT_MLFLOW_TEXT):
            return True
        http_status = getattr(e, "get_http_status_code", lambda: 0)()
        return isinstance(http_status, int) and (http_status >= 500 or http_status == 429)
    return False


def exception_chain(err: BaseException, limit: int = 10) -> list[BaseException]:
    """The error and what it wraps (`__cause__`, else `__context__`): clients wrap the error they caught."""
    seen: list[BaseException] = []
    cur: BaseException | None = err
    while cur is not None and cur not in seen and len(seen) < limit:
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    return seen


class ReferenceRefused(PipelineError):
    """A unit cannot be judged: its sibling reference is rejected, unpublished or has no answers for its prompts."""


class DiskFull(PipelineError):
    """A write failed for lack of space (or quota): the message names the file and its filesystem's free space."""


def disk_full_message(path: str | Path, fix: str) -> str:
    try:
        st = os.statvfs(Path(path).parent if not Path(path).is_dir() else path)
        free = f"{st.f_bavail * st.f_frsize / 2**20:.1f} MiB free there"
    except OSError:
        free = "free space unknown"
    return f"no space left on device writing {path} ({free}); {fix}"


@contextlib.contextmanager
def naming_full_disk(path: str | Path, fix: str) -> Iterator[None]:
    """An ENOSPC/EDQUOT inside the block becomes DiskFull naming `path` (the OSError alone names no file)."""
    try:
        yield
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFull(disk_full_message(path, fix)) from err
        raise


def first_problem(err: ValidationError) -> tuple[str, str]:
    """A pydantic error's first problem as (dotted field path, message): for one-line refusals."""
    first = err.errors()[0]
    return ".".join(str(p) for p in first["loc"]), first["msg"]
