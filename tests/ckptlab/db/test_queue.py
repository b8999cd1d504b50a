"""The queue protocol of :mod:`ckptlab.db.store` on SQLite and on PostgreSQL: claims, leases
and the reaper, attempts, cancels, the batch step writer, and the migrations themselves."""

from __future__ import annotations

import threading

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import update
from sqlalchemy.exc import OperationalError

from ckptlab.db import queue, store
from ckptlab.db.database import make_engine, make_sessionmaker
from ckptlab.db.models import Base, Experiment, Sweep
from ckptlab.summary import RunSummary
from ckptlab.worker.service.writer import StepWriter
from tests.factories import make_spec, step_record
from tests.support import age_lease, wait_for


def _claimed(session, worker_id="w1", **spec):
    exp = store.create_experiment(session, spec=make_spec(**spec))
    queue.register_worker(session, worker_id=worker_id, host="h", pid=1, devices=["cpu"])
    claimed = queue.claim_next(session, worker_id=worker_id)
    assert claimed.id == exp.id
    return claimed


def test_migrations_create_exactly_the_models_schema(any_database_url):
    engine = make_engine(any_database_url)
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    engine.dispose()


def test_concurrent_claims_never_share_an_experiment(any_database_url):
    engine = make_engine(any_database_url)
    Session = make_sessionmaker(engine)
    with Session() as s:
        ids = [store.create_experiment(s, spec=make_spec()).id for _ in range(60)]
    claimed: list[int] = []
    lock = threading.Lock()

    def claimer(wid):
        with Session() as s:
            while (exp := queue.claim_next(s, worker_id=wid)) is not None:
                with lock:
                    claimed.append(exp.id)

    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(claimed) == ids
    engine.dispose()


def test_reaper_requeues_only_experiments_of_silent_workers(any_session):
    s = any_session
    lost = _claimed(s, "silent")
    alive = _claimed(s, "alive")
    stopped = _claimed(s, "stopped")
    queue.stop_worker(s, worker_id="stopped")
    fresh = _claimed(s, "silent-but-just-claimed")
    for exp in (lost, alive, stopped):
        age_lease(s, experiment_id=exp.id, seconds=60)
    age_lease(s, worker_id="silent", seconds=60)
    age_lease(s, worker_id="silent-but-just-claimed", seconds=60)

    assert queue.reap_lost(s, lease_s=30, max_attempts=3) == 2
    s.expire_all()
    rows = {e.id: s.get(Experiment, e.id) for e in (lost, alive, stopped, fresh)}
    assert (rows[lost.id].status, rows[lost.id].attempt, rows[lost.id].worker_id) == ("queued", 1, None)
    assert rows[stopped.id].status == "queued"
    assert rows[alive.id].status == "running"  # its worker heartbeats
    assert rows[fresh.id].status == "running"  # claimed less than a lease ago
    assert queue.reap_lost(s, lease_s=30, max_attempts=3) == 0

    again = queue.claim_next(s, worker_id="alive")
    assert (again.id, again.attempt) == (lost.id, 2)  # the next claim raises the attempt


def test_reaper_fails_after_max_attempts_and_honours_cancel_requests(any_session):
    s = any_session
    worn = _claimed(s, "gone")
    s.execute(update(Experiment).where(Experiment.id == worn.id).values(attempt=3))
    flagged = _claimed(s, "gone")
    queue.request_cancel(s, experiment_id=flagged.id)
    for exp in (worn, flagged):
        age_lease(s, experiment_id=exp.id, seconds=60)
    age_lease(s, worker_id="gone", seconds=60)

    assert queue.reap_lost(s, lease_s=30, max_attempts=3) == 2
    s.expire_all()
    worn_row, flagged_row = s.get(Experiment, worn.id), s.get(Experiment, flagged.id)
    assert (worn_row.status, worn_row.error) == ("failed", queue.WORKER_LOST)
    assert worn_row.finished_at is not None
    assert flagged_row.status == "cancelled"
    assert [a.lost for a in store.list_attempts(s, experiment_id=worn.id)] == [True, True, True]


def test_reaper_takes_experiments_of_unregistered_processes_after_a_lease(any_session):
    s = any_session
    exp = store.create_experiment(s, spec=make_spec(), status="running", worker_id="never-registered")
    assert queue.reap_lost(s, lease_s=30, max_attempts=3) == 0
    age_lease(s, experiment_id=exp.id, seconds=60)
    assert queue.reap_lost(s, lease_s=30, max_attempts=3) == 1


