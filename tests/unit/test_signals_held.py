"""runner.signals_held: a SIGTERM/SIGINT that arrives while the main thread forks is delivered after the fork,
never inside it (an exception raised inside Python's at-fork hooks is swallowed and once left logging's lock
held: docs/reliability.md, row 25)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from enginefoundry import runner


@pytest.fixture
def other_thread():
    """A live thread that does not block the signals and keeps taking the GIL, as Prefect's and the log
    handler's threads do: the kernel hands a process-directed signal to it while the main thread blocks them,
    and CPython then runs the Python handler in the main thread at its next bytecode anyway."""
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            time.sleep(0.001)

    t = threading.Thread(target=busy, daemon=True)
    t.start()
    yield t
    stop.set()
    t.join()


def _run_bytecode_for(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pass


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_inside_the_held_block_is_delivered_after_it(other_thread, sig: int) -> None:
    seen: list[str] = []

    class Stop(Exception):
        pass

    def handler(signum: int, frame: object) -> None:
        seen.append(f"handled {signum}")
        raise Stop

    old = signal.signal(sig, handler)
    try:
        with pytest.raises(Stop), runner.signals_held():
            os.kill(os.getpid(), sig)
            _run_bytecode_for(0.3)  # where CPython would run a pending handler
            seen.append("block ran to its end")
        assert seen == ["block ran to its end", f"handled {sig}"]
        assert signal.getsignal(sig) is handler, "the handler in place before the block is back"
    finally:
        signal.signal(sig, old)


def test_sigterm_held_sets_the_terminating_flag_at_once(other_thread, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "_TERMINATING", threading.Event())
    flags: list[bool] = []
    old = signal.signal(signal.SIGTERM, lambda *_: flags.append(runner.terminating()))
    try:
        with runner.signals_held():
            os.kill(os.getpid(), signal.SIGTERM)
            deadline = time.monotonic() + 5
            while not runner.terminating() and time.monotonic() < deadline:
                pass
            flags.append(runner.terminating())
        assert flags == [True, True]
    finally:
        signal.signal(signal.SIGTERM, old)


def test_no_signal_no_delivery_and_handlers_restored() -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    with runner.signals_held():
        pass
    assert {s: signal.getsignal(s) for s in before} == before
    assert runner._held_depth == 0


def test_the_one_signal_policy_remembers_sigint_and_keeps_keyboardinterrupt() -> None:
    """runner.install_signal_policy owns SIGINT too (records/tracking reads `interrupted` to end runs KILLED):
    Ctrl-C still raises KeyboardInterrupt, and installing again adds no second handler."""
    before_int, before_term = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    ours = set(runner._EXIT_HANDLERS)
    try:
        runner.install_signal_policy()
        installed = signal.getsignal(signal.SIGINT)
        runner.install_signal_policy()
        assert signal.getsignal(signal.SIGINT) is installed
        assert not runner._INTERRUPTED.is_set()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # the handler runs between bytecodes of the main thread
                pass
        assert runner.interrupted()
    finally:
        signal.signal(signal.SIGINT, before_int)
        signal.signal(signal.SIGTERM, before_term)
        runner._INTERRUPTED.clear()
        runner._EXIT_HANDLERS.clear()
        runner._EXIT_HANDLERS.update(ours)
