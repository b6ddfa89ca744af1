"""The embedded mode's temporary Prefect API server process:
`python -m enginefoundry.flows.prefect_server.ephemeral_server <uvicorn arguments>`, run by
`prefect_server.ephemeral.start_early_server` in place of Prefect's `python -m uvicorn …`.

Before it hands over to uvicorn it gives a new SQLite database a migrated start (enginefoundry/records/db_templates.py):
on a new PREFECT_HOME the server otherwise spends ≈ 3.5 s of its ≈ 7.5 s start-up on this 2-core host running
Prefect's Alembic migrations, the same for every new database of one Prefect release. The first new database
of a release is migrated here as the server's lifespan would (`PrefectDBInterface.create_db`,
prefect/server/api/server.py@3.9.1) and kept as the template; later ones start as a copy of it. The lifespan
still runs `create_db`: Alembic's upgrade finds the copy at head (0.13 s, measured). A database file that
exists, or one that is not SQLite, is left to Prefect."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from pathlib import Path

from enginefoundry.records import db_templates


def sqlite_database_path() -> Path | None:
    """The server's database file as Prefect resolves it (environment, profile, PREFECT_HOME), or None when it
    is not a SQLite file."""
    from prefect.settings import get_current_settings
    from sqlalchemy.engine import make_url

    secret = get_current_settings().server.database.connection_url
    url = make_url(secret.get_secret_value() if secret is not None else "")
    if not url.drivername.startswith("sqlite") or not url.database or url.database == ":memory:":
        return None
    return Path(url.database).expanduser()


def prepare_database(database: Path) -> None:
    """`database` is the server's (`sqlite_database_path`): the migrations run on the configured database.
    Prefect's migrations add no per-database rows: the template needs no scrub."""
    import prefect

    rules = db_templates.recorded_rules("prefect", prefect.__version__, label="Prefect")
    with db_templates.started_from_template(database, "prefect", prefect.__version__, rules=rules) as migrate:
        if migrate:
            database.parent.mkdir(parents=True, exist_ok=True)
            asyncio.run(_migrate())


async def _migrate() -> None:
    from prefect.server.database import provide_database_interface

    db = provide_database_interface()
    await db.create_db()
    await (await db.engine()).dispose()  # its connections belong to this event loop, not uvicorn's


def main(argv: list[str]) -> None:
    database = sqlite_database_path()
    if database is not None:
        try:
            prepare_database(database)
        except (OSError, sqlite3.Error) as exc:  # the server's lifespan then migrates, as Prefect's own does
            print(f"temporary Prefect server: no migrated copy of the database ({exc})", file=sys.stderr)
    import uvicorn.main

    sys.argv = ["uvicorn", *argv]
    uvicorn.main.main()


if __name__ == "__main__":
    main(sys.argv[1:])
