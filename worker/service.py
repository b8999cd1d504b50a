"""The worker loop: claim queued experiments, run each in a child process, store results.

After procrastinate / rq: an atomic claim (:func:`ckptlab.db.store.claim_next`), a stop
event for graceful shutdown, and each experiment in a ``spawn`` child process so that a
crash (segfault, ``os._exit``, OOM kill) marks that experiment ``failed`` instead of taking
the worker down. The child commits every step as it ends, so readers see progress live.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import socket
import threading
import traceback

from ckptlab.db.engine import make_engine, make_sessionmaker, migrate
from ckptlab.db.models import Experiment
from ckptlab.db.store import add_steps, claim_next, finish_experiment, get_experiment
from ckptlab.spec import ExperimentSpec

__all__ = ["execute_experiment", "run_worker", "default_worker_id"]

log = logging.getLogger("ckptlab.worker")


def default_worker_id() -> str:
    """``host:pid``, unique among live workers."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _error_text(exc: BaseException) -> str:
    tb = traceback.format_exception(exc)
    return f"{type(exc).__name__}: {exc}\n\n{''.join(tb[-6:])}"


def execute_experiment(database_url: str, experiment_id: int, attempt: int) -> str:
    """Run one claimed experiment and record its steps and outcome; returns the status.

    Every step is committed as it ends. Any exception marks the experiment ``failed`` with
    the error text (the exception is not re-raised). Runs in the worker's child process
    and, for ``ckptlab run``, in-process.
    """
    from worker.engine import run_experiment  # imports torch: only where experiments run

    engine = make_engine(database_url)
    Session = make_sessionmaker(engine)
    try:
        with Session() as session:
            exp = get_experiment(session, experiment_id=experiment_id)
            if exp is None:
                raise LookupError(f"experiment {experiment_id} does not exist")
            spec = ExperimentSpec.model_validate(exp.spec)

            def on_step(rec: dict) -> None:
                add_steps(session, experiment_id=experiment_id, attempt=attempt, records=[rec])

            try:
                summary = run_experiment(spec, on_step=on_step)
            except Exception as exc:  # noqa: BLE001 - any failure of the run is its outcome
                session.rollback()
                finish_experiment(session, experiment_id=experiment_id, status="failed", error=_error_text(exc))
                return "failed"
            finish_experiment(session, experiment_id=experiment_id, status="succeeded", summary=summary)
            return "succeeded"
    finally:
        engine.dispose()


def _child_main(database_url: str, experiment_id: int, attempt: int) -> None:
    # The parent handles SIGINT for the whole process group; the child finishes its run.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    execute_experiment(database_url, experiment_id, attempt)


def _run_in_child(database_url: str, exp: Experiment, Session) -> None:
    ctx = mp.get_context("spawn")
    proc = ctx.Process(target=_child_main, args=(database_url, exp.id, exp.attempt), daemon=True)
    proc.start()
    proc.join()
    with Session() as session:
        row = get_experiment(session, experiment_id=exp.id)
        if row is not None and row.status == "running":
            # The child died without recording an outcome (crash, kill, OOM killer).
            finish_experiment(
                session,
                experiment_id=exp.id,
                status="failed",
                error=f"the experiment's process exited with code {proc.exitcode} before finishing",
            )


def run_worker(
    *,
    database_url: str,
    stop_event: threading.Event | None = None,
    poll_interval_s: float = 0.5,
    max_experiments: int | None = None,
    exit_when_idle: bool = False,
    worker_id: str | None = None,
) -> int:
    """Claim and run experiments until stopped; returns how many were run.

    Args:
        database_url: SQLAlchemy URL of the shared database (migrated on start).
        stop_event: set it to stop after the running experiment. Default: a fresh event.
        poll_interval_s: sleep between claims when the queue is empty (s). Default 0.5.
        max_experiments: stop after this many. Default: no limit.
        exit_when_idle: return as soon as the queue is empty. Default: False.
        worker_id: recorded on claimed experiments. Default: ``host:pid``.
    """
    stop = stop_event or threading.Event()
    wid = worker_id or default_worker_id()
    engine = make_engine(database_url)
    migrate(engine)
    Session = make_sessionmaker(engine)
    done = 0
    log.info("worker %s polling %s", wid, engine.url.render_as_string(hide_password=True))
    try:
        while not stop.is_set() and (max_experiments is None or done < max_experiments):
            with Session() as session:
                exp = claim_next(session, worker_id=wid)
            if exp is None:
                if exit_when_idle:
                    break
                stop.wait(poll_interval_s)
                continue
            log.info("running experiment %s (attempt %s)", exp.id, exp.attempt)
            _run_in_child(database_url, exp, Session)
            done += 1
    finally:
        engine.dispose()
    return done
