"""Record what the installed MLflow's and Prefect's own migrations make of a new SQLite database: the schema a
database template must have (enginefoundry/records/db_templates.py) is read from these records, never from the
cache. Run it after upgrading either tool (or SQLAlchemy/Alembic, which write the SQL):

    .venv/bin/python scripts/record_db_schemas.py

It writes enginefoundry/schemas/recorded-db/<tool>-<release>.json; tests/integration/test_db_templates_tools.py
fails until the record of the installed release matches what its migrations make."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

MLFLOW = """
import sys
from mlflow.tracking import MlflowClient
MlflowClient(tracking_uri="sqlite:///" + sys.argv[1]).search_experiments()  # opens the store: its migrations run
"""
PREFECT = """
import asyncio
from prefect.server.database import provide_database_interface

async def migrate():
    db = provide_database_interface()
    await db.create_db()
    await (await db.engine()).dispose()

asyncio.run(migrate())
"""


def _run(code: str, args: list[str], env: dict[str, str]) -> None:
    done = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])


def main() -> None:
    import mlflow
    import prefect

    from enginefoundry.records.db_templates import record_schema

    base = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    with tempfile.TemporaryDirectory() as tmp:
        # A cache of its own: no template exists, so each tool migrates the new file itself.
        env = {**base, "EF_CACHE_DIR": f"{tmp}/cache", "PYTHONPATH": str(REPO)}
        _run(MLFLOW, [f"{tmp}/mlflow.db"], env)
        print(record_schema("mlflow", mlflow.__version__, Path(f"{tmp}/mlflow.db"),
                            "MlflowClient on a new sqlite:/// file (mlflow.store.db.utils._upgrade_db)"))
        _run(PREFECT, [], {**env, "PREFECT_HOME": f"{tmp}/prefect"})
        print(record_schema("prefect", prefect.__version__, Path(f"{tmp}/prefect/prefect.db"),
                            "PrefectDBInterface.create_db on a new PREFECT_HOME (prefect/server/database)"))


if __name__ == "__main__":
    main()
