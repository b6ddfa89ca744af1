"""One error hierarchy for the whole pipeline.

Every error a user can cause or fix carries a one-line message that names the thing and the fix.
The CLI maps `InputError` subclasses to exit code 2 and `PipelineError` subclasses to exit code 1,
and prints a traceback only with `--verbose`.
"""

from __future__ import annotations

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
        self.problems = problems
        self.source = source
        lines = [f"  {path}: {msg}" for path, msg in problems]
        super().__init__(f"{source} is invalid ({len(problems)} problem(s)):\n" + "\n".join(lines))


class SourceError(InputError):
    """The model source cannot be resolved (bad URI, unknown repo or revision, unreachable endpoint)."""


class PreflightError(InputError):
    """A unit cannot succeed on its target (precision vs arch, memory budget, ...)."""


class PipelineError(EngineFoundryError):
    """A stage failed while running."""


class ToolError(PipelineError):
    """An external tool (server, benchmark client, converter) failed or is missing."""


class StoreError(PipelineError):
    """The artifact store refused or corrupted an operation."""


# Exception type names that mean "the network hiccuped, the same call may succeed": requests, httpx, urllib3,
# botocore and the standard library each have their own.
_TRANSIENT_TYPES = frozenset({
    "ConnectionError", "ConnectionResetError", "ConnectionRefusedError", "ConnectionAbortedError", "BrokenPipeError",
    "TimeoutError", "ConnectTimeout", "ReadTimeout", "ConnectError", "ReadError", "WriteError", "RemoteProtocolError",
    "PoolTimeout", "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError",
    "ProtocolError", "ChunkedEncodingError", "IncompleteRead", "IncompleteReadError", "ResponseStreamingError",
})
_TRANSIENT_S3_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "InternalError",
                                 "ServiceUnavailable", "RequestTimeTooSkewed"})


def is_transient(err: BaseException) -> bool:
    """True for errors worth a retry (a connection refused or reset, a timeout, HTTP 429/5xx, S3 throttling, an
    unreachable MLflow or hub); False for everything a retry cannot fix (bad input, a failed gate, integrity
    errors). Looks through the chain, since clients wrap what they caught."""
    for e in exception_chain(err):
        name = type(e).__name__
        if name in _TRANSIENT_TYPES:
            return True
        response = getattr(e, "response", None)
        if isinstance(response, dict):  # botocore ClientError
            code = response.get("Error", {}).get("Code", "")
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if code in _TRANSIENT_S3_CODES or status >= 500:
                return True
        status = getattr(response, "status_code", None)
        if isinstance(status, int) and (status == 429 or status >= 500):
            return True
        text = str(e)
        if name == "MlflowException" and ("API request to" in text or "TEMPORARILY_UNAVAILABLE" in text):
            return True
        if isinstance(e, SourceError) and "cannot reach" in text:
            return True
        if isinstance(e, StoreError) and any(word in text for word in (*_TRANSIENT_TYPES, *_TRANSIENT_S3_CODES)):
            return True  # the store names the client error it wrapped
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
