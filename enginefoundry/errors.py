"""One error hierarchy for the whole pipeline.

Every error a user can cause or fix carries a one-line message that names the thing and the fix.
The CLI maps `InputError` subclasses to exit code 2 and `PipelineError` subclasses to exit code 1,
and prints a traceback only with `--verbose`.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_PIPELINE = 1
EXIT_INPUT = 2


class EngineFoundryError(Exception):
    """Base class. `exit_code` is what the CLI returns for it."""

    exit_code = EXIT_PIPELINE


class InputError(EngineFoundryError):
    """The user asked for something invalid: fix the input, nothing ran."""

    exit_code = EXIT_INPUT


class SpecError(InputError):
    """The build spec is invalid. `problems` lists every problem at once as (field path, message)."""

    def __init__(self, problems: list[tuple[str, str]], source: str = "spec") -> None:
        self.problems = problems
        self.source = source
        lines = [f"  {path}: {msg}" for path, msg in problems]
        super().__init__(f"{source} is invalid ({len(problems)} problem(s)):\n" + "\n".join(lines))


class SourceError(InputError):
    """The model source cannot be resolved (bad URI, unknown repo or revision, unreachable endpoint)."""


class PreflightError(InputError):
    """A unit cannot succeed on its target (precision vs arch, memory budget, ...)."""


class PipelineError(EngineFoundryError):
    """A stage failed while running."""


class ToolError(PipelineError):
    """An external tool (server, benchmark client, converter) failed or is missing."""


class StoreError(PipelineError):
    """The artifact store refused or corrupted an operation."""
