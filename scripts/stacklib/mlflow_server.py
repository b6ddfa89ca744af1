"""The MLflow tracking server: sqlite backend in the state dir, artifacts in the stack's S3."""

from __future__ import annotations

from stacklib.net import HOST, http_status
from stacklib.s3 import REGION
from stacklib.supervisor import Context, Outcome, child_env, executable, launch


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
        "--backend-store-uri",
        f"sqlite:///{ctx.state.root / 'mlflow.db'}",
        "--artifacts-destination",
        "s3://mlflow/artifacts",
    ]
    env = child_env(
        ctx.state,
        {
            **ctx.creds,
            "AWS_DEFAULT_REGION": REGION,
            "MLFLOW_S3_ENDPOINT_URL": ctx.url("s3"),
            # The huey job runner is a second ~270 MB process and doubles start time; nothing here uses it.
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        },
    )
    return launch(ctx, "mlflow", lambda: argv, env, lambda: http_status(ctx.url("mlflow") + "/health") == 200)
