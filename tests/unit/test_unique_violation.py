"""The prompt set's dataset insert is retried when another unit's run inserted it first, on every MLflow backend
store (the PostgreSQL wording was missed: a cluster CI run failed a unit on it)."""

from enginefoundry.tasks.track import unique_violation


def test_each_backend_stores_unique_refusal_is_recognised_and_nothing_else():
    assert unique_violation(RuntimeError("BAD_REQUEST: (sqlite3.IntegrityError) UNIQUE constraint failed: datasets"))
    assert unique_violation(RuntimeError('BAD_REQUEST: (psycopg.errors.UniqueViolation) duplicate key value violates '
                                         'unique constraint "dataset_pk"'))
    assert unique_violation(RuntimeError("(pymysql.err.IntegrityError) (1062, \"Duplicate entry 'x' for key\")"))
    assert not unique_violation(RuntimeError("BAD_REQUEST: experiment 1 does not exist"))
