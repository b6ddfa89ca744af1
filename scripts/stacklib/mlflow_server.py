"""The MLflow tracking server: its backend store in the stack's PostgreSQL, artifacts in the stack's S3."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

from stacklib.net import HOST, http_status
from stacklib.postgres import cluster
from stacklib.s3 import REGION
from stacklib.state import StackError, write_private
from stacklib.supervisor import Context, Outcome, child_env, executable, launch, owned_members

# The MLflow release that last migrated the stack's database. The server creates the schema of an empty database
# itself (SqlAlchemyStore._initialize_tables), but refuses one an older release made until `mlflow db upgrade`
# has run ("How to Upgrade MLflow": https://mlflow.org/docs/latest/self-hosting/migration), so after an upgrade the
# stack runs it before the server starts.
SCHEMA_RELEASE_FILE = "mlflow-db-release"
# `mlflow db upgrade URL` in-process, so the URL (and its password) is no command-line argument.
UPGRADE = "import os, sys; from mlflow.db import upgrade; upgrade.main([os.environ['MLFLOW_BACKEND_STORE_URI']])"


def start_mlflow(ctx: Context) -> Outcome:
    argv = [
        executable("mlflow"),
        "server",
        "--host",
        HOST,
        "--port",
        str(ctx.ports["mlflow"]),
        "--workers",
        "1",
        "--artifacts-destination",
        "s3://mlflow/artifacts",
    ]
    env = child_env(
        ctx.state,
        {
            **ctx.creds,
            "AWS_DEFAULT_REGION": REGION,
            "MLFLOW_S3_ENDPOINT_URL": ctx.url("s3"),
            # mlflow server's --backend-store-uri, from the environment so no password is on its command line.
            # The driver named: SQLAlchemy 2.1 takes psycopg (3) for a bare postgresql://, 2.0 took psycopg2.
            "MLFLOW_BACKEND_STORE_URI": cluster(ctx.state, ctx.ports["postgres"]).url("mlflow", "postgresql+psycopg"),
            # The huey job runner is a second ~270 MB process and doubles start time; nothing here uses it.
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        },
    )
    release = importlib.metadata.version("mlflow")
    marker = ctx.state.root / SCHEMA_RELEASE_FILE
    previous = marker.read_text().strip() if marker.exists() else None
    if previous not in (None, release) and not owned_members(ctx.state, ctx.state.read_pid("mlflow")):
        upgrade_schema(ctx, env, previous, release)
    outcome = launch(ctx, "mlflow", lambda: argv, env, lambda: http_status(ctx.url("mlflow") + "/health") == 200)
    write_private(marker, release + "\n")
    return outcome


def upgrade_schema(ctx: Context, env: dict[str, str], previous: str | None, release: str) -> None:
    done = subprocess.run([sys.executable, "-c", UPGRADE], env=env, cwd=ctx.state.root, capture_output=True,
                          text=True, timeout=900)
    with ctx.state.log_file("mlflow").open("a") as log:
        log.write(f"\n=== mlflow db upgrade ({previous} -> {release}) -> rc {done.returncode}\n"
                  f"{done.stdout}{done.stderr}")
    if done.returncode != 0:
        raise StackError(f"mlflow: `mlflow db upgrade` from {previous} to {release} failed (rc {done.returncode}); "
                         f"log {ctx.state.log_file('mlflow')}")
