"""Progress output from inside tasks: the Prefect run logger when there is one, else the console."""

from __future__ import annotations

import logging
from collections.abc import Callable

from enginefoundry.console import say


def progress_logger(level: str = "info") -> Callable[[str], None]:
    """`level`: "info", or "warning" for what the people watching the run must not miss."""
    try:
        from prefect import get_run_logger

        logger = get_run_logger()
    except Exception:
        return say

    def log(message: str) -> None:
        getattr(logger, level)(message)

    return log


# What Prefect's flow engine logs, with the traceback, when a run's final state is Failed: it asks the state for
# its result, which raises the state's error (prefect/flow_engine.py, run_flow: `error_logger.error("Engine
# execution exited with unexpected exception", exc_info=True)`, prefect 3.9.1; engine.py's handle_engine_signals
# logs "Execution of flow run … exited with unexpected exception" likewise).
_ENGINE_EXIT_MESSAGES = ("Engine execution exited with unexpected exception", "exited with unexpected exception")


class ExpectedFailureFilter(logging.Filter):
    """Drops the engine's traceback record for a run that ended Failed with one of our own errors (a bad input,
    a rejected or failed unit): the state's message already says what happened and what to do, so the run's
    logs in the UI carry no traceback for it. Any other exception is logged as Prefect logs it."""

    def filter(self, record: logging.LogRecord) -> bool:
        from enginefoundry.errors import EngineFoundryError

        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, EngineFoundryError) and str(record.msg).endswith(_ENGINE_EXIT_MESSAGES))


_FILTER = ExpectedFailureFilter()


def quiet_expected_failures() -> None:
    """Install the filter on the loggers Prefect's engine reports through (idempotent); a flow module calls it at
    import, which is how a worker's run process loads it."""
    for name in ("prefect.flow_runs", "prefect.engine"):
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
