"""After a command that loaded Prefect, the command line ends its process itself (enginefoundry.cli.exit_now): the
exit code is the command's, what it printed is all there (stdout and stderr flushed), and the atexit handlers and
non-daemon threads ran first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# The real entry point (main() without argv), with an atexit handler and a non-daemon thread of the caller's.
_ENTRY = """
import atexit, sys, threading, time
from pathlib import Path
out = Path(sys.argv[1])
atexit.register(lambda: (out / "atexit").write_text("ran"))
def late():
    time.sleep(0.5)
    (out / "thread").write_text("ran")
threading.Thread(target=late).start()
sys.argv = ["enginefoundry", *sys.argv[2:]]
import prefect  # noqa: F401  (as after a flow: main() then ends the process itself)
from enginefoundry.cli import main
main()
(out / "after-main").write_text("main returned")
"""


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", _ENTRY, str(tmp_path), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def test_exit_code_output_and_cleanup_of_a_failing_command(tmp_path: Path) -> None:
    done = _run(tmp_path, "validate", str(tmp_path / "missing.yaml"), "--json")
    assert done.returncode == 2, done.stderr
    assert json.loads(done.stdout)["ok"] is False
    assert "does not exist" in done.stderr
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "thread").read_text() == "ran"
    assert not (tmp_path / "after-main").exists()  # the process ended inside main()


def test_exit_code_and_output_of_a_passing_command(tmp_path: Path) -> None:
    done = _run(tmp_path, "plan", "configs/tiny-cpu.yaml", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["spec"] == "tiny-cpu"
    assert (tmp_path / "atexit").read_text() == "ran"
