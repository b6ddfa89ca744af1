"""enginefoundry/records/db_templates.py: a new SQLite file starts as a copy of the tool release's migrated template;
a file that exists (or appears meanwhile) is never replaced; the template keeps none of one file's own rows;
a killed seed's temporary copy is removed by the next seed, a live process's is not."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

import pytest

from enginefoundry.identity import sha256_file
from enginefoundry.records import db_templates


def _db(path: Path, rows: list[tuple[int, str]]) -> Path:
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE experiments (id INTEGER PRIMARY KEY, name TEXT)")
        db.execute("CREATE TABLE alembic_version (version_num TEXT)")
        db.execute("INSERT INTO alembic_version VALUES ('head')")
        db.executemany("INSERT INTO experiments VALUES (?, ?)", rows)
        db.commit()
    return path


def _toy_rules() -> db_templates.TemplateRules:
    """What the toy tool's "migrations" (`_db`) make: the schema a template of it must have."""
    with contextlib.closing(sqlite3.connect(":memory:")) as db:
        db.execute("CREATE TABLE experiments (id INTEGER PRIMARY KEY, name TEXT)")
        db.execute("CREATE TABLE alembic_version (version_num TEXT)")
        return db_templates.TemplateRules(schema=db_templates.schema_of(db), heads=("head",), what="the toy's")


RULES = _toy_rules()


def _template(path: Path) -> Path:
    """A template as this tool keeps it: the database and its digest beside it."""
    _db(path, [])
    db_templates.digest_path(path).write_text(sha256_file(path) + "\n")
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
    assert sorted(p.name for p in template.parent.iterdir()) == ["tool-1.db", "tool-1.db.sha256"]


def test_seed_copies_the_template_into_a_new_file_only(tmp_path: Path) -> None:
    template = _template(tmp_path / "template.db")
    new = tmp_path / "sub" / "new.db"
    assert db_templates.seed(new, template, RULES)
    assert new.read_bytes() == template.read_bytes()
    existing = _db(tmp_path / "existing.db", [(5, "kept")])
    before = existing.read_bytes()
    assert not db_templates.seed(existing, template, RULES)
    assert existing.read_bytes() == before
    assert not db_templates.seed(tmp_path / "none.db", tmp_path / "no-template.db", RULES)
    assert not (tmp_path / "none.db").exists()
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["new.db"]


