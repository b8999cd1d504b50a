"""The queue protocol, shared by every worker and the backend on SQLite and PostgreSQL.

This module is the only place that moves an experiment between statuses
(:class:`ckptlab.domain.Status`); after procrastinate's ``manager``, it is the only caller
of the claim SQL.

- :func:`claim_next` moves the oldest ``queued`` experiment to ``running`` and raises its
  ``attempt``; steps are stored per attempt.
- Workers :func:`register_worker` and :func:`heartbeat_worker`; :func:`reap_lost` requeues a
  running experiment whose worker fell silent for longer than the lease (or fails it with
  "worker lost" after the maximum attempts, or at once when its worker was an in-process
  ``ckptlab.profile`` run, :data:`IN_PROCESS_PREFIX`). Times come from the database's clock
  on PostgreSQL, so hosts with skewed clocks agree on who is silent.
- :func:`finish_experiment` and :func:`requeue_experiment` only touch the attempt they are
  given while it is still ``running``, so a worker that lost its lease can never overwrite
  the outcome of a later attempt.
- :func:`request_cancel` and :func:`cancel_sweep` are the user's side of the protocol.

Every status change is recorded in ``experiment_events`` in the same transaction
(:func:`ckptlab.db.events.record_events`: when, to what, which attempt and worker, why).

All functions take keyword-only arguments and a SQLAlchemy ``Session`` and commit, so that
other processes see the change at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import and_, delete, exists, insert, select, update
from sqlalchemy.orm import Session

from ckptlab.db.database import db_now, is_postgresql
from ckptlab.db.events import first_line, record_events
from ckptlab.db.models import Experiment, MemoryTimeline, Sweep, Worker
from ckptlab.domain import FINISHED_STATUSES, Status
from ckptlab.summary import RunSummary

__all__ = [
    "claim_next",
    "finish_experiment",
    "requeue_experiment",
    "request_cancel",
    "cancel_sweep",
    "ExperimentFinishedError",
    "RunState",
    "get_run_state",
    "register_worker",
    "heartbeat_worker",
    "stop_worker",
    "reap_lost",
    "WORKER_LOST",
    "IN_PROCESS_PREFIX",
    "IN_PROCESS_LOST",
]

#: Error text of an experiment failed because its worker was lost ``max_attempts`` times.
WORKER_LOST = "worker lost"
#: Worker ids of processes that run their own experiments (``ckptlab.profile``: the model
#: exists only in that process) start with this; no worker can take such a run over.
IN_PROCESS_PREFIX = "profile:"
#: Error text of an in-process run failed because its process stopped heartbeating.
IN_PROCESS_LOST = (
    "in-process profile run lost: the process running ckptlab.profile stopped heartbeating "
    "(it exited or was killed); its model existed only there, so no worker can run it again"
)


def claim_next(session: Session, *, worker_id: str) -> Experiment | None:
    """Atomically move the oldest queued experiment to ``running`` for ``worker_id``.

    One ``UPDATE ... WHERE status = <queued> ... RETURNING`` statement, so two workers can
    never claim the same experiment: on SQLite the write lock serialises them; on PostgreSQL
    the inner select takes ``FOR UPDATE SKIP LOCKED``. Returns None when the queue is empty.
    """
    inner = select(Experiment.id).where(Experiment.status == Status.QUEUED).order_by(Experiment.id).limit(1)
    if is_postgresql(session):
        inner = inner.with_for_update(skip_locked=True)
    stmt = (
        update(Experiment)
        .where(Experiment.id == inner.scalar_subquery(), Experiment.status == Status.QUEUED)
        .values(
            status=Status.RUNNING,
            worker_id=worker_id,
            started_at=db_now(session),
            finished_at=None,
            attempt=Experiment.attempt + 1,
        )
        .returning(Experiment.id, Experiment.attempt)
    )
    row = session.execute(stmt).first()
    if row is None:
        session.commit()
        return None
    record_events(session, [(row[0], row[1], worker_id)], status=Status.RUNNING, reason="claimed")
    session.commit()
    return session.get(Experiment, row[0], populate_existing=True)


def finish_experiment(
    session: Session,
    *,
    experiment_id: int,
    status: Status,
    summary: RunSummary | None = None,
    error: str | None = None,
    warnings: Sequence[str] | None = None,
    snapshot_path: str | None = None,
    attempt: int | None = None,
    log: str | None = None,
    timelines: Sequence[dict[str, Any]] = (),
) -> bool:
    """Record the outcome of a running experiment; returns whether it was recorded.

    Only an experiment still ``running`` (and, when ``attempt`` is given, still in that
    attempt) is changed: a worker that lost its lease cannot overwrite a later attempt, and a
    cancelled or finished experiment keeps its outcome.

    Args:
        status: one of the finished statuses (``succeeded``, ``failed``, ``oom``,
            ``timed_out``, ``cancelled``).
        summary: the run's summary (the engine's on success; the out-of-memory or failure
            details otherwise), stored as :meth:`RunSummary.dump` (None when empty).
        error: why it did not succeed, one sentence (None on success): the API serves it to
            anyone who can read the experiment.
        warnings: warnings raised during the run, stored in ``experiments.warnings``.
        snapshot_path: path of a CUDA memory snapshot written by the run.
        attempt: the attempt being finished. Default: whichever is current.
        log: the run's log (a failure's traceback), stored in ``experiments.log`` and served
            behind the API token; None: none (an earlier attempt's is cleared).
        timelines: the run's memory timelines, stored with the outcome (and only with
            it): the columns of :class:`~ckptlab.db.models.MemoryTimeline` but the key's
            ``experiment_id`` and ``attempt`` (``step``, ``is_peak``, ``n_events``,
            ``baseline_bytes``, ``peak_bytes``, ``peak_index``, ``data``).

    Raises:
        ValueError: ``status`` is not a finished status.
    """
    if status not in FINISHED_STATUSES:
        raise ValueError(f"{status!r} is not a finished status; expected one of {', '.join(FINISHED_STATUSES)}")
    stmt = update(Experiment).where(Experiment.id == experiment_id, Experiment.status == Status.RUNNING)
    if attempt is not None:
        stmt = stmt.where(Experiment.attempt == attempt)
    values: dict[str, Any] = {
        "status": status,
        "summary": (summary.dump() or None) if summary is not None else None,
        "error": error,
        "log": log,
        "finished_at": db_now(session),
    }
    if warnings is not None:
        values["warnings"] = list(warnings)
    if snapshot_path is not None:
        values["snapshot_path"] = snapshot_path
    done = session.execute(
        stmt.values(**values).returning(Experiment.id, Experiment.attempt, Experiment.worker_id)
    ).all()
    record_events(session, [tuple(r) for r in done], status=status, reason=first_line(error))
    if done and timelines:
        key = {"experiment_id": done[0].id, "attempt": done[0].attempt}
        session.execute(delete(MemoryTimeline).filter_by(**key))
        session.execute(insert(MemoryTimeline), [{**t, **key} for t in timelines])
    session.commit()
    return bool(done)


def requeue_experiment(
    session: Session, *, experiment_id: int, attempt: int, reason: str = "its worker shut down before it finished"
) -> bool:
    """Put a running experiment back in the queue; returns whether it was requeued.

    Its ``attempt`` is kept (the next claim raises it) and the steps of this attempt stay
    stored. Used when a worker shuts down before the experiment finished. Only changes the
    experiment while it is ``running`` in ``attempt``. The event names the worker that
    held it and ``reason``.
    """
    held = session.execute(select(Experiment.worker_id).where(Experiment.id == experiment_id)).scalar()
    done = session.execute(
        update(Experiment)
        .where(Experiment.id == experiment_id, Experiment.status == Status.RUNNING, Experiment.attempt == attempt)
        .values(status=Status.QUEUED, worker_id=None, started_at=None)
    ).rowcount
    if done:
        record_events(session, [(experiment_id, attempt, held)], status=Status.QUEUED, reason=reason)
    session.commit()
    return bool(done)


class ExperimentFinishedError(Exception):
    """The experiment has already finished (its status is one of ``FINISHED_STATUSES``)."""

    def __init__(self, experiment: Experiment):
        super().__init__(f"experiment {experiment.id} has already finished ({experiment.status})")
        self.experiment = experiment


def request_cancel(session: Session, *, experiment_id: int) -> Experiment | None:
    """Cancel an experiment: a queued one at once, a running one by its worker.

    A queued experiment becomes ``cancelled`` in this call. A running one gets
    ``cancel_requested``; its worker polls the flag (every 0.25 s), kills the run and records
    ``cancelled``; a run in its caller's own process (``ckptlab run``, ``ckptlab.profile``)
    reads it every 0.5 s and stops at its next step. Asking again for a running experiment is
    harmless.

    Returns:
        The experiment as stored after the request, or None when there is no such id.

    Raises:
        ExperimentFinishedError: the experiment had already finished.
    """
    now = db_now(session)
    cancelled = session.execute(
        update(Experiment)
        .where(Experiment.id == experiment_id, Experiment.status == Status.QUEUED)
        .values(status=Status.CANCELLED, cancel_requested=True, finished_at=now, error="cancelled before it started")
        .returning(Experiment.id, Experiment.attempt, Experiment.worker_id)
    ).first()
    if cancelled is not None:
        record_events(session, [tuple(cancelled)], status=Status.CANCELLED, reason="cancelled before it started")
    flagged = None
    if cancelled is None:
        flagged = session.execute(
            update(Experiment)
            .where(Experiment.id == experiment_id, Experiment.status == Status.RUNNING)
            .values(cancel_requested=True)
            .returning(Experiment.id)
        ).first()
    session.commit()
    exp = session.get(Experiment, experiment_id, populate_existing=True)
    if exp is None:
        return None
    if cancelled is None and flagged is None:
        raise ExperimentFinishedError(exp)
    return exp


def cancel_sweep(session: Session, *, sweep_id: int) -> int | None:
    """Cancel every unfinished experiment of a sweep and mark the sweep ``cancelled``.

    Queued experiments become ``cancelled`` at once; running ones get ``cancel_requested``
    (their workers stop them within about a second, see :func:`request_cancel`).

    Returns:
        How many experiments were cancelled or flagged, or None when there is no such sweep.
    """
    sweep = session.get(Sweep, sweep_id)
    if sweep is None:
        return None
    sweep.cancelled = True
    queued = session.execute(
        update(Experiment)
        .where(Experiment.sweep_id == sweep_id, Experiment.status == Status.QUEUED)
        .values(
            status=Status.CANCELLED,
            cancel_requested=True,
            finished_at=db_now(session),
            error="cancelled before it started",
        )
        .returning(Experiment.id, Experiment.attempt, Experiment.worker_id)
    ).all()
    reason = "cancelled with its sweep before it started"
    record_events(session, [tuple(r) for r in queued], status=Status.CANCELLED, reason=reason)
    running = session.execute(
        update(Experiment)
        .where(Experiment.sweep_id == sweep_id, Experiment.status == Status.RUNNING)
        .values(cancel_requested=True)
    ).rowcount
    session.commit()
    return len(queued) + running


@dataclass(frozen=True)
class RunState:
    """What a worker re-reads about the experiment it runs (see :func:`get_run_state`)."""

    status: Status
    attempt: int
    worker_id: str | None
    cancel_requested: bool


def get_run_state(session: Session, *, experiment_id: int) -> RunState | None:
    """The status, attempt, holder and cancel flag of an experiment (a cheap poll), or None."""
    row = session.execute(
        select(Experiment.status, Experiment.attempt, Experiment.worker_id, Experiment.cancel_requested).where(
            Experiment.id == experiment_id
        )
    ).first()
    return RunState(Status(row[0]), row[1], row[2], bool(row[3])) if row else None


def register_worker(session: Session, *, worker_id: str, host: str, pid: int, devices: Sequence[str]) -> Worker:
    """Insert or refresh the ``workers`` row of a starting worker (heartbeat now)."""
    now = db_now(session)
    row = session.get(Worker, worker_id)
    if row is None:
        row = Worker(id=worker_id)
        session.add(row)
    row.host, row.pid, row.devices = host, pid, list(devices)
    row.started_at = row.heartbeat_at = now
    row.stopped_at = None
    session.commit()
    return session.get(Worker, worker_id, populate_existing=True)


def heartbeat_worker(session: Session, *, worker_id: str) -> bool:
    """Set the worker's ``heartbeat_at`` to now; returns False when it is not registered."""
    done = session.execute(
        update(Worker).where(Worker.id == worker_id).values(heartbeat_at=db_now(session), stopped_at=None)
    ).rowcount
    session.commit()
    return bool(done)


