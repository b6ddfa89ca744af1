"""<state>/env (sourceable) and <state>/env.json: the client settings of the running services."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable

from stacklib.net import HOST
from stacklib.s3 import REGION
from stacklib.state import State, write_private

# The stack's artifact store, in its SeaweedFS: the workers' EF_STORE and the sourced env's, so the CLI after
# `source .stack/env` and a run started from the UI publish to the same place (EF_STORE outranks a spec's store;
# enginefoundry.settings).
STACK_STORE = "s3://enginefoundry/store"


def stack_env(state: State, ports: dict[str, int], creds: dict[str, str], names: Iterable[str]) -> dict[str, str]:
    """Client settings for the given services, in a stable, readable order."""
    names = set(names)
    url = {name: f"http://{HOST}:{port}" for name, port in ports.items()}
    env: dict[str, str] = {}
    if "s3" in names:
        env |= {
            **creds,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ENDPOINT_URL_S3": url["s3"],
            "EF_S3_ENDPOINT": url["s3"],
            "EF_STORE": STACK_STORE,
        }
    if "mlflow" in names:
        env |= {"MLFLOW_S3_ENDPOINT_URL": url["s3"], "MLFLOW_TRACKING_URI": url["mlflow"]}
    if "prefect" in names:
        env |= {
            "PREFECT_API_URL": url["prefect"] + "/api",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_WORKER_QUERY_SECONDS": "2",
        }
    if "hub" in names:
        env |= {"HF_ENDPOINT": url["hub"], "EF_HUB_ROOT": str(state.root / "hub"), "HF_HUB_DISABLE_XET": "1"}
    return env


def write_env_files(state: State, env: dict[str, str]) -> None:
    lines = [f"# written by scripts/stack.py up; source it: . {state.root}/env"]
    lines += [f"export {key}={shlex.quote(value)}" for key, value in env.items()]
    write_private(state.root / "env", "\n".join(lines) + "\n")
    write_private(state.root / "env.json", json.dumps(env, indent=2) + "\n")
