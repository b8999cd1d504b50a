"""The worker as a queue that survives crashes, OOMs, cancels, shutdowns and many workers,
on SQLite and on PostgreSQL (``any_database_url`` runs each test on both).

Workers run either as real ``ckptlab worker`` processes (to be killed or signalled) or
in-process in a thread (cheaper: the test process's forkserver is shared).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError

from ckptlab.db import events, queue, store
from ckptlab.db.database import make_engine, make_sessionmaker
from ckptlab.db.models import Experiment, Step, Worker
from ckptlab.domain import FINISHED_STATUSES
from ckptlab.settings import Settings
from ckptlab.worker.service.slots import run_worker
from tests.factories import make_spec, sharded_spec, spec_dict
from tests.support import in_process_worker as worker_thread
from tests.support import wait_for

#: Lease for the workers of these tests: a killed worker's experiment is requeued after it.
LEASE_S = 2.0
LONG = {"steps": 100_000, "verify_gradients": False}  # runs until stopped


@pytest.fixture
def db(any_database_url):
    """A session factory on the test's database."""
    engine = make_engine(any_database_url)
    yield make_sessionmaker(engine)
    engine.dispose()


def _create(Session, **spec) -> int:
    with Session() as s:
        return store.create_experiment(s, spec=make_spec(**spec)).id


def _row(Session, experiment_id) -> Experiment:
    with Session() as s:
        return store.get_experiment(s, experiment_id=experiment_id)


def _steps(Session, experiment_id, attempt=None) -> list[int]:
    with Session() as s:
        return [r.step for r in store.list_steps(s, experiment_id=experiment_id, attempt=attempt)]


def _status_is(Session, experiment_id, *statuses):
    def check():
        row = _row(Session, experiment_id)
        return row if row.status in statuses else None

    return check


