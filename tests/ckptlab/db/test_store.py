import math

from sqlalchemy import func, select

from ckptlab.db.models import Experiment, Step
from ckptlab.db.queue import claim_next, finish_experiment
from ckptlab.db.store import add_steps, create_experiment, list_steps
from tests.factories import make_spec, step_record


def test_claim_takes_oldest_queued_once(db_session):
    a = create_experiment(db_session, spec=make_spec())
    b = create_experiment(db_session, spec=make_spec())
    first = claim_next(db_session, worker_id="w1")
    second = claim_next(db_session, worker_id="w2")
    assert (first.id, second.id) == (a.id, b.id)
    assert first.status == "running" and first.worker_id == "w1" and first.attempt == 1
    assert claim_next(db_session, worker_id="w3") is None


def test_non_finite_loss_is_explicit(db_session):
    exp = create_experiment(db_session, spec=make_spec(), status="running")
    add_steps(
        db_session,
        experiment_id=exp.id,
        attempt=1,
        records=[step_record(1, math.nan), step_record(2, math.inf), step_record(3, -math.inf), step_record(4, 0.25)],
    )
    rows = list_steps(db_session, experiment_id=exp.id)
    assert [(r.loss, r.loss_nonfinite) for r in rows] == [(None, "nan"), (None, "inf"), (None, "-inf"), (0.25, None)]


def test_steps_of_other_attempts_are_not_mixed_in(db_session):
    exp = create_experiment(db_session, spec=make_spec(), status="running")
    add_steps(db_session, experiment_id=exp.id, attempt=1, records=[step_record(1), step_record(2)])
    exp.attempt = 2
    db_session.commit()
    add_steps(db_session, experiment_id=exp.id, attempt=2, records=[step_record(1)])
    assert len(list_steps(db_session, experiment_id=exp.id)) == 1
    assert len(list_steps(db_session, experiment_id=exp.id, attempt=1)) == 2
    assert db_session.scalar(select(func.count()).select_from(Step)) == 3


def test_finish_records_outcome(db_session):
    exp = create_experiment(db_session, spec=make_spec(), status="running")
    finish_experiment(db_session, experiment_id=exp.id, status="failed", error="boom")
    row = db_session.get(Experiment, exp.id, populate_existing=True)
    assert (row.status, row.error) == ("failed", "boom")
    assert row.finished_at is not None
