"""The SIGTERM handlers the runner and the model server install wrap the previous handler once: installing again
(every flow run, every server start) leaves the handler in place instead of stacking another layer."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator

import pytest

from enginefoundry.model_server import _install_sigterm_handler
from enginefoundry.runner import install_sigterm_as_exit


@pytest.fixture
def sigterm_restored() -> Iterator[None]:
    assert threading.current_thread() is threading.main_thread(), "signal handlers are installed from the main thread"
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize("install", [install_sigterm_as_exit, _install_sigterm_handler])
def test_a_second_install_keeps_the_first_handler(install: Callable[[], None], sigterm_restored: None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    install()
    first = signal.getsignal(signal.SIGTERM)
    assert callable(first)
    install()
    assert signal.getsignal(signal.SIGTERM) is first


def test_the_server_handler_wraps_the_exit_handler_once(sigterm_restored: None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    install_sigterm_as_exit()
    exit_handler = signal.getsignal(signal.SIGTERM)
    _install_sigterm_handler()
    server_handler = signal.getsignal(signal.SIGTERM)
    assert server_handler is not exit_handler and callable(server_handler)
    _install_sigterm_handler()
    assert signal.getsignal(signal.SIGTERM) is server_handler
