"""`enginefoundry`: run, validate and plan build specs; trace published units; roll out, promote and roll
back. This package is the Entry layer: it may call flows and the domain; nothing imports it.

Exit codes: 0 success, 1 pipeline failure, 2 invalid input. User mistakes print one message, no
traceback; `--verbose` shows details. Prefect is imported only by the commands that run flows.

Each command lives in a module of this package with a `register(sub)` function; COMMANDS lists them. The
global options (`-v/--verbose`, `--json`) are added to every subcommand here, so they work before or after it.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import traceback
from collections.abc import Callable, Sequence
from typing import NoReturn

from enginefoundry import __version__
from enginefoundry._startup import exit_now
from enginefoundry.cli.common import emit_json, global_options, json_mode, network_hint
from enginefoundry.console import error
from enginefoundry.errors import EXIT_PIPELINE, EngineFoundryError, disk_full_message, exception_chain

__all__ = ["COMMANDS", "build_parser", "entry", "main"]

COMMANDS = (
    "enginefoundry.cli.build",
    "enginefoundry.cli.fleet",
    "enginefoundry.cli.registry",
    "enginefoundry.cli.lengths",
    "enginefoundry.cli.leases",
    "enginefoundry.cli.store",
    "enginefoundry.cli.completion",
    "enginefoundry.cli.automations",
    "enginefoundry.cli.smoke",
    "enginefoundry.cli.search",
    "enginefoundry.cli.signing",
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="enginefoundry", description=__doc__.splitlines()[0],
                                parents=[global_options(suppress=False)])
    p.add_argument("--version", action="version", version=f"enginefoundry {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for module in COMMANDS:
        importlib.import_module(module).register(sub)
    shared = global_options(suppress=True)
    for subparser in sub.choices.values():
        for action in shared._actions:
            if not any(opt in subparser._option_string_actions for opt in action.option_strings):
                subparser._add_action(action)
    return p


def entry() -> NoReturn:
    """The `enginefoundry` script and `python -m enginefoundry.cli`: `main()`, then an exit without the
    interpreter's teardown.

    A run has torch and transformers loaded (the smoke gate's tokenizer and reference), about 5,600 modules and
    775,000 objects; tearing them down took 2.6 s after the summary was printed, ~12% of a tiny run
    (docs/scale.md, "Start-up and exit tricks"). What an exit must do still happens, in CPython's own order
    (Py_FinalizeEx): other non-daemon threads are joined, the atexit handlers run (servers stopped, MLflow runs
    ended, Prefect's log and event queues drained, logging flushed), stdout and stderr are flushed; only freeing
    memory that the kernel takes back anyway is skipped (`_startup.exit_now`: on a Python it was not measured on,
    the interpreter's own exit). An exception, SystemExit included (SIGTERM's 143), leaves the usual way."""
    exit_now(main())


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with json_mode(args.json):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    try:
        handler: Callable[[argparse.Namespace], int] = args.handler
        return handler(args)
    except EngineFoundryError as err:
        return _fail(args, err, str(err), err.exit_code)
    except Exception as err:
        hint = network_hint(err) or _disk_full_hint(err)
        if hint:
            return _fail(args, err, hint, EXIT_PIPELINE)
        return _fail(args, err, f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''} "
                                "(rerun with --verbose)", EXIT_PIPELINE)
    except KeyboardInterrupt:
        error("interrupted; servers stopped, nothing half-published")
        return 130


def _disk_full_hint(err: BaseException) -> str | None:
    """A full disk that no write site named: the file when the error has one, else the folders a run writes."""
    for e in exception_chain(err):
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            if e.filename:
                return disk_full_message(e.filename, "free space there")
            from enginefoundry.settings import cache_root, work_root

            return (f"no space left on device (the work folder {work_root()} or the download cache {cache_root()}): "
                    "free space, or point EF_WORK_DIR / EF_CACHE_DIR at a larger disk")
    return None


def _fail(args: argparse.Namespace, err: BaseException, message: str, code: int) -> int:
    if args.verbose:
        traceback.print_exception(err)
    error(message)
    if args.json:
        problems = getattr(err, "problems", None)
        emit_json({"ok": False, "exit_code": code, "error": message,
                   **({"problems": [{"field": f, "message": m} for f, m in problems]} if problems else {})})
    return code


if __name__ == "__main__":
    entry()
