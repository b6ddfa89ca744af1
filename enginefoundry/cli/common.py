"""What the commands share: loading a spec with command-line overrides, and quiet Prefect defaults."""

from __future__ import annotations

import os

from enginefoundry.spec import BuildSpec, load_spec
from enginefoundry.spec.outputs import TrackingSpec

DEFAULT_MLFLOW = TrackingSpec().mlflow_uri


def load(path: str, overrides: dict[str, str | None] | None = None) -> BuildSpec:
    spec = load_spec(path)
    if overrides:
        publish = spec.publish.model_copy(update={"store": overrides["store"]}) if overrides.get("store") else None
        tracking = (spec.tracking.model_copy(update={"mlflow_uri": overrides["mlflow_uri"]})
                    if overrides.get("mlflow_uri") else None)
        spec = spec.model_copy(update={k: v for k, v in (("publish", publish), ("tracking", tracking)) if v})
    return spec


def quiet_prefect_defaults() -> None:
    """Embedded mode on a closed network: no telemetry lookups; the temporary Prefect server dies with us. The
    ephemeral API server gets 120 s to start instead of Prefect's 20 s: on a busy 2-core host it took longer
    (measured: a plain flow failed with "Timed out while attempting to connect to ephemeral Prefect API server"
    after 20 s at load average 10)."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    from enginefoundry.flows.ephemeral import guard_ephemeral_prefect_server

    guard_ephemeral_prefect_server()
