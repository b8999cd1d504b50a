"""``experiments.log`` (issue 33, item 6): the finish records a failed run's traceback apart
from its one-sentence error, and the migration that adds the column moves the tracebacks
older rows kept in ``error`` there, on SQLite and PostgreSQL."""

from __future__ import annotations

from alembic import command
from sqlalchemy import inspect, text

from ckptlab.db import queue, store
from ckptlab.db.database import _alembic_config, make_engine, make_sessionmaker
from ckptlab.db.models import Experiment
from tests.factories import make_spec

OLD_ERROR = (
    "RunError: RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x5 and 3x4)\n\n"
    "Traceback (most recent call last):\n"
    '  File "/srv/ckptlab/.venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", line 125, in forward\n'
    "    return F.linear(input, self.weight, self.bias)\n"
    "RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x5 and 3x4)\n"
)


def test_the_finish_keeps_the_log_apart_from_the_error(any_session):
    exp = store.create_experiment(any_session, spec=make_spec(), status="running", worker_id="w:1")
    done = queue.finish_experiment(
        any_session, experiment_id=exp.id, status="failed", error="ValueError: bad", log="Traceback ...\n"
    )
    row = any_session.get(Experiment, exp.id, populate_existing=True)
    assert done and (row.error, row.log) == ("ValueError: bad", "Traceback ...\n")


def test_the_migration_moves_old_tracebacks_to_the_log(any_database_url):
    engine = make_engine(any_database_url)
    cfg = _alembic_config()
    with make_sessionmaker(engine)() as s:
        old = store.create_experiment(s, spec=make_spec()).id
        plain = store.create_experiment(s, spec=make_spec()).id
        s.execute(text("UPDATE experiments SET error = :e WHERE id = :i"), {"e": OLD_ERROR, "i": old})
        s.execute(text("UPDATE experiments SET error = 'worker lost' WHERE id = :i"), {"i": plain})
        s.commit()
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0008")
        assert "log" not in {c["name"] for c in inspect(engine).get_columns("experiments")}
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
        with make_sessionmaker(engine)() as s:
            moved, kept = s.get(Experiment, old), s.get(Experiment, plain)
            assert moved.error == "RunError: RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x5 and 3x4)"
            assert moved.log == OLD_ERROR
            assert (kept.error, kept.log) == ("worker lost", None)
    finally:
        engine.dispose()
