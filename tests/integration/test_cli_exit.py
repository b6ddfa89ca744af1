"""`enginefoundry`'s exit (cli.entry): main()'s exit code, then what CPython's own exit does before it frees
memory, in its order: other non-daemon threads joined, atexit handlers run, stdout flushed."""

from __future__ import annotations

import subprocess
import sys

from tests.support.paths import REPO

SCRIPT = """
import atexit, sys, threading, time
from enginefoundry import cli

def late():
    time.sleep(0.5)
    print("thread finished", flush=False)

threading.Thread(target=late).start()  # non-daemon: the exit waits for it, as CPython's would
atexit.register(lambda: print("atexit ran", end="", flush=False))  # unflushed: the exit flushes stdout
sys.argv = ["enginefoundry", "validate", "no-such-spec.yaml"]
cli.entry()
print("never reached")
"""


def test_entry_exits_with_mains_code_after_threads_and_atexit_handlers() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr  # a user mistake: exit 2, as main() returns it
    assert "no-such-spec.yaml" in done.stdout + done.stderr and "Traceback" not in done.stderr
    assert done.stdout.endswith("thread finished\natexit ran"), done.stdout
    assert "never reached" not in done.stdout
