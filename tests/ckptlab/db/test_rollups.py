"""The stored rollup, on SQLite and PostgreSQL: written with each batch of steps and equal to
the rollup of all the steps at once, unchanged by a retried batch, rebuilt from steps
stored by plain SQL, filled by the migration for runs that predate it, and gone with its
experiment."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sqlalchemy import delete, func, insert, select, text

from ckptlab.db import rollups, store
from ckptlab.db.buckets import LEVELS, Buckets, summarize
from ckptlab.db.database import make_engine, make_sessionmaker
from ckptlab.db.models import Experiment, Step, StepRollup
from ckptlab.domain import SERIES_METRICS
from tests.factories import make_spec, varied_step_record

N = 3000


def sql_row(r: dict, experiment_id: int, attempt: int) -> dict:
    """A record as a plain SQL insert would store it (a NaN loss as NULL)."""
    loss = None if math.isnan(r["loss"]) else r["loss"]
    return {**r, "experiment_id": experiment_id, "attempt": attempt, "loss": loss}


def expected(records: list[dict]) -> Buckets:
    steps = np.array([r["step"] for r in records])
    values = np.array([[r[m] for m in SERIES_METRICS] for r in records], dtype=float)
    return summarize(steps, values)


def stored(session, experiment_id: int, attempt: int = 1) -> Buckets:
    everything = summarize(np.array([0, 2**30]), np.zeros((2, len(SERIES_METRICS))))  # spans every bucket
    return rollups.read_buckets(session, experiment_id=experiment_id, attempt=attempt, like=everything)


def assert_same(a: Buckets, b: Buckets) -> None:
    np.testing.assert_array_equal(a.level, b.level)
    np.testing.assert_array_equal(a.bucket, b.bucket)
    np.testing.assert_array_equal(a.data, b.data)


def test_batches_of_steps_roll_up_as_all_the_steps_at_once(any_session):
    exp = store.create_experiment(any_session, spec=make_spec(), status="running", worker_id="t:1")
    records = [varied_step_record(s) for s in range(1, N + 1)]
    for start in range(0, N, 700):  # batches that end mid-bucket
        store.add_steps(any_session, experiment_id=exp.id, attempt=1, records=records[start : start + 700])
    assert_same(stored(any_session, exp.id), expected(records))
    assert rollups.coverage(any_session, experiment_id=exp.id, attempt=1) == (1, N, N)
    top = any_session.execute(
        select(StepRollup.step_ms_max, StepRollup.step_ms_max_step, StepRollup.loss_count).where(
            StepRollup.experiment_id == exp.id, StepRollup.level == LEVELS[-1]
        )
    ).one()
    assert tuple(top) == (90.0, 1234, N - N // 4)
    assert any_session.scalar(select(StepRollup.reserved_bytes_min).where(StepRollup.level == LEVELS[0])) is None


def test_a_retried_batch_is_rolled_up_once(any_session):
    exp = store.create_experiment(any_session, spec=make_spec(), status="running", worker_id="t:1")
    records = [varied_step_record(s) for s in range(1, 1001)]
    store.add_steps(any_session, experiment_id=exp.id, attempt=1, records=records[:600], skip_existing=True)
    # the writer sends the batch again after a commit whose outcome it did not learn, with
    # the records that arrived meanwhile, and one record twice
    again = records[:1000] + [records[800]]
    assert store.add_steps(any_session, experiment_id=exp.id, attempt=1, records=again, skip_existing=True) == 1001
    assert any_session.scalar(select(func.count()).select_from(Step)) == 1000
    assert_same(stored(any_session, exp.id), expected(records))


def test_a_batch_whose_commit_was_not_acknowledged_is_rolled_up_once(any_database_url, monkeypatch):
    from sqlalchemy.exc import OperationalError

    from ckptlab.worker.service.writer import StepWriter

    engine = make_engine(any_database_url)
    Session = make_sessionmaker(engine)
    with Session() as s:
        exp = store.create_experiment(s, spec=make_spec(), status="running", worker_id="t:1").id
    real = store.add_steps
    lost = {"left": 1}

    def commit_then_lose_the_answer(session, **kwargs):
        done = real(session, **kwargs)
        if lost["left"]:
            lost["left"] -= 1
            raise OperationalError("COMMIT", {}, Exception("server closed the connection unexpectedly"))
        return done

    monkeypatch.setattr("ckptlab.worker.service.writer.add_steps", commit_then_lose_the_answer)
    records = [varied_step_record(s) for s in range(1, 2001)]
    with StepWriter(Session, experiment_id=exp, attempt=1, flush_interval_s=0.01, batch_rows=300) as writer:
        for rec in records:
            writer.put(rec)
    with Session() as s:
        assert s.scalar(select(func.count()).select_from(Step)) == 2000
        assert_same(stored(s, exp), expected(records))
    assert lost["left"] == 0
    engine.dispose()


def test_rebuild_rolls_up_steps_stored_by_plain_sql(any_session):
    exp = store.create_experiment(any_session, spec=make_spec(), status="running", worker_id="t:1")
    records = [varied_step_record(s) for s in range(1, N + 1)]
    store.add_steps(any_session, experiment_id=exp.id, attempt=1, records=records[:1000])
    any_session.execute(insert(Step), [sql_row(r, exp.id, 1) for r in records[1000:]])
    any_session.commit()
    assert rollups.coverage(any_session, experiment_id=exp.id, attempt=1) == (1, 1000, 1000)  # stale
    other = store.create_experiment(any_session, spec=make_spec(), status="running", worker_id="t:2")
    store.add_steps(any_session, experiment_id=other.id, attempt=1, records=records[:10])
    any_session.execute(delete(Step).where(Step.experiment_id == other.id))  # its steps are gone
    any_session.commit()

    done = rollups.rebuild_rollups(any_session)
    assert done == [(exp.id, 1, N)]
    assert_same(stored(any_session, exp.id), expected(records))
    assert len(stored(any_session, other.id)) == 0, "a rollup without steps is dropped"


def test_a_bulk_load_without_the_rollup_is_rolled_up_once_at_the_end(any_session):
    exp = store.create_experiment(any_session, spec=make_spec(), status="running", worker_id="t:1")
    records = [varied_step_record(s) for s in range(1, N + 1)]
    for start in range(0, N, 1000):
        batch = records[start : start + 1000]
        assert store.add_steps(any_session, experiment_id=exp.id, attempt=1, records=batch, rollup=False) == 1000
    assert any_session.scalar(select(func.count()).select_from(Step)) == N
    assert rollups.coverage(any_session, experiment_id=exp.id, attempt=1) is None
    rollups.rebuild_rollups(any_session, experiment_id=exp.id)
    assert_same(stored(any_session, exp.id), expected(records))


def test_a_rollup_goes_with_its_experiment(any_session):
    exp = store.create_experiment(any_session, spec=make_spec(), status="running", worker_id="t:1")
    store.add_steps(any_session, experiment_id=exp.id, attempt=1, records=[varied_step_record(s) for s in range(1, 11)])
    any_session.delete(any_session.get(Experiment, exp.id))
    any_session.commit()
    assert any_session.scalar(select(func.count()).select_from(StepRollup)) == 0


@pytest.fixture(params=["sqlite", "postgresql"])
def old_database_url(request, data_dir) -> str:
    """An empty database on each kind, not migrated."""
    if request.param == "sqlite":
        return f"sqlite:///{data_dir / 'old.db'}"
    return request.getfixturevalue("postgres_cluster").create_database()


def test_the_migration_rolls_up_the_runs_that_exist(old_database_url):
    from alembic import command

    from ckptlab.db.database import _alembic_config, migrate

    engine = make_engine(old_database_url)
    cfg = _alembic_config()
    records = [varied_step_record(s) for s in range(1, 1501)]
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0006")
        conn.execute(
            text(
                "INSERT INTO experiments (status, spec, model_kind, strategy, created_at, attempt, cancel_requested) "
                "VALUES ('succeeded', '{}', 'mlp', 'none', '2026-01-01 00:00:00', 2, false)"
            )
        )
        exp_id = conn.scalar(text("SELECT max(id) FROM experiments"))
        cols = ["experiment_id", "attempt", "step", *SERIES_METRICS]
        for attempt, rows in ((1, records[:40]), (2, records)):
            conn.execute(
                text(f"INSERT INTO steps ({', '.join(cols)}) VALUES ({', '.join(':' + c for c in cols)})"),
                [sql_row(r, exp_id, attempt) for r in rows],
            )
    migrate(engine)
    with make_sessionmaker(engine)() as session:
        assert_same(stored(session, exp_id, attempt=2), expected(records))
        assert_same(stored(session, exp_id, attempt=1), expected(records[:40]))
    engine.dispose()
