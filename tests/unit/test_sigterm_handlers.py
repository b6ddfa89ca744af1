"""One SIGTERM policy (runner.install_sigterm_as_exit): its handler wraps the previous handler once, and installing
again (every flow run, every tool or server start) leaves it in place instead of stacking another layer; the model
server stops its servers through it (runner.on_sigterm), not through a chain of its own."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator

import pytest

from enginefoundry import model_server, runner
from enginefoundry.runner import install_sigterm_as_exit


@pytest.fixture
def sigterm_restored() -> Iterator[None]:
    assert threading.current_thread() is threading.main_thread(), "signal handlers are installed from the main thread"
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_second_install_keeps_the_first_handler(sigterm_restored: None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    install_sigterm_as_exit()
    first = signal.getsignal(signal.SIGTERM)
    assert callable(first)
    install_sigterm_as_exit()
    assert signal.getsignal(signal.SIGTERM) is first


def test_the_one_handler_stops_the_servers_then_runs_the_previous_handler_and_exits(
        sigterm_restored: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The model server registers its stop with the runner's policy; SIGTERM runs it first, then the handler that
    was there before, then exits 143 with the process marked terminating."""
    calls: list[str] = []
    monkeypatch.setattr(runner, "_ON_SIGTERM", [])
    monkeypatch.setattr(runner, "_TERMINATING", threading.Event())
    runner.on_sigterm(lambda: calls.append("stop servers"))
    runner.on_sigterm(model_server.stop_all_servers)
    runner.on_sigterm(model_server.stop_all_servers)  # registering again is a no-op
    assert len(runner._ON_SIGTERM) == 2
    signal.signal(signal.SIGTERM, lambda signum, frame: calls.append("previous"))
    install_sigterm_as_exit()
    handler = signal.getsignal(signal.SIGTERM)
    assert callable(handler)
    with pytest.raises(SystemExit) as ended:
        handler(signal.SIGTERM, None)
    assert ended.value.code == 143 and calls == ["stop servers", "previous"] and runner.terminating()


def test_the_model_server_registers_its_stop_with_the_runners_policy() -> None:
    assert model_server._stop_all in runner._ON_SIGTERM
    assert not hasattr(model_server, "_install_sigterm_handler")  # no second handler chain
