"""Migrated empty SQLite databases, kept once per tool release and copied into new database files.

A new SQLite file for MLflow (tracking and registry) or for the embedded mode's temporary Prefect server starts
by running the tool's Alembic migrations: ≈ 1.5 s of CPU for MLflow 3.17 and ≈ 3–4 s for Prefect 3.9 on this
2-core host, the same work for every new file of one release (measured: `benchmarks/cold_run.py`,
docs/scale.md). The first new file of a release is migrated by the tool itself as before and then kept, with
its per-file rows removed (`keep_as_template`); later new files start as a copy of it (`seed`), and the tool,
opening a file whose schema is at its head revision, only checks it and adds its per-file rows (MLflow's
Default experiment, with this file's artifact root). `started_from_template` is that protocol, used by
`tracking.Tracker` and `orchestration/ephemeral_server.py`.

A template is local state, and local state is untrusted input: whoever can write the cache can write a template
and the digest beside it. So `seed` copies the template, then checks the copy before it becomes a database: the
digest this tool wrote (`<template>.sha256`: damage, not an attacker), SQLite's `quick_check`, its whole schema
(every table with its columns and constraints, index, trigger and view: `schema_of`) equal to what the tool's own
migrations make, and no row but the few the migrations add (so no registered model, version or alias can ride
in). What the migrations make is recorded per tool release in `enginefoundry/schemas/recorded-db/<tool>-<release>.json`
(`scripts/record_db_schemas.py` writes it by running the migrations; an integration test holds it to them), never
read from the cache: a release without a record gets no template (each new file is migrated by the tool). A
template that fails any check is removed with a message naming it and the reason; the tool then migrates the new
file itself and a fresh template is kept (only when its schema is the recorded one). A template cannot make a run
fail: it is used only when every check passes.

Only files that do not exist yet are seeded, by linking a complete copy into place: a file that appears
meanwhile is kept, and a kill leaves at most a dot-named temporary file that the next seed of that folder
removes. Templates live in the download cache (EF_CACHE_DIR, default ~/.cache/enginefoundry) under
`db-templates/`, named by tool and release; deleting them only costs the next new file its migrations."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import sqlite3
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from enginefoundry.confine import printable
from enginefoundry.identity import sha256_file
from enginefoundry.runner import pid_alive
from enginefoundry.settings import cache_root

SchemaEntry = tuple[str, str, str, str]  # sqlite_master's type, name, table and SQL (whitespace collapsed)
SCHEMAS = Path(__file__).resolve().parent.parent / "schemas" / "recorded-db"


@dataclass(frozen=True)
class TemplateRules:
    """What a tool's freshly migrated database holds: rows only in `rows` (table → count), exactly the schema
    `schema` (`schema_of`; None: not known for this release, so no template is used) and the Alembic revisions
    `heads` in alembic_version (empty: not checked)."""

    rows: dict[str, int] = field(default_factory=lambda: {"alembic_version": 1})
    schema: tuple[SchemaEntry, ...] | None = None
    heads: tuple[str, ...] = ()
    what: str = "the tool's migrations"  # named in messages: "MLflow 3.17.2's migrations"


def schema_of(db: sqlite3.Connection) -> tuple[SchemaEntry, ...]:
    """The whole schema of a SQLite database as SQLite records it (sqlite_master: each table with its columns and
    constraints, each index, trigger and view, with its SQL), in a stable order, whitespace collapsed, and a table's
    named and unnamed constraints sorted: Alembic's batch migrations on SQLite rebuild a table with its constraints
    in set order, which differs from one process to the next (MLflow 3.17.2's `runs`: its two CHECK constraints)."""
    rows = db.execute("SELECT type, name, tbl_name, coalesce(sql, '') FROM sqlite_master").fetchall()
    return tuple(sorted((str(t), str(n), str(tb), _normal_sql(str(t), " ".join(str(sql).split())))
                        for t, n, tb, sql in rows))


_CONSTRAINT = re.compile(r"^(CONSTRAINT|CHECK|FOREIGN KEY|PRIMARY KEY|UNIQUE)\b", re.IGNORECASE)


def _normal_sql(kind: str, sql: str) -> str:
    """A CREATE TABLE's columns in their order, then its constraints sorted; any other statement as it is."""
    start, end = sql.find("("), sql.rfind(")")
    if kind != "table" or start < 0 or end < start:
        return sql
    items: list[str] = []
    part: list[str] = []
    depth, quote = 0, ""
    for ch in sql[start + 1:end]:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"`[":
            quote = "]" if ch == "[" else ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append("".join(part).strip())
            part = []
            continue
        part.append(ch)
    items.append("".join(part).strip())
    columns = [i for i in items if not _CONSTRAINT.match(i)]
    constraints = sorted(i for i in items if _CONSTRAINT.match(i))
    return f"{sql[:start]}({', '.join(columns + constraints)}){sql[end + 1:]}"


def schema_file(tool: str, release: str) -> Path:
    return SCHEMAS / f"{tool}-{re.sub(r'[^A-Za-z0-9._+-]', '_', release)}.json"


def recorded_rules(tool: str, release: str, rows: dict[str, int] | None = None, label: str = "") -> TemplateRules:
    """The rules of one tool release from its committed record (`schema_file`); schema None where there is none."""
    what = f"{label or tool} {release}'s migrations"
    try:
        doc = json.loads(schema_file(tool, release).read_text())
        schema = tuple((str(a), str(b), str(c), str(d)) for a, b, c, d in doc["schema"])
        heads = tuple(str(h) for h in doc["alembic_version"])
    except (OSError, ValueError, KeyError, TypeError):
        return TemplateRules(rows=rows or {"alembic_version": 1}, what=what)
    return TemplateRules(rows=rows or {"alembic_version": 1}, schema=schema, heads=heads, what=what)


def record_schema(tool: str, release: str, database: Path, source: str) -> Path:
    """Write the record of what `database`, freshly migrated by `tool` `release` itself, holds (scripts/
    record_db_schemas.py; never called at run time)."""
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
        doc = {"tool": tool, "release": release, "source": source,
               "alembic_version": sorted(r[0] for r in db.execute("SELECT version_num FROM alembic_version")),
               "schema": [list(e) for e in schema_of(db)]}
    path = schema_file(tool, release)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def notify(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def started_from_template(database: Path, tool: str, release: str, scrub: Sequence[str] = (),
                          rules: TemplateRules | None = None) -> Iterator[bool]:
    """The protocol both tools share, around the code that opens `database` with the tool: a file that does not
    exist yet is seeded from the release's template first; when there is no template (or seeding fails), the
    block yields True — the tool must create and migrate the file itself — and the migrated file is then kept
    as the template (`scrub`: see `keep_as_template`). An existing file yields False and is left alone. Seeding
    and keeping only save time: their errors leave the tool to do what it does without a template."""
    if database.exists():
        yield False
        return
    rules = rules or TemplateRules()
    if rules.schema is None:  # no record of what this release's migrations make: no template to hold to it
        yield True
        return
    template = template_path(tool, release)
    try:
        migrate = not seed(database, template, rules) and not database.exists()
    except OSError:
        migrate = True
    yield migrate
    if migrate and database.exists():
        with contextlib.suppress(OSError, sqlite3.Error):
            keep_as_template(database, template, scrub, rules)


def template_path(tool: str, release: str) -> Path:
    """The template of one tool release, e.g. `template_path("mlflow", "3.17.2")`."""
    safe = re.sub(r"[^A-Za-z0-9._+-]", "_", release)
    return cache_root() / "db-templates" / f"{tool}-{safe}.db"


def digest_path(template: Path) -> Path:
    return template.with_name(template.name + ".sha256")


def seed(database: Path, template: Path, rules: TemplateRules | None = None) -> bool:
    """Give a database file that does not exist yet the template's content. True when it was seeded; False when
    there is no template yet, the file exists (also when another process created it meanwhile), or the template
    failed its checks (then it is removed, with a message)."""
    if database.exists() or not template.is_file():
        return False
    database.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_temporaries(database.parent, f".{database.name}.seed-")
    tmp = database.with_name(f".{database.name}.seed-{os.getpid()}")
    try:
        shutil.copyfile(template, tmp)
        problem = template_problem(tmp, digest_path(template), rules or TemplateRules())
        if problem is not None:  # the copy is what would become the database: it is what is checked
            notify(f"database template {template}: {problem}; removed it: this new database is migrated by the "
                   "tool itself and kept as a fresh template")
            discard(template)
            return False
        try:
            os.link(tmp, database)  # fails when the name exists: never replaces a database someone opened
        except FileExistsError:
            return False
    finally:
        tmp.unlink(missing_ok=True)
    return True


def discard(template: Path) -> None:
    for path in (template, digest_path(template)):
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)


def template_problem(copy: Path, digest_file: Path, rules: TemplateRules) -> str | None:
    """Why a copy of a template must not become a database; None when it may."""
    try:
        expected = digest_file.read_text().strip()
    except OSError:
        return f"no digest beside it ({digest_file.name}): it was not kept by this tool"
    if sha256_file(copy) != expected:
        return f"its sha256 is not the one {digest_file.name} records (changed or damaged since it was kept)"
    try:
        with contextlib.closing(sqlite3.connect(f"file:{copy}?mode=ro", uri=True)) as db:
            return _content_problem(db, rules)
    except sqlite3.Error as err:
        return f"SQLite cannot read it ({err})"


def _content_problem(db: sqlite3.Connection, rules: TemplateRules) -> str | None:
    check = db.execute("PRAGMA quick_check").fetchall()
    if check != [("ok",)]:
        return f"SQLite's quick_check fails ({str(check[0][0])[:120]})"
    problem = schema_problem(schema_of(db), rules)
    if problem is not None:
        return problem
    if rules.heads:
        heads = sorted(str(r[0]) for r in db.execute("SELECT version_num FROM alembic_version"))
        if heads != sorted(rules.heads):
            return (f"its Alembic revision is {', '.join(heads) or 'none'}, not {', '.join(rules.heads)} "
                    f"({rules.what})")
    for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"):
        rows = db.execute(f'SELECT count(*) FROM "{table.replace(chr(34), chr(34) * 2)}"').fetchone()[0]
        if rows > rules.rows.get(table, 0):
            return f"table {table} holds {rows} row(s) (a freshly migrated database holds {rules.rows.get(table, 0)})"
    return None


def schema_problem(actual: tuple[SchemaEntry, ...], rules: TemplateRules) -> str | None:
    """Why a schema is not the one the tool's migrations make (the first difference, named), None when it is."""
    if rules.schema is None:
        return f"there is no record of what {rules.what} make"
    extra = sorted(set(actual) - set(rules.schema))
    missing = sorted(set(rules.schema) - set(actual))
    if not extra and not missing:
        return None
    if extra:
        kind, name, table, sql = extra[0]
        changed = any(e[:2] == (kind, name) for e in missing)
        return (f"its schema is not what {rules.what} make: {kind} {name!r} on {table!r} "
                + ("differs" if changed else "is not theirs") + f" ({printable(sql, 120)})"
                + (f", and {len(extra) + len(missing) - 1} more difference(s)" if len(extra) + len(missing) > 1
                   else ""))
    kind, name, table, _ = missing[0]
    return f"its schema is not what {rules.what} make: it lacks {kind} {name!r} on {table!r}"


def keep_as_template(database: Path, template: Path, scrub: Sequence[str] = (),
                     rules: TemplateRules | None = None) -> None:
    """Keep a consistent copy of a freshly migrated database (SQLite's `VACUUM INTO`) as the template, after
    running `scrub` (SQL statements deleting the rows that belong to this one file) on the copy. With `rules`, only
    a copy whose schema is the recorded one is kept (another SQLAlchemy can write other SQL: then every new file
    is migrated by the tool, and no template is kept that every later seed would remove)."""
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
            problem = schema_problem(schema_of(db), rules) if rules is not None else None
        if problem is not None:
            notify(f"database template {template}: not kept: {database} was migrated by the tool, but {problem}; "
                   "new files are migrated by the tool itself (scripts/record_db_schemas.py records the schema of "
                   "this environment's release)")
            return
        digest = tmp.with_name(f"{tmp.name}.sha256")
        digest.write_text(sha256_file(tmp) + "\n")
        # The digest moves in after the template: a kill in between leaves a mismatch, which `seed` discards.
        os.replace(tmp, template)
        os.replace(digest, digest_path(template))
    finally:
        tmp.unlink(missing_ok=True)
        tmp.with_name(f"{tmp.name}.sha256").unlink(missing_ok=True)


def _remove_dead_temporaries(folder: Path, prefix: str) -> None:
    """The temporary copies named `<prefix><pid>` that a process killed while seeding or keeping a template
    left; nothing else in the folder is touched."""
    with contextlib.suppress(OSError):
        for path in folder.glob(f"{glob.escape(prefix)}*"):
            pid = path.name.removeprefix(prefix).split(".")[0]  # `<pid>` or `<pid>.sha256`
            if pid.isdigit() and not pid_alive(int(pid)):
                path.unlink(missing_ok=True)
