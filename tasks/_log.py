"""Progress output from inside tasks: the Prefect run logger when there is one, else the console."""

from __future__ import annotations

from collections.abc import Callable

from enginefoundry.console import say


def progress_logger() -> Callable[[str], None]:
    try:
        from prefect import get_run_logger

        logger = get_run_logger()
    except Exception:
        return say

    def log(message: str) -> None:
        logger.info(message)

    return log