def test_reaper_fails_a_lost_in_process_run_instead_of_requeueing_it(any_session):
    s = any_session
    wid = f"{queue.IN_PROCESS_PREFIX}host:123"
    queue.register_worker(s, worker_id=wid, host="host", pid=123, devices=["cpu"])
    lost = store.create_experiment(s, spec=make_spec(), status="running", worker_id=wid)
    alive_wid = f"{queue.IN_PROCESS_PREFIX}host:456"
    queue.register_worker(s, worker_id=alive_wid, host="host", pid=456, devices=["cpu"])
    alive = store.create_experiment(s, spec=make_spec(), status="running", worker_id=alive_wid)
    # "profile:" is the prefix, not a substring: a worker named otherwise is requeued as ever.
    other = _claimed(s, "my-profile:worker")
    for exp in (lost, alive, other):
        age_lease(s, experiment_id=exp.id, seconds=60)
    age_lease(s, worker_id=wid, seconds=60)
    age_lease(s, worker_id="my-profile:worker", seconds=60)

    assert queue.reap_lost(s, lease_s=30, max_attempts=3) == 2
    s.expire_all()
    row = s.get(Experiment, lost.id)
    assert (row.status, row.error, row.attempt, row.worker_id) == ("failed", queue.IN_PROCESS_LOST, 1, wid)
    assert row.finished_at is not None
    assert s.get(Experiment, alive.id).status == "running"  # its process heartbeats
    assert s.get(Experiment, other.id).status == "queued"
    assert queue.claim_next(s, worker_id="dashboard").id == other.id  # never the lost profile run
    assert queue.claim_next(s, worker_id="dashboard") is None


def test_outcomes_only_land_on_the_attempt_that_is_running(any_session):
    s = any_session
    exp = _claimed(s)
    assert queue.requeue_experiment(s, experiment_id=exp.id, attempt=1)
    assert not queue.finish_experiment(s, experiment_id=exp.id, attempt=1, status="succeeded")
    second = queue.claim_next(s, worker_id="w2")
    assert second.attempt == 2
    # the worker of attempt 1 comes back late: it changes nothing
    assert not queue.finish_experiment(s, experiment_id=exp.id, attempt=1, status="failed", error="late")
    assert not queue.requeue_experiment(s, experiment_id=exp.id, attempt=1)
    assert queue.finish_experiment(
        s,
        experiment_id=exp.id,
        attempt=2,
        status="oom",
        summary=RunSummary.model_validate({"oom": {"phase": "forward"}}),
        warnings=["w"],
    )
    row = s.get(Experiment, exp.id, populate_existing=True)
    assert (row.status, row.summary, row.warnings, row.error) == ("oom", {"oom": {"phase": "forward"}}, ["w"], None)
    with pytest.raises(ValueError, match="not a finished status"):
        queue.finish_experiment(s, experiment_id=exp.id, status="running")


def test_attempts_keep_and_mark_the_steps_of_lost_attempts(any_session):
    s = any_session
    exp = _claimed(s)
    store.add_steps(s, experiment_id=exp.id, attempt=1, records=[step_record(i) for i in (1, 2, 3)])
    queue.requeue_experiment(s, experiment_id=exp.id, attempt=1)
    assert store.list_attempts(s, experiment_id=exp.id) == [store.Attempt(1, 3, lost=True, current=True)]
    queue.claim_next(s, worker_id="w2")
    store.add_steps(s, experiment_id=exp.id, attempt=2, records=[step_record(1)])
    assert store.list_attempts(s, experiment_id=exp.id) == [
        store.Attempt(1, 3, lost=True, current=False),
        store.Attempt(2, 1, lost=False, current=True),
    ]
    assert [r.step for r in store.list_steps(s, experiment_id=exp.id)] == [1]
    assert [r.step for r in store.list_steps(s, experiment_id=exp.id, attempt=1)] == [1, 2, 3]
    assert store.list_attempts(s, experiment_id=10_000) == []


