"""The migrated-template start of new SQLite files against the real tools (enginefoundry/records/db_templates.py):
MLflow's tracking file through `Tracker`, and the temporary Prefect server's database through
`orchestration.ephemeral_server.prepare_database` (Prefect's own migrations, in this process: no server)."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from enginefoundry.identity import sha256_file
from enginefoundry.records import db_templates
from tests.support.paths import REPO


def _experiments(db: Path) -> list[tuple[int, str, str]]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return conn.execute("SELECT experiment_id, name, artifact_location FROM experiments ORDER BY 1").fetchall()


def test_a_second_new_mlflow_file_is_a_copy_with_its_own_experiments(monkeypatch, tmp_path: Path) -> None:
    import mlflow

    from enginefoundry.records.tracking import Tracker

    monkeypatch.setenv("EF_CACHE_DIR", str(tmp_path / "cache"))
    template = db_templates.template_path("mlflow", mlflow.__version__)
    # MLflow puts a SQLite file's Default experiment under ./mlruns of the directory it was created from: each
    # file is created from another one, so a Default experiment copied from the template would show.
    for folder in ("a", "b"):
        (tmp_path / f"cwd-{folder}").mkdir()
    monkeypatch.chdir(tmp_path / "cwd-a")
    first = Tracker(f"sqlite:///{tmp_path / 'a' / 'mlflow.db'}", "demo")
    assert template.is_file(), "the first new file was not kept as the template"
    assert _experiments(template) == [], "the template keeps the first file's experiments"

    monkeypatch.chdir(tmp_path / "cwd-b")
    second = Tracker(f"sqlite:///{tmp_path / 'b' / 'mlflow.db'}", "demo")
    for tracker, folder in ((first, "a"), (second, "b")):
        assert _experiments(tmp_path / folder / "mlflow.db") == [
            (0, "Default", str(tmp_path / f"cwd-{folder}" / "mlruns" / "0")),
            (1, "demo", (tmp_path / folder / "mlartifacts").as_uri()),
        ]
        run = tracker.client.create_run(tracker.experiment_id)
        tracker.client.log_metric(run.info.run_id, "m", 1.0)
        assert tracker.client.get_run(run.info.run_id).data.metrics == {"m": 1.0}
    with contextlib.closing(sqlite3.connect(tmp_path / "b" / "mlflow.db")) as b, \
            contextlib.closing(sqlite3.connect(tmp_path / "a" / "mlflow.db")) as a:
        head = "SELECT version_num FROM alembic_version"
        assert b.execute(head).fetchall() == a.execute(head).fetchall()


def _prepare(home: Path, cache: Path) -> Path:
    """What the temporary server's process does first, on PREFECT_HOME `home` (a child: Prefect's database
    interface is configured once per process)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), EF_CACHE_DIR=str(cache), PYTHONPATH=str(REPO))
    code = ("from enginefoundry.flows.prefect_server.ephemeral_server import prepare_database, sqlite_database_path\n"
            "db = sqlite_database_path(); prepare_database(db); print(db)")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(done.stdout.strip().splitlines()[-1])


def test_the_temporary_prefect_servers_new_database_starts_migrated(monkeypatch, tmp_path: Path) -> None:
    import prefect

    monkeypatch.setenv("EF_CACHE_DIR", str(tmp_path / "cache"))
    template = db_templates.template_path("prefect", prefect.__version__)
    first = _prepare(tmp_path / "home-a", tmp_path / "cache")  # Prefect's migrations, then kept
    assert first == tmp_path / "home-a" / "prefect.db"
    assert template.is_file()
    with contextlib.closing(sqlite3.connect(template)) as db:
        head = db.execute("SELECT version_num FROM alembic_version").fetchall()
        assert db.execute("SELECT count(*) FROM flow_run").fetchone() == (0,)
    with contextlib.closing(sqlite3.connect(first)) as db:
        assert db.execute("SELECT version_num FROM alembic_version").fetchall() == head

    second = _prepare(tmp_path / "home-b", tmp_path / "cache")
    assert second.read_bytes() == template.read_bytes()

    second.write_bytes(b"someone's database")  # an existing file is Prefect's business
    _prepare(tmp_path / "home-b", tmp_path / "cache")
    assert second.read_bytes() == b"someone's database"


@pytest.mark.parametrize("url, expected", [
    ("sqlite+aiosqlite:///{home}/other.db", "{home}/other.db"),
    ("sqlite+aiosqlite:///:memory:", None),
    ("postgresql+asyncpg://u:p@127.0.0.1:5432/prefect", None),
])
def test_only_a_sqlite_file_is_prepared(monkeypatch, tmp_path: Path, url: str, expected: str | None) -> None:
    from prefect.settings import PREFECT_API_DATABASE_CONNECTION_URL, temporary_settings

    from enginefoundry.flows.prefect_server.ephemeral_server import sqlite_database_path

    with temporary_settings({PREFECT_API_DATABASE_CONNECTION_URL: url.format(home=tmp_path)}):
        found = sqlite_database_path()
    assert found == (Path(expected.format(home=tmp_path)) if expected else None)


