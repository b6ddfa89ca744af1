"""`enginefoundry`: run, validate and plan build specs; trace published units; roll out, promote and roll
back. This package is the Entry layer: it may call flows and the domain; nothing imports it.

Exit codes: 0 success, 1 pipeline failure, 2 invalid input. User mistakes print one message, no
traceback; `--verbose` shows details. Prefect is imported only by the commands that run flows.

Each command lives in a module of this package with a `register(sub)` function; COMMANDS lists them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from collections.abc import Sequence

from enginefoundry import __version__
from enginefoundry.console import error
from enginefoundry.errors import EXIT_PIPELINE, EngineFoundryError

COMMANDS = (
    "enginefoundry.cli.build",
    "enginefoundry.cli.registry",
    "enginefoundry.cli.lengths",
    "enginefoundry.cli.leases",
    "enginefoundry.cli.store",
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="enginefoundry", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"enginefoundry {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="show tracebacks and details")
    sub = p.add_subparsers(dest="command", required=True)
    for module in COMMANDS:
        importlib.import_module(module).register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.handler(args)
    except EngineFoundryError as err:
        if args.verbose:
            traceback.print_exc()
        error(str(err))
        return err.exit_code
    except Exception as err:
        if args.verbose:
            traceback.print_exc()
        error(f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''} (rerun with --verbose)")
        return EXIT_PIPELINE
    except KeyboardInterrupt:
        error("interrupted; servers stopped, nothing half-published")
        return 130


if __name__ == "__main__":
    sys.exit(main())