def test_a_file_created_meanwhile_is_kept(monkeypatch, tmp_path: Path) -> None:
    """Another run on the same folder creates the file between our check and our link (forced here: no real
    pair of processes hits that window on demand)."""
    template = _template(tmp_path / "template.db")
    target = tmp_path / "race.db"
    real_copy = db_templates.shutil.copyfile

    def copy_then_other_run(src, dst):
        real_copy(src, dst)
        _db(target, [(7, "theirs")])

    monkeypatch.setattr(db_templates.shutil, "copyfile", copy_then_other_run)
    assert not db_templates.seed(target, template, RULES)
    assert _rows(target, "experiments") == [(7, "theirs")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["race.db", "template.db", "template.db.sha256"]


def test_a_killed_seeds_temporary_is_removed_and_a_live_ones_kept(tmp_path: Path) -> None:
    template = _template(tmp_path / "template.db")
    dead_pid = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process can have it
    left = tmp_path / f".new.db.seed-{dead_pid}"
    left.write_bytes(b"partial")
    live = tmp_path / f".new.db.seed-{os.getppid()}"
    live.write_bytes(b"in progress")
    other = tmp_path / ".other.db.seed-1"  # another database's name: not ours to judge
    other.write_bytes(b"x")
    assert db_templates.seed(tmp_path / "new.db", template, RULES)
    assert not left.exists()
    assert live.exists() and other.exists()


@pytest.mark.parametrize("bad", ["", "not a number"])
def test_temporaries_without_a_pid_are_left(tmp_path: Path, bad: str) -> None:
    stray = tmp_path / f".new.db.seed-{bad}"
    stray.write_bytes(b"x")
    assert db_templates.seed(tmp_path / "new.db", _template(tmp_path / "template.db"), RULES)
    assert stray.exists()


def test_the_protocol_migrates_and_keeps_once_then_seeds(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EF_CACHE_DIR", str(tmp_path / "cache"))
    first, second = tmp_path / "a" / "x.db", tmp_path / "b" / "x.db"
    with db_templates.started_from_template(first, "tool", "1", scrub=("DELETE FROM experiments",),
                                            rules=RULES) as migrate:
        assert migrate  # no template yet: the tool creates the file
        first.parent.mkdir()
        _db(first, [(0, "per-file")])
    template = db_templates.template_path("tool", "1")
    assert _rows(template, "experiments") == []
    with db_templates.started_from_template(second, "tool", "1", rules=RULES) as migrate:
        assert not migrate
    assert second.read_bytes() == template.read_bytes()
    before = first.read_bytes()
    with db_templates.started_from_template(first, "tool", "1", rules=RULES) as migrate:
        assert not migrate
    assert first.read_bytes() == before


def _plant(template: Path, statements: list[str], keep_digest: bool) -> None:
    """A hostile or damaged template: `statements` run on a kept template, its digest kept or recomputed (an
    attacker who can write the cache can write the digest too: the content checks must catch it anyway)."""
    with contextlib.closing(sqlite3.connect(template)) as db:
        for statement in statements:
            db.execute(statement)
        db.commit()
    if not keep_digest:
        db_templates.digest_path(template).write_text(sha256_file(template) + "\n")


@pytest.mark.parametrize(("statements", "keep_digest", "reason"), [
    (["INSERT INTO experiments VALUES (9, 'attacker')"], True, "sha256 is not the one"),
    (["INSERT INTO experiments VALUES (9, 'attacker')"], False, "table experiments holds 1 row"),
    (["CREATE TRIGGER t AFTER INSERT ON experiments BEGIN INSERT INTO experiments VALUES (99, 'x'); END"], False,
     "trigger 't' on 'experiments' is not theirs"),
    (["CREATE VIEW v AS SELECT * FROM experiments"], False, "view 'v' on 'v' is not theirs"),
    # Issue 34: one extra unique index passed every other check, and broke every new file's second insert.
    (["CREATE UNIQUE INDEX ix_one ON experiments((1))"], False, "index 'ix_one' on 'experiments' is not theirs"),
    (["ALTER TABLE experiments ADD COLUMN owner TEXT NOT NULL DEFAULT 'x'"], False,
     "table 'experiments' on 'experiments' differs"),
    (["DROP TABLE experiments", "CREATE TABLE experiments (id INTEGER PRIMARY KEY, name TEXT CHECK (name = 'x'))"],
     False, "table 'experiments' on 'experiments' differs"),
    (["DROP TABLE experiments"], False, "it lacks table 'experiments'"),
    (["UPDATE alembic_version SET version_num = 'older'"], False, "its Alembic revision is older, not head"),
])
def test_a_tampered_template_is_discarded_with_a_message_and_rebuilt(
        monkeypatch, tmp_path: Path, capsys, statements, keep_digest, reason) -> None:
    """Local state is untrusted: a template with rows, triggers or views its tool's migrations never make (a
    planted `@champion` version, an SQL trigger) never becomes a database, whatever its digest file says."""
    monkeypatch.setenv("EF_CACHE_DIR", str(tmp_path / "cache"))
    template = db_templates.template_path("tool", "1")
    template.parent.mkdir(parents=True)
    db_templates.keep_as_template(_db(tmp_path / "fresh.db", []), template)
    _plant(template, statements, keep_digest)
    new = tmp_path / "run" / "x.db"
    with db_templates.started_from_template(new, "tool", "1", rules=RULES) as migrate:
        assert migrate, "a tampered template was used"
        new.parent.mkdir(exist_ok=True)
        _db(new, [])
    err = capsys.readouterr().err
    assert f"database template {template}: " in err and reason in err and "removed it" in err
    assert _rows(new, "experiments") == []
    # Rebuilt from the tool's own migration, and then used again.
    assert db_templates.template_problem(template, db_templates.digest_path(template),
                                         RULES) is None
    assert db_templates.seed(tmp_path / "next.db", template, RULES)


def test_a_corrupt_or_unsigned_template_is_never_seeded(tmp_path: Path, capsys) -> None:
    template = _template(tmp_path / "template.db")
    with template.open("r+b") as f:  # a damaged page, its digest made to match: SQLite's own check refuses it
        f.seek(100)
        f.write(b"\xff" * 2000)
    db_templates.digest_path(template).write_text(sha256_file(template) + "\n")
    assert not db_templates.seed(tmp_path / "a.db", template, RULES) and not (tmp_path / "a.db").exists()
    assert not template.exists() and "removed it" in capsys.readouterr().err
    unsigned = _db(tmp_path / "unsigned.db", [])  # no digest: not kept by this tool
    assert not db_templates.seed(tmp_path / "b.db", unsigned, RULES)
    assert "no digest beside it" in capsys.readouterr().err


def test_a_release_without_a_record_of_its_schema_gets_no_template(monkeypatch, tmp_path: Path, capsys) -> None:
    """What the tool's migrations make is read from the committed record of its release, never from the cache: a
    release with none migrates every new file itself, and keeps no template."""
    monkeypatch.setenv("EF_CACHE_DIR", str(tmp_path / "cache"))
    unknown = db_templates.recorded_rules("tool", "0.0-unrecorded")
    assert unknown.schema is None
    for name in ("a", "b"):
        new = tmp_path / name / "x.db"
        with db_templates.started_from_template(new, "tool", "0.0-unrecorded", rules=unknown) as migrate:
            assert migrate
            new.parent.mkdir()
            _db(new, [])
    assert not db_templates.template_path("tool", "0.0-unrecorded").exists()


def test_a_migrated_file_with_another_schema_is_not_kept(monkeypatch, tmp_path: Path, capsys) -> None:
    """Another SQLAlchemy can write other SQL for the same release: such a file is not kept as a template that
    every later seed would then remove."""
    monkeypatch.setenv("EF_CACHE_DIR", str(tmp_path / "cache"))
    new = tmp_path / "a" / "x.db"
    with db_templates.started_from_template(new, "tool", "1", rules=RULES) as migrate:
        assert migrate
        new.parent.mkdir()
        _db(new, [])
        with contextlib.closing(sqlite3.connect(new)) as db:
            db.execute("CREATE INDEX other ON experiments (name)")
    assert not db_templates.template_path("tool", "1").exists()
    assert "not kept" in capsys.readouterr().err


def test_the_recorded_schemas_are_read(tmp_path: Path) -> None:
    from importlib.metadata import version

    for tool, release in (("mlflow", version("mlflow-skinny")), ("prefect", version("prefect"))):
        rules = db_templates.recorded_rules(tool, release)
        assert rules.schema and rules.heads, f"no record of {tool} {release}: run scripts/record_db_schemas.py"
        assert any(kind == "table" for kind, *_ in rules.schema)
