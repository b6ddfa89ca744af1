"""Migrated empty SQLite databases, kept once per tool release and copied into new database files.

A new SQLite file for MLflow (tracking and registry) or for the embedded mode's temporary Prefect server starts
by running the tool's Alembic migrations: ≈ 1.5 s of CPU for MLflow 3.17 and ≈ 3–4 s for Prefect 3.9 on this
2-core host, the same work for every new file of one release (measured: `benchmarks/cold_run.py`,
docs/scale.md). The first new file of a release is migrated by the tool itself as before and then kept, with
its per-file rows removed (`keep_as_template`); later new files start as a copy of it (`seed`), and the tool,
opening a file whose schema is at its head revision, only checks it and adds its per-file rows (MLflow's
Default experiment, with this file's artifact root). `started_from_template` is that protocol, used by
`tracking.Tracker` and `flows/ephemeral_server.py`.

Only files that do not exist yet are seeded, by linking a complete copy into place: a file that appears
meanwhile is kept, and a kill leaves at most a dot-named temporary file that the next seed of that folder
removes. Templates live in the download cache (EF_CACHE_DIR, default ~/.cache/enginefoundry) under
`db-templates/`, named by tool and release; deleting them only costs the next new file its migrations."""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path

from enginefoundry.runner import pid_alive
from enginefoundry.settings import cache_root


@contextlib.contextmanager
def started_from_template(database: Path, tool: str, release: str, scrub: Sequence[str] = ()) -> Iterator[bool]:
    """The protocol both tools share, around the code that opens `database` with the tool: a file that does not
    exist yet is seeded from the release's template first; when there is no template (or seeding fails), the
    block yields True — the tool must create and migrate the file itself — and the migrated file is then kept
    as the template (`scrub`: see `keep_as_template`). An existing file yields False and is left alone. Seeding
    and keeping only save time: their errors leave the tool to do what it does without a template."""
    if database.exists():
        yield False
        return
    template = template_path(tool, release)
    try:
        migrate = not seed(database, template) and not database.exists()
    except OSError:
        migrate = True
    yield migrate
    if migrate and database.exists():
        with contextlib.suppress(OSError, sqlite3.Error):
            keep_as_template(database, template, scrub)


def template_path(tool: str, release: str) -> Path:
    """The template of one tool release, e.g. `template_path("mlflow", "3.17.2")`."""
    safe = re.sub(r"[^A-Za-z0-9._+-]", "_", release)
    return cache_root() / "db-templates" / f"{tool}-{safe}.db"


def seed(database: Path, template: Path) -> bool:
    """Give a database file that does not exist yet the template's content. True when it was seeded; False when
    there is no template yet or the file exists (also when another process created it meanwhile)."""
    if database.exists() or not template.is_file():
        return False
    database.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_temporaries(database.parent, f".{database.name}.seed-")
    tmp = database.with_name(f".{database.name}.seed-{os.getpid()}")
    try:
        shutil.copyfile(template, tmp)
        try:
            os.link(tmp, database)  # fails when the name exists: never replaces a database someone opened
        except FileExistsError:
            return False
    finally:
        tmp.unlink(missing_ok=True)
    return True


def keep_as_template(database: Path, template: Path, scrub: Sequence[str] = ()) -> None:
    """Keep a consistent copy of a freshly migrated database (SQLite's `VACUUM INTO`) as the template, after
    running `scrub` (SQL statements deleting the rows that belong to this one file) on the copy."""
    template.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_temporaries(template.parent, f".{template.name}.tmp-")
    tmp = template.with_name(f".{template.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        with contextlib.closing(sqlite3.connect(database)) as db:
            db.execute("VACUUM INTO ?", (str(tmp),))
        with contextlib.closing(sqlite3.connect(tmp)) as db:
            for statement in scrub:
                db.execute(statement)
            db.commit()
        os.replace(tmp, template)
    finally:
        tmp.unlink(missing_ok=True)


def _remove_dead_temporaries(folder: Path, prefix: str) -> None:
    """The temporary copies named `<prefix><pid>` that a process killed while seeding or keeping a template
    left; nothing else in the folder is touched."""
    with contextlib.suppress(OSError):
        for path in folder.glob(f"{glob.escape(prefix)}*"):
            pid = path.name.removeprefix(prefix)
            if pid.isdigit() and not pid_alive(int(pid)):
                path.unlink(missing_ok=True)
