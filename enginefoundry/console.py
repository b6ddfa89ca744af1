"""Terminal output: progress lines and the end-of-run summary table."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

# Logs and CI have no terminal width; rich would wrap tables at 80 columns there.
_WIDTH = None if sys.stdout.isatty() else 160
console = Console(stderr=False, highlight=False, width=_WIDTH)
err_console = Console(stderr=True, highlight=False, width=_WIDTH)


def say(message: str) -> None:
    console.print(f"[dim]›[/dim] {escape(message)}", markup=True, soft_wrap=True)


def table(title: str, rows: list[dict[str, str]]) -> None:
    if not rows:
        console.print(f"{title}: (none)")
        return
    t = Table(title=title, show_lines=False)
    for col in rows[0]:
        t.add_column(col, overflow="fold")
    for r in rows:
        t.add_row(*[_style(col, r[col]) for col in r])
    console.print(t)


def _style(col: str, value: str) -> str:
    if col in ("status", "verdict"):
        if value.startswith(("candidate", "ok", "pass", "PASS")):
            return f"[green]{escape(value)}[/green]"
        if value.startswith(("rejected", "failed", "FAIL", "refused")):
            return f"[red]{escape(value)}[/red]"
    return escape(value)


def error(message: str) -> None:
    err_console.print(f"[red]error:[/red] {escape(message)}", markup=True, soft_wrap=True, highlight=False)
    sys.stderr.flush()
