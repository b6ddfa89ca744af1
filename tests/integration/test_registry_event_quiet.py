"""`enginefoundry rollback`/`promote` send their registry event and exit without Prefect's exit-time drain
printing "Still processing items: 1 items remaining..." (issue 25): the event is sent before the command returns."""

from __future__ import annotations

import subprocess
import sys

from tests.support.paths import REPO

SEND = """
from enginefoundry.tasks.events import emit_registry_move
print("sent" if emit_registry_move("quiet-model", "cpu", "rolled back", "1", "2", "probe", outside_flows=True)
      else "not sent")
"""


def test_a_registry_event_from_the_cli_leaves_nothing_to_drain(stack: dict[str, str]) -> None:
    env = {**stack, "PYTHONPATH": str(REPO), "PREFECT_API_URL": stack["PREFECT_API_URL"]}
    done = subprocess.run([sys.executable, "-c", SEND], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "sent" in done.stdout.split(), out
    assert "Still processing items" not in out, out
