"""The Prefect server with its UI, and the Prefect settings its clients and workers share."""

from __future__ import annotations

from stacklib.net import HOST, http_status
from stacklib.postgres import cluster
from stacklib.supervisor import Context, Outcome, child_env, executable, launch


def prefect_env(ctx: Context) -> dict[str, str]:
    """Shared by the server, the CLI and the workers: a private PREFECT_HOME keeps ~/.prefect profiles (which
    may point at Prefect Cloud) out of the picture."""
    return {
        "PREFECT_HOME": str(ctx.state.root / "prefect"),
        "PREFECT_API_URL": ctx.url("prefect") + "/api",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }


def start_prefect(ctx: Context) -> Outcome:
    argv = [
        executable("prefect"),
        "server",
        "start",
        "--host",
        HOST,
        "--port",
        str(ctx.ports["prefect"]),
        "--analytics-off",
    ]
    # The database: the stack's PostgreSQL (postgres.py), through the environment so the password is on no command
    # line. Prefect migrates it as it starts (PREFECT_SERVER_DATABASE_MIGRATE_ON_START, default on). On SQLite this
    # server answered 503 for "database is locked" under concurrent writes (docs/facts/infra.md §3.7); on
    # PostgreSQL the hammer gets none (benchmarks/prefect_hammer.py).
    # PREFECT_SERVER_LOG_RETRYABLE_ERRORS: the server's log names the error behind any 503 it still answers
    # (prefect/server/api/server.py 3.9.1, custom_internal_exception_handler: a dropped database connection, say),
    # which it otherwise answers without a line.
    database = cluster(ctx.state, ctx.ports["postgres"]).url("prefect", driver="postgresql+asyncpg")
    env = child_env(ctx.state, {**prefect_env(ctx), "PREFECT_SERVER_UI_ENABLED": "true",
                                "PREFECT_SERVER_DATABASE_CONNECTION_URL": database,
                                "PREFECT_SERVER_LOG_RETRYABLE_ERRORS": "true"})
    return launch(ctx, "prefect", lambda: argv, env, lambda: http_status(ctx.url("prefect") + "/api/health") == 200)
