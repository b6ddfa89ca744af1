"""What the commands share: the global options, loading a spec with its effective destinations, `--json`
output, and quiet Prefect defaults."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from enginefoundry.settings import Destinations, EnvSettings, absolute_mlflow, effective_spec
from enginefoundry.spec import BuildSpec, load_spec
from enginefoundry.spec.outputs import TrackingSpec

DEFAULT_MLFLOW = TrackingSpec().mlflow_uri


def global_options(*, suppress: bool) -> argparse.ArgumentParser:
    """`-v/--verbose` and `--json`, accepted before or after the subcommand. The copy added to each subcommand
    uses SUPPRESS defaults, so a subcommand without the flag does not reset what the top level parsed."""
    parent = argparse.ArgumentParser(add_help=False)
    default_false: Any = argparse.SUPPRESS if suppress else False
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
    """The spec with its effective store, MLflow URI and S3 endpoint (flag > environment > spec > default)."""
    return effective_spec(load_spec(path), store=getattr(args, "store", None),
                          mlflow_uri=getattr(args, "mlflow_uri", None),
                          s3_endpoint_url=getattr(args, "s3_endpoint_url", None))


def mlflow_uri_of(args: argparse.Namespace) -> str:
    """For commands without a spec: --mlflow-uri > $MLFLOW_TRACKING_URI > the default (working directory)."""
    uri = getattr(args, "mlflow_uri", None) or EnvSettings().mlflow_tracking_uri or DEFAULT_MLFLOW
    return absolute_mlflow(uri, Path.cwd())


def wants_json(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "json", False))


def emit_json(data: Any) -> None:
    """One JSON document on stdout (pydantic models and lists of them included), for `--json`."""

    def default(obj: Any) -> Any:
        if isinstance(obj, BaseModel):
            return obj.model_dump(mode="json")
        return str(obj)

    sys.stdout.write(json.dumps(data, indent=2, default=default) + "\n")
    sys.stdout.flush()


def quiet_prefect_defaults() -> None:
    """Embedded mode on a closed network: no telemetry lookups."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
