"""enginefoundry/db_templates.py: a new SQLite file starts as a copy of the tool release's migrated template;
a file that exists (or appears meanwhile) is never replaced; the template keeps none of one file's own rows;
a killed seed's temporary copy is removed by the next seed, a live process's is not."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

import pytest

from enginefoundry import db_templates


def _db(path: Path, rows: list[tuple[int, str]]) -> Path:
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE experiments (id INTEGER PRIMARY KEY, name TEXT)")
        db.execute("CREATE TABLE alembic_version (version_num TEXT)")
        db.execute("INSERT INTO alembic_version VALUES ('head')")
        db.executemany("INSERT INTO experiments VALUES (?, ?)", rows)
        db.commit()
    return path


def _rows(path: Path, table: str) -> list[tuple]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return db.execute(f"SELECT * FROM {table}").fetchall()


def test_template_path_is_in_the_cache_named_by_tool_and_release(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EF_CACHE_DIR", str(tmp_path))
    assert db_templates.template_path("mlflow", "3.17.2") == tmp_path / "db-templates" / "mlflow-3.17.2.db"
    # A release string is a name, not a path.
    assert db_templates.template_path("x", "../../etc/1.0").parent == tmp_path / "db-templates"


def test_keep_scrubs_the_copy_and_leaves_the_database(tmp_path: Path) -> None:
    source = _db(tmp_path / "a.db", [(0, "Default"), (1, "mine")])
    template = tmp_path / "t" / "tool-1.db"
    db_templates.keep_as_template(source, template, scrub=("DELETE FROM experiments",))
    assert _rows(template, "experiments") == []
    assert _rows(template, "alembic_version") == [("head",)]
    assert _rows(source, "experiments") == [(0, "Default"), (1, "mine")]
    assert [p.name for p in template.parent.iterdir()] == ["tool-1.db"]


def test_seed_copies_the_template_into_a_new_file_only(tmp_path: Path) -> None:
    template = _db(tmp_path / "template.db", [])
    new = tmp_path / "sub" / "new.db"
    assert db_templates.seed(new, template)
    assert new.read_bytes() == template.read_bytes()
    existing = _db(tmp_path / "existing.db", [(5, "kept")])
    before = existing.read_bytes()
    assert not db_templates.seed(existing, template)
    assert existing.read_bytes() == before
    assert not db_templates.seed(tmp_path / "none.db", tmp_path / "no-template.db")
    assert not (tmp_path / "none.db").exists()
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["new.db"]


def test_a_file_created_meanwhile_is_kept(monkeypatch, tmp_path: Path) -> None:
    """Another run on the same folder creates the file between our check and our link (forced here: no real
    pair of processes hits that window on demand)."""
    template = _db(tmp_path / "template.db", [])
    target = tmp_path / "race.db"
    real_copy = db_templates.shutil.copyfile

    def copy_then_other_run(src, dst):
        real_copy(src, dst)
        _db(target, [(7, "theirs")])

    monkeypatch.setattr(db_templates.shutil, "copyfile", copy_then_other_run)
    assert not db_templates.seed(target, template)
    assert _rows(target, "experiments") == [(7, "theirs")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["race.db", "template.db"]


def test_a_killed_seeds_temporary_is_removed_and_a_live_ones_kept(tmp_path: Path) -> None:
    template = _db(tmp_path / "template.db", [])
    dead_pid = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process can have it
    left = tmp_path / f".new.db.seed-{dead_pid}"
    left.write_bytes(b"partial")
    live = tmp_path / f".new.db.seed-{os.getppid()}"
    live.write_bytes(b"in progress")
    other = tmp_path / ".other.db.seed-1"  # another database's name: not ours to judge
    other.write_bytes(b"x")
    assert db_templates.seed(tmp_path / "new.db", template)
    assert not left.exists()
    assert live.exists() and other.exists()


@pytest.mark.parametrize("bad", ["", "not a number"])
def test_temporaries_without_a_pid_are_left(tmp_path: Path, bad: str) -> None:
    stray = tmp_path / f".new.db.seed-{bad}"
    stray.write_bytes(b"x")
    assert db_templates.seed(tmp_path / "new.db", _db(tmp_path / "template.db", []))
    assert stray.exists()


def test_the_protocol_migrates_and_keeps_once_then_seeds(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EF_CACHE_DIR", str(tmp_path / "cache"))
    first, second = tmp_path / "a" / "x.db", tmp_path / "b" / "x.db"
    with db_templates.started_from_template(first, "tool", "1", scrub=("DELETE FROM experiments",)) as migrate:
        assert migrate  # no template yet: the tool creates the file
        first.parent.mkdir()
        _db(first, [(0, "per-file")])
    template = db_templates.template_path("tool", "1")
    assert _rows(template, "experiments") == []
    with db_templates.started_from_template(second, "tool", "1") as migrate:
        assert not migrate
    assert second.read_bytes() == template.read_bytes()
    before = first.read_bytes()
    with db_templates.started_from_template(first, "tool", "1") as migrate:
        assert not migrate
    assert first.read_bytes() == before