def stop_worker(session: Session, *, worker_id: str) -> None:
    """Mark a worker stopped (``stopped_at`` now): the reaper no longer waits for its lease."""
    session.execute(update(Worker).where(Worker.id == worker_id).values(stopped_at=db_now(session)))
    session.commit()


def reap_lost(session: Session, *, lease_s: float, max_attempts: int) -> int:
    """Requeue (or fail) running experiments whose worker is lost; returns how many changed.

    An experiment is lost when it is ``running``, was claimed more than ``lease_s`` ago, and
    its worker is not a registered, unstopped worker that heartbeated within ``lease_s``.
    A lost experiment with ``cancel_requested`` becomes ``cancelled``; one held by an
    in-process worker (id starting with :data:`IN_PROCESS_PREFIX`, a ``ckptlab.profile``
    run) becomes ``failed`` with error :data:`IN_PROCESS_LOST`, never queued, since no worker
    has its model; one already claimed ``max_attempts`` times becomes ``failed`` with error
    :data:`WORKER_LOST`; any other goes back to ``queued`` with its attempt kept (the next
    claim raises it, and the lost attempt's steps stay stored under their attempt number). Safe to run from every worker
    and the backend at once: on PostgreSQL the rows are locked ``FOR UPDATE SKIP LOCKED``,
    and every update re-checks that the experiment is still lost.

    Args:
        lease_s: seconds of heartbeat silence after which a worker is lost (> 0).
        max_attempts: attempts after which a lost experiment fails instead (>= 1).
    """
    now = db_now(session)
    cutoff = now - timedelta(seconds=lease_s)
    alive = select(Worker.id).where(
        Worker.id == Experiment.worker_id, Worker.stopped_at.is_(None), Worker.heartbeat_at >= cutoff
    )
    lost = and_(Experiment.status == Status.RUNNING, Experiment.started_at < cutoff, ~exists(alive))
    candidates = select(Experiment.id, Experiment.worker_id).where(lost).order_by(Experiment.id)
    if is_postgresql(session):
        candidates = candidates.with_for_update(skip_locked=True, of=Experiment)
    holders = dict(session.execute(candidates).all())
    ids = list(holders)
    if not ids:
        session.rollback()
        return 0
    chosen = update(Experiment).where(Experiment.id.in_(ids), lost)
    ret = (Experiment.id, Experiment.attempt)

    def lost_by(rows, status: Status, what: str) -> int:
        for eid, attempt in rows:
            silent = f"worker {holders.get(eid)} lost (no heartbeat for {lease_s:g} s)"
            record_events(session, [(eid, attempt, holders.get(eid))], status=status, reason=f"{silent}; {what}")
        return len(rows)

    changed = lost_by(
        session.execute(
            chosen.where(Experiment.cancel_requested.is_(True))
            .values(status=Status.CANCELLED, finished_at=now, error="cancelled; its worker was lost")
            .returning(*ret)
        ).all(),
        Status.CANCELLED,
        "cancelled, as asked",
    )
    changed += lost_by(
        session.execute(
            chosen.where(Experiment.worker_id.startswith(IN_PROCESS_PREFIX, autoescape=True))
            .values(status=Status.FAILED, finished_at=now, error=IN_PROCESS_LOST)
            .returning(*ret)
        ).all(),
        Status.FAILED,
        "failed: an in-process (ckptlab.profile) run cannot be run by another worker",
    )
    changed += lost_by(
        session.execute(
            chosen.where(Experiment.attempt >= max_attempts)
            .values(status=Status.FAILED, finished_at=now, error=WORKER_LOST)
            .returning(*ret)
        ).all(),
        Status.FAILED,
        f"failed after {max_attempts} attempts",
    )
    changed += lost_by(
        session.execute(chosen.values(status=Status.QUEUED, worker_id=None, started_at=None).returning(*ret)).all(),
        Status.QUEUED,
        "requeued",
    )
    session.commit()
    return changed