@pytest.fixture
def spawn_worker(any_database_url, data_dir) -> Iterator:
    """Start ``ckptlab worker`` processes on the test's database; all are killed at the end."""
    procs: list[subprocess.Popen] = []
    logs = []

    def spawn(name: str, **env: str) -> subprocess.Popen:
        full_env = {
            **os.environ,
            "CKPTLAB_DATABASE_URL": any_database_url,
            "CKPTLAB_DATA_DIR": str(data_dir),
            "CKPTLAB_POLL_INTERVAL_S": "0.05",
            "CKPTLAB_LEASE_S": str(LEASE_S),
            "OMP_NUM_THREADS": "1",  # several workers share 2 cores: no spinning thread pools
            **env,
        }
        log = open(data_dir / f"worker-{name}.log", "wb")
        logs.append(log)
        proc = subprocess.Popen(
            [sys.executable, "-m", "ckptlab.cli", "worker", "--cpu-slots", "1"],
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        procs.append(proc)
        return proc

    yield spawn
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
    for log in logs:
        log.close()


def _worker_id(proc: subprocess.Popen) -> str:
    return f"{socket.gethostname()}:{proc.pid}"


def _gone(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@contextmanager
def in_process_worker(
    url: str, data_dir: Path, cpu_slots: int = 1, **settings_kw
) -> Iterator[tuple[threading.Event, threading.Event]]:
    """A worker thread with this module's short lease; yields its (stop, kill) events."""
    settings = Settings(database_url=url, data_dir=data_dir, lease_s=LEASE_S, **settings_kw)
    with worker_thread(settings, worker_id=f"in-process-{threading.get_ident()}", cpu_slots=cpu_slots) as events:
        yield events


@pytest.mark.slow
def test_killed_worker_experiment_is_requeued_and_completed_by_another(db, spawn_worker):
    exp_id = _create(db, steps=200, verify_gradients=False)
    a = spawn_worker("a")
    wait_for(lambda: len(_steps(db, exp_id, attempt=1)) >= 5, timeout=60, interval=0.05)
    b = spawn_worker("b")  # idles: nothing is queued until its reaper requeues the lost one
    a_descendants = psutil.Process(a.pid).children(recursive=True)
    assert a_descendants  # the forkserver and the experiment's child

    a.send_signal(signal.SIGKILL)
    a.wait(10)
    # No orphan goes on running the lost attempt next to the new one.
    wait_for(lambda: all(_gone(p) for p in a_descendants), timeout=10, interval=0.05)
    row = wait_for(_status_is(db, exp_id, *FINISHED_STATUSES), timeout=90, interval=0.2)

    assert (row.status, row.attempt, row.worker_id) == ("succeeded", 2, _worker_id(b))
    with db() as s:
        attempts = store.list_attempts(s, experiment_id=exp_id)
    assert [(a.attempt, a.lost, a.current) for a in attempts] == [(1, True, False), (2, False, True)]
    assert 5 <= attempts[0].steps < 200  # the lost attempt's steps are kept, under attempt 1
    assert _steps(db, exp_id) == list(range(1, 201))  # the series shown is attempt 2's alone
    # What happened is recorded, not inferred: who lost attempt 1, when and why.
    with db() as s:
        history = [(e.status, e.attempt, e.worker_id, e.reason) for e in events.history(s, experiment_id=exp_id)]
    lost = f"worker {_worker_id(a)} lost (no heartbeat for {LEASE_S:g} s); requeued"
    assert history == [
        ("queued", 0, None, "submitted"),
        ("running", 1, _worker_id(a), "claimed"),
        ("queued", 1, _worker_id(a), lost),
        ("running", 2, _worker_id(b), "claimed"),
        ("succeeded", 2, _worker_id(b), None),
    ]


@pytest.mark.slow
def test_four_workers_finish_200_experiments_exactly_once(db, spawn_worker):
    with db() as s:
        spec = make_spec(steps=2, verify_gradients=False, batch_size=2, **{"model.depth": 1, "model.width": 8})
        ids = [store.create_experiment(s, spec=spec).id for _ in range(200)]
    # The default 30 s lease: on two loaded cores a 2 s lease can run out for a live worker,
    # whose experiment would then (correctly) be run again, which this test must not mix in.
    workers = [spawn_worker(f"w{i}", CKPTLAB_LEASE_S="30") for i in range(4)]

    def all_finished():
        with db() as s:
            n = s.scalar(select(func.count()).select_from(Experiment).where(Experiment.status.in_(FINISHED_STATUSES)))
        return n == len(ids)

    wait_for(all_finished, timeout=170, interval=0.5)
    with db() as s:
        rows = s.execute(select(Experiment.status, Experiment.attempt, Experiment.worker_id)).all()
        steps = dict(
            s.execute(
                select(Step.experiment_id, func.count()).where(Step.attempt == 1).group_by(Step.experiment_id)
            ).all()
        )
        other_attempts = s.scalar(select(func.count()).select_from(Step).where(Step.attempt != 1))
    assert {(status, attempt) for status, attempt, _ in rows} == {("succeeded", 1)}  # each claimed once
    assert steps == {i: 2 for i in ids} and other_attempts == 0  # each ran exactly once
    assert len({wid for *_, wid in rows}) >= 2  # shared between workers
    assert {wid for *_, wid in rows} <= {_worker_id(w) for w in workers}


def test_out_of_memory_ends_oom_and_the_worker_runs_the_next(db, any_database_url, data_dir):
    oom_id = _create(db, memory_limit_bytes=10_000)
    ok_id = _create(db)
    settings = Settings(database_url=any_database_url, data_dir=data_dir)
    ran = run_worker(database_url=any_database_url, exit_when_idle=True, settings=settings, poll_interval_s=0.05)

    assert ran == 2
    oom = _row(db, oom_id)
    assert oom.status == "oom"
    assert oom.summary["oom"]["limit_bytes"] == 10_000
    assert oom.summary["oom"]["live_bytes"] > 10_000
    assert {"phase", "step"} <= set(oom.summary["oom"])
    assert oom.error.startswith("RunOutOfMemory: ") and isinstance(oom.warnings, list)
    ok = _row(db, ok_id)
    assert ok.status == "succeeded"
    assert ok.warnings == ok.summary["warnings"]
    assert 0 < ok.summary["claim_to_first_step_s"] < 10


def test_timeout_kills_the_run_and_records_timed_out(db, any_database_url, data_dir):
    slow_id = _create(db, timeout_s=1.0, **LONG)
    next_id = _create(db)
    with in_process_worker(any_database_url, data_dir):
        row = wait_for(_status_is(db, slow_id, *FINISHED_STATUSES), timeout=30, interval=0.05)
        wait_for(_status_is(db, next_id, *FINISHED_STATUSES), timeout=30, interval=0.05)
    assert row.status == "timed_out" and "killed after 1 s" in row.error
    assert _row(db, next_id).status == "succeeded"


def test_cancel_queued_and_running_through_the_api(db, any_database_url, data_dir):
    from ckptlab.backend.app import create_app

    settings = Settings(database_url=any_database_url, data_dir=data_dir, lease_s=LEASE_S)
    with TestClient(create_app(settings)) as client, in_process_worker(any_database_url, data_dir):
        running = client.post("/api/experiments", json=spec_dict(**LONG)).json()["id"]
        wait_for(lambda: client.get(f"/api/experiments/{running}/steps").json()["count"] > 0, interval=0.05)
        queued = client.post("/api/experiments", json=spec_dict()).json()["id"]  # behind the long one

        r = client.post(f"/api/experiments/{queued}/cancel")
        assert r.status_code == 200 and r.json()["status"] == "cancelled"
        t0 = time.monotonic()
        r = client.post(f"/api/experiments/{running}/cancel")
        assert r.status_code == 200 and r.json()["status"] == "running"
        wait_for(lambda: client.get(f"/api/experiments/{running}").json()["status"] == "cancelled", interval=0.05)
        assert time.monotonic() - t0 < 2.0

        assert client.post(f"/api/experiments/{running}/cancel").status_code == 409
        assert client.post("/api/experiments/99999/cancel").status_code == 404
        after = client.post("/api/experiments", json=spec_dict()).json()["id"]  # the worker goes on
        wait_for(lambda: client.get(f"/api/experiments/{after}").json()["status"] == "succeeded", interval=0.05)
    assert _row(db, queued).started_at is None  # never ran


@pytest.mark.slow
def test_sigterm_finishes_the_running_experiment_and_a_second_one_requeues_at_once(db, spawn_worker, data_dir):
    first = _create(db, steps=150, verify_gradients=False)
    second = _create(db, **LONG)
    w1 = spawn_worker("graceful", CKPTLAB_SHUTDOWN_GRACE_S="60")
    wait_for(lambda: _steps(db, first), timeout=60, interval=0.05)
    w1.send_signal(signal.SIGTERM)
    assert w1.wait(60) == 0
    assert _row(db, first).status == "succeeded"
    assert _steps(db, first) == list(range(1, 151))
    assert (_row(db, second).status, _row(db, second).attempt) == ("queued", 0)  # nothing more claimed
    with db() as s:
        assert s.get(Worker, _worker_id(w1)).stopped_at is not None

    w2 = spawn_worker("impatient", CKPTLAB_SHUTDOWN_GRACE_S="600")
    wait_for(lambda: _steps(db, second, attempt=1), timeout=60, interval=0.05)
    w2.send_signal(signal.SIGTERM)
    # Signals that arrive together are handled once: send the second after the first is seen.
    wait_for(lambda: b"claiming nothing more" in (data_dir / "worker-impatient.log").read_bytes(), timeout=10)
    w2.send_signal(signal.SIGTERM)
    assert w2.wait(15) == 0  # far less than the 600 s grace
    row = _row(db, second)
    assert (row.status, row.attempt, row.worker_id) == ("queued", 1, None)
    with db() as s:
        assert store.list_attempts(s, experiment_id=second)[0].lost


def test_stop_requeues_after_the_grace_period_and_kill_at_once(db, any_database_url, data_dir):
    exp_id = _create(db, **LONG)
    with in_process_worker(any_database_url, data_dir, shutdown_grace_s=0.5) as (stop, _kill):
        wait_for(lambda: _steps(db, exp_id, attempt=1), timeout=60, interval=0.05)
        stop.set()
        row = wait_for(_status_is(db, exp_id, "queued"), timeout=10, interval=0.05)
    assert (row.attempt, row.worker_id, row.started_at) == (1, None, None)
    assert _steps(db, exp_id, attempt=1)  # kept, and marked lost

    with in_process_worker(any_database_url, data_dir, shutdown_grace_s=600) as (stop, kill):
        wait_for(lambda: _steps(db, exp_id, attempt=2), timeout=60, interval=0.05)
        stop.set()
        kill.set()
        row = wait_for(_status_is(db, exp_id, "queued"), timeout=10, interval=0.05)
    assert row.attempt == 2
    with db() as s:
        assert [a.lost for a in store.list_attempts(s, experiment_id=exp_id)] == [True, True]


def test_cpu_slots_run_experiments_side_by_side_each_in_its_own_child(db, any_database_url, data_dir):
    ids = [_create(db, **LONG) for _ in range(2)]
    with in_process_worker(any_database_url, data_dir, cpu_slots=2):
        wait_for(lambda: all(_steps(db, i, attempt=1) for i in ids), timeout=60, interval=0.05)
        with db() as s:
            rows = [store.get_experiment(s, experiment_id=i) for i in ids]
        assert [r.status for r in rows] == ["running", "running"]  # both at once
        for i in ids:
            with db() as s:
                queue.request_cancel(s, experiment_id=i)
        for i in ids:
            wait_for(_status_is(db, i, "cancelled"), timeout=10, interval=0.05)


def test_a_worker_cut_off_from_the_database_stops_its_run_and_it_is_requeued(
    db, any_database_url, data_dir, monkeypatch, caplog
):
    exp_id = _create(db, **LONG)
    with in_process_worker(any_database_url, data_dir):
        wait_for(lambda: _steps(db, exp_id, attempt=1), timeout=60, interval=0.05)

        def cut_off(*_args, **_kwargs):
            raise OperationalError("UPDATE workers", {}, Exception("server closed the connection unexpectedly"))

        monkeypatch.setattr("ckptlab.db.queue.heartbeat_worker", cut_off)  # its heartbeats fail from now on
        # After a lease without a heartbeat the run is requeued (by the reaper) and the worker
        # kills its own copy: it noticed its lease ran out, or that the run was taken away.
        row = wait_for(_status_is(db, exp_id, "queued"), timeout=15, interval=0.05)
        wait_for(lambda: f"killing experiment {exp_id}" in caplog.text or "killing it" in caplog.text, timeout=5)
        assert row.attempt == 1


def test_backend_reaper_requeues_experiments_of_a_silent_worker(db, any_database_url, data_dir):
    from ckptlab.backend.app import create_app

    with db() as s:
        exp = store.create_experiment(s, spec=make_spec())
        queue.register_worker(s, worker_id="vanished", host="h", pid=1, devices=["cpu"])
        queue.claim_next(s, worker_id="vanished")
    settings = Settings(database_url=any_database_url, data_dir=data_dir, lease_s=0.3)
    with TestClient(create_app(settings)):
        row = wait_for(_status_is(db, exp.id, "queued"), timeout=10, interval=0.05)
    assert row.attempt == 1


def _kill_a_rank_of(Session, experiment_id: int, attempt: int) -> None:
    """SIGKILL rank 1 of the attempt once it has stored a step (its ranks are descendants of
    this process: the in-process worker's slot child starts them)."""
    from ckptlab.worker.distributed.launch import RANK_MODULE

    def rank_1():
        if not _steps(Session, experiment_id, attempt=attempt):
            return None
        ranks = [p for p in psutil.Process().children(recursive=True) if RANK_MODULE in " ".join(_cmdline(p))]
        return sorted(ranks, key=lambda p: _cmdline(p)[3:4])[1] if len(ranks) == 2 else None

    wait_for(rank_1, timeout=120, interval=0.05).send_signal(signal.SIGKILL)


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


@pytest.mark.slow
def test_a_lost_rank_requeues_the_run_and_fails_it_after_the_last_attempt(db, any_database_url, data_dir):
    spec = sharded_spec("mlp", "per_block").model_copy(
        update={"steps": 600, "memory_early_stop": False, "verify_gradients": False}
    )
    with db() as s:
        exp_id = store.create_experiment(s, spec=spec).id
    with in_process_worker(any_database_url, data_dir, max_attempts=2):
        for attempt in (1, 2):
            _kill_a_rank_of(db, exp_id, attempt)
        row = wait_for(_status_is(db, exp_id, *FINISHED_STATUSES), timeout=60, interval=0.1)
    assert (row.status, row.attempt) == ("failed", 2)
    assert row.error.startswith("RankLost: rank 1 exited (signal 9) without a summary")
    with db() as s:
        history = [(e.status, e.attempt, e.reason) for e in events.history(s, experiment_id=exp_id)]
    lost = "RankLost: rank 1 exited (signal 9) without a summary"
    assert history == [
        ("queued", 0, "submitted"),
        ("running", 1, "claimed"),
        ("queued", 1, lost),
        ("running", 2, "claimed"),
        ("failed", 2, lost),
    ]
    assert not [
        p for p in psutil.Process().children(recursive=True) if _cmdline(p)[2:3] == ["ckptlab.worker.distributed.rank"]
    ]
