"""The Prefect server with its UI, and the Prefect settings its clients and workers share."""

from __future__ import annotations

from stacklib.net import HOST, http_status
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
    # PREFECT_SERVER_LOG_RETRYABLE_ERRORS: the server's log names the SQLite error behind each 503 it answers
    # ("database is locked", SQLITE_BUSY_SNAPSHOT; prefect/server/api/server.py 3.9.1,
    # custom_internal_exception_handler), which it otherwise answers without a line. Prefect's clients (the CLI,
    # workers, flows) send those requests again; the UI shows "Oops. Something went wrong." and a second Submit
    # goes through (docs/cluster-mode.md, after "Tasks that cross the network").
    env = child_env(ctx.state, {**prefect_env(ctx), "PREFECT_SERVER_UI_ENABLED": "true",
                                "PREFECT_SERVER_LOG_RETRYABLE_ERRORS": "true"})
    return launch(ctx, "prefect", lambda: argv, env, lambda: http_status(ctx.url("prefect") + "/api/health") == 200)
