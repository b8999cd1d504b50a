"""A database stall shorter than the lease loses no work: heartbeats retry until shortly
before the lease runs out, step writes and outcomes retry longer still."""

from __future__ import annotations

import sqlite3
import time

import pytest
from sqlalchemy.exc import OperationalError

from ckptlab.db import store
from ckptlab.db.database import make_engine, make_sessionmaker
from ckptlab.domain import FINISHED_STATUSES, Status
from ckptlab.settings import Settings
from ckptlab.worker.service.heartbeat import Heartbeat
from tests.factories import make_spec
from tests.support import in_process_worker, wait_for

#: Held on a separate connection while the worker runs: shorter than the default lease.
STALL_S = 20.0
#: About 11 s of CPU (~7 ms a step with the tracker on): the run goes on computing during the
#: stall, its step writes wait, and it ends during or after the stall depending on the load.
STEPS = 1500


@pytest.fixture
def db(database_url):
    """A session factory on the test's SQLite database."""
    engine = make_engine(database_url)
    yield make_sessionmaker(engine)
    engine.dispose()


def test_default_lease_outlasts_the_sqlite_busy_timeout():
    from ckptlab.db.database import SQLITE_BUSY_TIMEOUT_MS

    settings = Settings()
    assert settings.lease_s == 60 and settings.heartbeat_interval_s == 20
    assert SQLITE_BUSY_TIMEOUT_MS / 1000 <= settings.lease_s / 6


def test_a_failing_heartbeat_retries_until_it_commits_within_the_lease(db, monkeypatch):
    from ckptlab.db import queue

    real = queue.heartbeat_worker
    fail_until = time.monotonic() + 1.5

    def locked_for_a_while(session, **kw):
        if time.monotonic() < fail_until:
            raise OperationalError("UPDATE workers", {}, Exception("database is locked"))
        return real(session, **kw)

    monkeypatch.setattr(queue, "heartbeat_worker", locked_for_a_while)
    beat = Heartbeat(db, worker_id="w", devices=["cpu"], interval_s=0.3, lease_s=3.0)
    try:
        worst = 0.0
        while time.monotonic() < fail_until + 1.0:
            worst = max(worst, beat.silent_for())
            time.sleep(0.02)
        assert beat.silent_for() < 1.0  # it committed once the lock was gone
        assert worst < 3.0  # ... before the lease ran out: one beat retried through the stall
    finally:
        beat.stop()


def test_a_heartbeat_that_cannot_commit_gives_up_before_the_lease_runs_out(db, monkeypatch):
    from ckptlab.db import queue

    def cut_off(*_a, **_kw):
        raise OperationalError("UPDATE workers", {}, Exception("server closed the connection unexpectedly"))

    monkeypatch.setattr(queue, "heartbeat_worker", cut_off)
    beat = Heartbeat(db, worker_id="w", devices=["cpu"], interval_s=100.0, lease_s=2.0)
    try:
        deadline_s = beat.retry_deadline_s()
        t0 = time.monotonic()
        beat._beat()  # one beat, as the side task runs it
        took = time.monotonic() - t0
        assert deadline_s > 1.5 and took > 1.0  # it kept retrying ...
        assert took < 2.0 + 0.5  # ... and gave up before the lease ran out (some slack for a loaded machine)
        assert beat.silent_for() >= took  # nothing was committed
    finally:
        beat.stop()


@pytest.mark.slow
@pytest.mark.timeout(600)  # about 35 s on an idle machine; the cores may be shared
def test_a_20_s_exclusive_lock_loses_no_work(db, database_url, data_dir):
    with db() as s:
        exp_id = store.create_experiment(s, spec=make_spec(steps=STEPS, verify_gradients=False)).id
    settings = Settings(database_url=database_url, data_dir=data_dir)  # the default lease
    with in_process_worker(settings, max_experiments=1, exit_when_idle=True):

        def some_steps():
            with db() as s:
                return len(store.list_steps(s, experiment_id=exp_id)) >= 20

        wait_for(some_steps, timeout=120, interval=0.1)
        locker = sqlite3.connect(str(data_dir / "ckptlab.db"), timeout=10, isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")  # every writer (heartbeat, steps, reaper) waits
        time.sleep(STALL_S)
        locker.execute("COMMIT")
        locker.close()

        def finished():
            with db() as s:
                row = store.get_experiment(s, experiment_id=exp_id)
            return row if row.status in FINISHED_STATUSES else None

        row = wait_for(finished, timeout=240, interval=0.2)  # generous: the cores may be shared
    assert (row.status, row.attempt, row.error) == (Status.SUCCEEDED, 1, None)
    with db() as s:
        assert [a.attempt for a in store.list_attempts(s, experiment_id=exp_id)] == [1]
        assert [r.step for r in store.list_steps(s, experiment_id=exp_id)] == list(range(1, STEPS + 1))
