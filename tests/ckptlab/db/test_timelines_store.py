"""Memory timelines in the database (issue 34): stored with a run's outcome and only with it,
per attempt, on SQLite and PostgreSQL; gone with their experiment; a prediction's stored with
it when it succeeded, gone with it; the migrations that add the tables go down and up again."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect, select

from ckptlab.db import queue, store
from ckptlab.db.database import make_engine
from ckptlab.db.models import Experiment, MemoryTimeline, Prediction, PredictionTimeline
from ckptlab.domain import Status
from ckptlab.summary import RunSummary
from tests.factories import make_spec
from tests.support import alembic_to


def _row(step: int, is_peak: bool = False, data: bytes = b"CKTL\x01blob") -> dict:
    return {
        "step": step,
        "is_peak": is_peak,
        "n_events": 7,
        "baseline_bytes": 100,
        "peak_bytes": 2**40,
        "peak_index": 3,
        "data": data,
    }


def _claimed(session) -> Experiment:
    exp = store.create_experiment(session, spec=make_spec())
    claimed = queue.claim_next(session, worker_id="w1")
    assert claimed.id == exp.id
    return claimed


def test_timelines_are_stored_with_the_outcome_per_attempt(any_session):
    s = any_session
    exp = _claimed(s)
    blob = bytes(range(256)) * 1000  # any bytes, 256 kB
    done = queue.finish_experiment(
        s,
        experiment_id=exp.id,
        attempt=exp.attempt,
        status=Status.SUCCEEDED,
        timelines=[_row(1), _row(3, is_peak=True, data=blob)],
    )
    assert done
    rows = s.scalars(select(MemoryTimeline).order_by(MemoryTimeline.step)).all()
    keys = [(r.experiment_id, r.attempt, r.step, r.is_peak) for r in rows]
    assert keys == [(exp.id, 1, 1, False), (exp.id, 1, 3, True)]
    assert rows[1].data == blob and rows[1].peak_bytes == 2**40

    # a finish that does not apply (the run already finished) stores nothing
    assert not queue.finish_experiment(s, experiment_id=exp.id, status=Status.SUCCEEDED, timelines=[_row(5)])
    assert s.scalar(select(MemoryTimeline.step).where(MemoryTimeline.step == 5)) is None

    s.delete(s.get(Experiment, exp.id))
    s.commit()
    assert s.scalars(select(MemoryTimeline)).all() == []


@pytest.mark.parametrize(("before", "model"), [("0009", MemoryTimeline), ("0010", PredictionTimeline)])
def test_the_migration_goes_down_and_up_again(any_database_url, before, model):
    # 0010 adds memory_timelines, 0011 prediction_timelines: down to the revision before, the
    # table is gone (and only it); up again, it has the model's columns
    table = model.__tablename__
    engine = make_engine(any_database_url)
    try:
        alembic_to(engine, before, down=True)
        tables = inspect(engine).get_table_names()
        assert table not in tables and "predictions" in tables
        assert (before == "0010") == ("memory_timelines" in tables)
        alembic_to(engine, "head", down=False)
        columns = {c["name"] for c in inspect(engine).get_columns(table)}
        assert columns == {c.name for c in model.__table__.columns}
    finally:
        engine.dispose()


def test_a_predictions_timelines_are_stored_with_it_and_only_when_it_succeeded(any_session):
    s = any_session
    blob = bytes(range(256)) * 1000
    kept = [_row(1), _row(2, is_peak=True, data=blob)]
    done = store.create_prediction(
        s, spec=make_spec(), target="cpu", status=Status.SUCCEEDED, summary=RunSummary(), timelines=kept
    )
    failed = store.create_prediction(s, spec=make_spec(), target="cpu", status=Status.FAILED, timelines=kept)
    rows = s.scalars(select(PredictionTimeline).order_by(PredictionTimeline.step)).all()
    assert [(r.prediction_id, r.step, r.is_peak) for r in rows] == [(done.id, 1, False), (done.id, 2, True)]
    assert rows[1].data == blob and rows[1].peak_bytes == 2**40 and failed.id not in {r.prediction_id for r in rows}

    s.delete(s.get(Prediction, done.id))
    s.commit()
    assert s.scalars(select(PredictionTimeline)).all() == []
