"""A cancelled test session leaves no process of the cluster tests' private stack (issue 25: a terminated
`make test` left a Prefect server and three Prefect workers running, twice out of twice).

A child pytest session takes the suite's own `cluster` fixture (tests/support/cluster.py: a Prefect server of
its own, the deployments, a process worker on each of three pools), says it is ready, and is then cancelled as
CI or a person cancels `make test`: SIGTERM or SIGINT to its whole process group. Every process of that stack
carries a marker in its environment; none may be left.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from tests.support.paths import REPO
from tests.support.processes import marked_processes, poll

HOLD = """
import os
import time
from pathlib import Path


def test_hold(cluster):
    Path(os.environ["EF_CANCEL_READY"]).write_text(str(sorted(cluster.workers)))
    time.sleep(3600)
"""


def _sigint_as_in_a_terminal() -> None:
    """Ctrl-C reaches a terminal's foreground job: the child starts with SIGINT's default action whatever this
    session inherited. A suite started in the background (`bash .ci/run &`, no job control) inherits SIGINT
    ignored, and a Python started with SIGINT ignored installs no KeyboardInterrupt handler: the child then slept
    through the test's Ctrl-C (both sigint cases failed a fresh-clone run started that way)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stopping(marker: str) -> bool:
    """The session's teardown runs `stack.py down` (its cluster fixtures' finally) and has stopped a worker."""
    running = marked_processes("EF_CANCEL_MARK", marker)
    return any("stack.py down" in p for p in running) and sum(" worker start " in p for p in running) < 3


@pytest.mark.parametrize("cancel", ["sigterm", "sigint", "sigint-twice"])
def test_a_cancelled_session_leaves_no_cluster_process(stack: dict[str, str], tmp_path: Path, cancel: str) -> None:
    """sigterm: the session dies at once (no teardown; the owner watch stops the stack). sigint: Ctrl-C, the
    teardown's `down` stops it. sigint-twice: a second Ctrl-C (or a CI runner's follow-up signal) while that
    `down` runs, then SIGKILL of the session: on main that interrupted `down`, which had already stopped the owner
    watch, and left the Prefect server and its three workers running."""
    marker = uuid.uuid4().hex
    (tmp_path / "test_hold.py").write_text(HOLD)
    ready = tmp_path / "ready"
    env = {**stack, "PYTHONPATH": str(REPO), "EF_CANCEL_MARK": marker, "EF_CANCEL_READY": str(ready)}
    log = (tmp_path / "session.log").open("w")
    # The child's temporary folders (its stack's state dir among them) outside pytest's rotation of
    # /tmp/pytest-of-<user>: a later session on a shared host must not delete them under the running stack.
    basetemp = Path(tempfile.mkdtemp(prefix="ef-cancelled-suite-"))
    # The suite's conftest as a plugin: its `stack` (the services this session uses) and `cluster` fixtures.
    session = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
                                "-q", "-s", "--rootdir", str(tmp_path), "--basetemp", str(basetemp / "t"),
                                str(tmp_path / "test_hold.py")],
                               cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                               preexec_fn=_sigint_as_in_a_terminal)
    try:
        assert poll(lambda: ready.exists() or session.poll() is not None, timeout_s=900, interval_s=1), \
            "the child session did not get its cluster in 900 s"
        assert ready.exists(), (tmp_path / "session.log").read_text()[-3000:]
        running = marked_processes("EF_CANCEL_MARK", marker)
        assert sum(" worker start " in p for p in running) == 3, running
        assert any("prefect" in p and " server start" in p for p in running), running

        # The whole group, as a CI cancel or Ctrl-C in the terminal does.
        os.killpg(session.pid, signal.SIGTERM if cancel == "sigterm" else signal.SIGINT)
        if cancel == "sigint-twice":
            assert poll(lambda: stopping(marker), timeout_s=120, interval_s=0.05), "no `down` in the teardown"
            os.killpg(session.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                session.wait(timeout=30)  # whatever it still does after that, the runner kills it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(session.pid, signal.SIGKILL)
        session.wait(timeout=300)
        left = lambda: marked_processes("EF_CANCEL_MARK", marker)  # noqa: E731
        assert poll(lambda: not left(), timeout_s=180, interval_s=1), left()
    finally:
        if session.poll() is None:
            os.killpg(session.pid, signal.SIGKILL)
        for line in marked_processes("EF_CANCEL_MARK", marker):  # never leave them, even when the test fails
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(line.split()[0]), signal.SIGKILL)
        log.close()
        shutil.rmtree(basetemp, ignore_errors=True)
