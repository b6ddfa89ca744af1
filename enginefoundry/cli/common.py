"""What the commands share: the global options, loading a spec with its effective destinations, `--json`
output, and quiet Prefect defaults."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TextIO
from urllib.parse import urlsplit

from pydantic import BaseModel

from enginefoundry.settings import Destinations, EnvSettings, absolute_mlflow, effective_spec
from enginefoundry.spec import BuildSpec, load_spec
from enginefoundry.spec.outputs import TrackingSpec

if TYPE_CHECKING:
    from enginefoundry.flows.prefect_server.ephemeral import EarlyServer
    from enginefoundry.search.plan import SearchReport

DEFAULT_MLFLOW = TrackingSpec().mlflow_uri


def global_options(*, suppress: bool) -> argparse.ArgumentParser:
    """`-v/--verbose` and `--json`, accepted before or after the subcommand. The copy added to each subcommand
    uses SUPPRESS defaults, so a subcommand without the flag does not reset what the top level parsed."""
    parent = argparse.ArgumentParser(add_help=False)
    default_false: str | bool = argparse.SUPPRESS if suppress else False
    parent.add_argument("-v", "--verbose", action="store_true", default=default_false,
                        help="show tracebacks and details")
    parent.add_argument("--json", action="store_true", default=default_false,
                        help="machine-readable output on stdout (JSON)")
    return parent


def destination_flags(parser: argparse.ArgumentParser, *, mlflow: bool = True) -> None:
    """--store, --s3-endpoint-url and (optionally) --mlflow-uri: the highest rank of enginefoundry.settings."""
    parser.add_argument("--store", help="artifact store, overrides $EF_STORE and publish.store "
                                        "(s3://bucket/prefix or file://path)")
    parser.add_argument("--s3-endpoint-url", help="S3 endpoint, overrides $AWS_ENDPOINT_URL_S3 and "
                                                  "publish.s3_endpoint_url")
    if mlflow:
        parser.add_argument("--mlflow-uri", help="MLflow tracking URI, overrides $MLFLOW_TRACKING_URI and "
                                                 "tracking.mlflow_uri")


def load(path: str, args: argparse.Namespace | None = None) -> tuple[BuildSpec, Destinations]:
    """The spec with its effective store, MLflow URI and S3 endpoint (flag > environment > spec > default), and
    with what its `search` section decided written in as ordinary units."""
    spec, dest, _ = load_searched(path, args)
    return spec, dest


def load_searched(path: str, args: argparse.Namespace | None = None,
                  ) -> tuple[BuildSpec, Destinations, SearchReport | None]:
    """`load`, and the search report (None without a `search` section)."""
    spec, dest = effective_spec(load_spec(path), store=getattr(args, "store", None),
                                mlflow_uri=getattr(args, "mlflow_uri", None),
                                s3_endpoint_url=getattr(args, "s3_endpoint_url", None))
    if spec.search is None:
        return spec, dest, None
    from enginefoundry.console import say
    from enginefoundry.search.plan import materialise

    spec, report = materialise(spec, getattr(args, "targets", None), progress=say)
    return spec, dest, report


def mlflow_uri_of(args: argparse.Namespace) -> str:
    """For commands without a spec: --mlflow-uri > $MLFLOW_TRACKING_URI > the default (working directory)."""
    uri = getattr(args, "mlflow_uri", None) or EnvSettings.read().mlflow_tracking_uri or DEFAULT_MLFLOW
    return absolute_mlflow(uri, Path.cwd())


def wants_json(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "json", False))


_JSON_STREAM: list[TextIO] = []  # the real stdout while `--json` sends everything else to stderr


@contextlib.contextmanager
def json_mode(enabled: bool) -> Iterator[None]:
    """With `--json`, stdout carries exactly one JSON document: progress, tables and prints go to stderr."""
    if not enabled:
        yield
        return
    from enginefoundry.console import console

    # Rich's `console.file` reads as the current sys.stdout when none was set: keep the unset state (None), so a
    # later command in this process (tests) does not write to a stream that was captured here and closed since.
    real, previous_file = sys.stdout, console._file
    _JSON_STREAM.append(real)
    console.file = sys.stderr
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        console._file = previous_file  # the setter's own assignment (rich Console.file), None included
        _JSON_STREAM.pop()


def emit_json(data: object) -> None:
    """One JSON document on stdout (pydantic models and lists of them included), for `--json`. Other commands'
    modules (verify, pull, …) use it too."""

    def default(obj: object) -> object:
        if isinstance(obj, BaseModel):
            return obj.model_dump(mode="json")
        return str(obj)

    out = _JSON_STREAM[-1] if _JSON_STREAM else sys.stdout
    out.write(json.dumps(data, indent=2, default=default) + "\n")
    out.flush()


def network_hint(err: BaseException) -> str | None:
    """An unreachable endpoint, named with the variable that sets it; None when the error is not one. Walks the
    exception chain: MLflow and boto3 wrap the connection error they got."""
    from enginefoundry.errors import exception_chain

    for e in exception_chain(err):
        kind = type(e).__name__
        if kind in ("EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError"):
            raw = urlsplit(str(getattr(e, "kwargs", {}).get("endpoint_url", "")))
            url = f"{raw.scheme}://{raw.netloc}" if raw.netloc else "the S3 endpoint"
            return (f"cannot reach S3 at {url}: set AWS_ENDPOINT_URL_S3 (or --s3-endpoint-url, "
                    "publish.s3_endpoint_url) to a reachable endpoint")
        text = str(e)
        if kind == "MlflowException" and "API request to" in text:
            url = text.split("API request to", 1)[1].split()[0]
            return (f"cannot reach MLflow at {url}: set MLFLOW_TRACKING_URI (or --mlflow-uri, "
                    "tracking.mlflow_uri) to a reachable tracking server")
        if kind in ("ConnectError", "ConnectTimeout") and getattr(e, "_request", None) is not None:
            url = str(e.request.url)  # type: ignore[attr-defined]
            env = EnvSettings.read()
            if (env.hf_endpoint and url.startswith(env.hf_endpoint.rstrip("/"))) or "huggingface.co" in url:
                return f"cannot reach the Hugging Face Hub at {url}: set HF_ENDPOINT to a reachable hub or mirror"
            if env.prefect_api_url and url.startswith(env.prefect_api_url.rstrip("/")):
                return f"cannot reach the Prefect API at {url}: set PREFECT_API_URL to a running server"
    return None


def quiet_prefect_defaults() -> None:
    """Embedded mode on a closed network: no telemetry lookups; the temporary Prefect server dies with us. The
    ephemeral API server gets 120 s to start instead of Prefect's 20 s: on a busy 2-core host it took longer
    (measured: a plain flow failed with "Timed out while attempting to connect to ephemeral Prefect API server"
    after 20 s at load average 10)."""
    quiet_prefect_environment()
    from enginefoundry.flows.prefect_server.ephemeral import guard_ephemeral_prefect_server

    guard_ephemeral_prefect_server()
    install_exit_handlers()


def quiet_prefect_environment() -> None:
    """quiet_prefect_defaults' settings, as environment variables only (Prefect and its servers read them)."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


def start_prefect_early() -> EarlyServer | None:
    """quiet_prefect_defaults, with the temporary Prefect API server started first (when no PREFECT_API_URL is
    set), before anything imports Prefect: its start-up (~10 s on a fresh PREFECT_HOME: Prefect's server
    imports and database migrations) overlaps the caller's imports and preparation. The caller hands it to
    Prefect with `EarlyServer.adopt` before the first flow; a server that cannot be adopted is stopped and
    Prefect starts its own as before."""
    quiet_prefect_environment()
    from enginefoundry.flows.prefect_server.ephemeral import start_early_server

    server = start_early_server()
    quiet_prefect_defaults()
    return server


def install_exit_handlers() -> None:
    """SIGTERM exits through `finally` and atexit (servers stopped, MLflow runs ended KILLED), installed before
    any flow starts: Prefect 3.9.1's flow engine swaps in its own SIGTERM handler for the run and, on
    TerminationSignal, restores the handler it found and re-sends the signal to it (`capture_sigterm`,
    prefect/utilities/engine/__init__.py@3.9.1). Found at that moment, SIG_DFL would end the process with no
    cleanup at all."""
    from enginefoundry.runner import install_signal_policy

    install_signal_policy()
