"""``experiment_events``: every status change is recorded with the change, on both
databases, and experiments that predate the table get one event from the migration."""

from __future__ import annotations

from sqlalchemy import text

from ckptlab.db import events, queue, store
from ckptlab.db.database import make_engine
from ckptlab.domain import Status
from ckptlab.spec.sweeps import plan_sweep
from tests.factories import make_spec, spec_dict


def changes(session, experiment_id):
    return [(e.status, e.attempt, e.worker_id, e.reason) for e in events.history(session, experiment_id=experiment_id)]


def test_a_run_that_fails_and_one_cancelled_before_it_started(any_session):
    failed = store.create_experiment(any_session, spec=make_spec()).id
    cancelled = store.create_experiment(any_session, spec=make_spec()).id
    assert queue.claim_next(any_session, worker_id="w1").id == failed
    queue.finish_experiment(any_session, experiment_id=failed, status=Status.FAILED, error="RunError: boom\n\ntrace")
    queue.request_cancel(any_session, experiment_id=cancelled)
    assert changes(any_session, failed) == [
        ("queued", 0, None, "submitted"),
        ("running", 1, "w1", "claimed"),
        ("failed", 1, "w1", "RunError: boom"),
    ]
    assert changes(any_session, cancelled) == [
        ("queued", 0, None, "submitted"),
        ("cancelled", 0, None, "cancelled before it started"),
    ]
    # A late outcome of a finished experiment changes nothing, and records nothing.
    assert not queue.finish_experiment(any_session, experiment_id=failed, status=Status.SUCCEEDED)
    assert len(changes(any_session, failed)) == 3


def test_a_sweep_cancelled_and_a_worker_shutdown_requeue(any_session):
    plan = plan_sweep(spec_dict(**{"checkpoint.strategy": "sequential"}), {"checkpoint.segments": [2, 4]})
    sweep = store.create_sweep(any_session, name="s", base={}, axes={"checkpoint.segments": [2, 4]}, plan=plan)
    first = queue.claim_next(any_session, worker_id="w2")
    queue.requeue_experiment(any_session, experiment_id=first.id, attempt=1)
    queue.cancel_sweep(any_session, sweep_id=sweep.id)
    assert changes(any_session, first.id) == [
        ("queued", 0, None, f"submitted with sweep {sweep.id}"),
        ("running", 1, "w2", "claimed"),
        ("queued", 1, "w2", "its worker shut down before it finished"),
        ("cancelled", 1, None, "cancelled with its sweep before it started"),
    ]
    at = [e.at for e in events.history(any_session, experiment_id=first.id)]
    assert at == sorted(at) and all(t.tzinfo is not None for t in at)


def test_the_migration_gives_existing_experiments_one_event(tmp_path):
    from alembic import command

    from ckptlab.db.database import _alembic_config, migrate

    engine = make_engine(f"sqlite:///{tmp_path / 'old.db'}")
    cfg = _alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0004")
        conn.execute(
            text(
                "INSERT INTO experiments (status, spec, model_kind, strategy, created_at, attempt, cancel_requested) "
                "VALUES ('succeeded', '{}', 'mlp', 'none', '2026-01-01 00:00:00', 1, 0)"
            )
        )
    migrate(engine)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT experiment_id, status, attempt, reason FROM experiment_events")).all()
    engine.dispose()
    assert [tuple(r) for r in rows] == [(1, "succeeded", 1, "recorded before events existed")]
