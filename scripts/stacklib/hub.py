"""The loopback Hugging Face hub of the tests (tests/services/hub_server.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from stacklib.net import HOST, http_status
from stacklib.state import StackError
from stacklib.supervisor import Context, Outcome, child_env, launch

REPO_ROOT = Path(__file__).resolve().parents[2]


HUB_SCRIPT = REPO_ROOT / "tests" / "services" / "hub_server.py"


def start_hub(ctx: Context) -> Outcome:
    if not HUB_SCRIPT.exists():
        raise StackError(f"hub: {HUB_SCRIPT.relative_to(REPO_ROOT)} does not exist")
    argv = [
        sys.executable,
        str(HUB_SCRIPT),
        "--root",
        str(ctx.state.root / "hub"),
        "--host",
        HOST,
        "--port",
        str(ctx.ports["hub"]),
    ]
    return launch(
        ctx,
        "hub",
        lambda: argv,
        child_env(ctx.state, {}),
        lambda: http_status(ctx.url("hub") + "/") is not None,
    )