def _plant_champion(template: Path) -> None:
    """What the finding planted in a cached MLflow template: a registered model with a `@cpu-champion` version and
    a trigger that adds it to every new file; its digest recomputed (whoever can write the cache can)."""
    with contextlib.closing(sqlite3.connect(template)) as db:
        db.execute("INSERT INTO registered_models (name, creation_time, last_updated_time, workspace) "
                   "VALUES ('tiny-chat', 0, 0, 'default')")
        db.execute("CREATE TRIGGER plant AFTER INSERT ON experiments BEGIN "
                   "INSERT INTO registered_models (name, creation_time, last_updated_time, workspace) "
                   "VALUES ('attacker', 0, 0, 'default'); END")
        db.commit()
    db_templates.digest_path(template).write_text(sha256_file(template) + "\n")


def _plant_index(template: Path) -> None:
    """Issue 34: one extra unique index on a constant passed every earlier check (digest, quick_check, no trigger or
    view, no rows) and made the second insert into `runs` of every new file fail, naming neither the template nor
    the fix."""
    with contextlib.closing(sqlite3.connect(template)) as db:
        db.execute("CREATE UNIQUE INDEX ix_plant ON runs((1))")
        db.commit()
    db_templates.digest_path(template).write_text(sha256_file(template) + "\n")


@pytest.mark.parametrize("damage", ["hostile rows and a trigger", "corrupt bytes", "an extra unique index"])
def test_a_hostile_or_corrupt_mlflow_template_never_reaches_a_new_file(monkeypatch, tmp_path: Path, capsys,
                                                                        damage: str) -> None:
    import mlflow

    from enginefoundry.records.tracking import Tracker

    monkeypatch.setenv("EF_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    Tracker(f"sqlite:///{tmp_path / 'a' / 'mlflow.db'}", "demo")  # keeps the template
    template = db_templates.template_path("mlflow", mlflow.__version__)
    if damage == "corrupt bytes":
        with template.open("r+b") as f:
            f.seek(4096)
            f.write(b"\0garbage" * 512)
    elif damage == "an extra unique index":
        _plant_index(template)
    else:
        _plant_champion(template)
    capsys.readouterr()
    tracker = Tracker(f"sqlite:///{tmp_path / 'b' / 'mlflow.db'}", "demo")  # no misleading failure
    assert tracker.client.search_registered_models() == []
    for _ in range(2):  # the second insert into runs is what the planted index broke
        tracker.client.create_run(tracker.experiment_id)
    with contextlib.closing(sqlite3.connect(tmp_path / "b" / "mlflow.db")) as db:
        assert db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' AND name = 'plant'").fetchall() == []
    err = capsys.readouterr().err
    assert f"database template {template}" in err and "removed it" in err
    if damage == "an extra unique index":
        assert "index 'ix_plant' on 'runs' is not theirs" in err and "MLflow" in err, err
    from enginefoundry.records.tracking import _mlflow_template_rules

    # Rebuilt from MLflow's own migrations, and it passes the checks: its whole schema is the one recorded for this
    # release (enginefoundry/schemas/recorded-db/; after an upgrade: scripts/record_db_schemas.py).
    assert db_templates.template_problem(template, db_templates.digest_path(template), _mlflow_template_rules()) is None


def test_a_corrupt_prefect_template_is_replaced_not_served(monkeypatch, tmp_path: Path) -> None:
    """The finding: a corrupt template made every later temporary server time out ("Timed out … ephemeral Prefect
    API server"), even after the template was repaired. Now the copy is checked first, the template removed with a
    message, and the new database migrated by Prefect."""
    import prefect

    template = db_templates.template_path("prefect", prefect.__version__).relative_to(db_templates.cache_root())
    cache = tmp_path / "cache"
    monkeypatch.setenv("EF_CACHE_DIR", str(cache))
    _prepare(tmp_path / "home-a", cache)
    with (cache / template).open("r+b") as f:
        f.seek(8192)
        f.write(b"\xff" * 8192)
    db = _prepare(tmp_path / "home-b", cache)
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA quick_check").fetchall() == [("ok",)]
        assert conn.execute("SELECT count(*) FROM flow_run").fetchone() == (0,)
    rules = db_templates.recorded_rules("prefect", prefect.__version__, label="Prefect")
    assert db_templates.template_problem(cache / template, db_templates.digest_path(cache / template),
                                         rules) is None  # what Prefect's migrations make is what is recorded
