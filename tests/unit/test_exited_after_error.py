"""After a connection error, a server is reported dead once its process has exited, even if that takes a while."""

from __future__ import annotations

import time

from enginefoundry.runner import exited_after_error


def test_a_process_that_exits_during_the_grace_period_counts_as_dead() -> None:
    answers = iter([True, True, True, False])  # still running for three looks: the kernel has not reaped it yet
    assert exited_after_error(lambda: next(answers), grace_s=10, poll_s=0.001)


def test_a_process_that_keeps_running_is_alive_after_the_grace_period() -> None:
    t0 = time.monotonic()
    assert not exited_after_error(lambda: True, grace_s=0.05, poll_s=0.01)
    assert time.monotonic() - t0 >= 0.05


def test_an_exited_process_is_dead_at_once() -> None:
    t0 = time.monotonic()
    assert exited_after_error(lambda: False, grace_s=10)
    assert time.monotonic() - t0 < 1