def test_cancel_queued_at_once_running_by_flag_finished_refused(any_session):
    s = any_session
    running = _claimed(s)
    done = _claimed(s)
    queue.finish_experiment(s, experiment_id=done.id, status="succeeded")
    queued = store.create_experiment(s, spec=make_spec())

    row = queue.request_cancel(s, experiment_id=queued.id)
    assert (row.status, row.finished_at is not None) == ("cancelled", True)
    row = queue.request_cancel(s, experiment_id=running.id)
    assert (row.status, row.cancel_requested) == ("running", True)
    assert queue.request_cancel(s, experiment_id=running.id).cancel_requested  # asking twice is fine
    with pytest.raises(queue.ExperimentFinishedError):
        queue.request_cancel(s, experiment_id=done.id)
    with pytest.raises(queue.ExperimentFinishedError):
        queue.request_cancel(s, experiment_id=queued.id)
    assert queue.request_cancel(s, experiment_id=10_000) is None
    assert queue.claim_next(s, worker_id="w3") is None  # the cancelled one is never claimed


def test_cancel_sweep_cancels_every_unfinished_experiment(any_session):
    s = any_session
    sweep = Sweep(name="sw", base={}, axes={})
    s.add(sweep)
    s.commit()
    exps = [store.create_experiment(s, spec=make_spec()) for _ in range(3)]
    other = store.create_experiment(s, spec=make_spec())
    for e in exps:
        s.execute(update(Experiment).where(Experiment.id == e.id).values(sweep_id=sweep.id))
    s.commit()
    running = queue.claim_next(s, worker_id="w1")
    queue.finish_experiment(s, experiment_id=queue.claim_next(s, worker_id="w1").id, status="succeeded")

    assert queue.cancel_sweep(s, sweep_id=sweep.id) == 2  # one queued, one running
    s.expire_all()
    assert [s.get(Experiment, e.id).status for e in exps] == ["running", "succeeded", "cancelled"]
    assert s.get(Experiment, running.id).cancel_requested
    assert s.get(Experiment, other.id).status == "queued"
    assert s.get(Sweep, sweep.id).cancelled
    assert queue.cancel_sweep(s, sweep_id=10_000) is None


def test_step_writer_commits_promptly_in_batches(any_database_url):
    engine = make_engine(any_database_url)
    Session = make_sessionmaker(engine)
    with Session() as s:
        exp = _claimed(s)
    writer = StepWriter(Session, experiment_id=exp.id, attempt=1, flush_interval_s=0.2).start()
    writer.put(step_record(1))
    # The first step is committed on its own while the writer is open (the live view does
    # not wait for a batch or for the run's end); how soon is bench/, not a test, figure:
    # on a loaded host (load average 9 on 2 cores) it took 4.4 s.
    with Session() as s:
        wait_for(lambda: store.list_steps(s, experiment_id=exp.id), timeout=60, interval=0.02)
    for i in range(2, 1001):
        writer.put(step_record(i))
    assert writer.close() == 1000
    with Session() as s:
        assert [r.step for r in store.list_steps(s, experiment_id=exp.id)] == list(range(1, 1001))
    engine.dispose()


def test_step_writer_retries_a_failing_database_without_losing_steps(any_database_url, monkeypatch):
    engine = make_engine(any_database_url)
    Session = make_sessionmaker(engine)
    with Session() as s:
        exp = _claimed(s)
    real_add_steps = store.add_steps
    failures = {"left": 4}

    def flaky_add_steps(session, **kwargs):
        if failures["left"]:
            failures["left"] -= 1
            raise OperationalError("INSERT", {}, Exception("database is locked"))
        return real_add_steps(session, **kwargs)

    monkeypatch.setattr("ckptlab.worker.service.writer.add_steps", flaky_add_steps)
    writer = StepWriter(Session, experiment_id=exp.id, attempt=1, flush_interval_s=0.05).start()
    for i in range(1, 301):
        writer.put(step_record(i))
    assert writer.close(timeout_s=30) == 300
    assert failures["left"] == 0
    with Session() as s:
        assert len(store.list_steps(s, experiment_id=exp.id)) == 300
    engine.dispose()


def test_add_steps_can_skip_rows_already_stored(any_session):
    exp = _claimed(any_session)
    store.add_steps(any_session, experiment_id=exp.id, attempt=1, records=[step_record(1)])
    store.add_steps(
        any_session, experiment_id=exp.id, attempt=1, records=[step_record(1), step_record(2)], skip_existing=True
    )
    assert [r.step for r in store.list_steps(any_session, experiment_id=exp.id)] == [1, 2]
