"""Data-access functions shared by the backend, the worker and the CLI.

All take keyword-only arguments and a SQLAlchemy ``Session``; they commit when they change
state so that readers in other processes see progress at once.

The queue protocol (shared by every worker and the backend, on SQLite and PostgreSQL):

- :func:`claim_next` moves the oldest ``queued`` experiment to ``running`` and raises its
  ``attempt``; steps are stored per attempt.
- Workers :func:`register_worker` and :func:`heartbeat_worker`; :func:`reap_lost` requeues a
  running experiment whose worker fell silent for longer than the lease (or fails it with
  "worker lost" after the maximum attempts). Times come from the database's clock on
  PostgreSQL, so hosts with skewed clocks agree on who is silent.
- :func:`finish_experiment` and :func:`requeue_experiment` only touch the attempt they are
  given while it is still ``running``, so a worker that lost its lease can never overwrite
  the outcome of a later attempt.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, exists, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from ckptlab.db.models import FINISHED_STATUSES, Experiment, Step, Sweep, Worker, utcnow
from ckptlab.spec import ExperimentSpec

__all__ = [
    "create_experiment",
    "claim_next",
    "add_steps",
    "finish_experiment",
    "list_experiments",
    "get_experiment",
    "list_steps",
    "list_attempts",
    "Attempt",
    "RunState",
    "get_run_state",
    "requeue_experiment",
    "request_cancel",
    "cancel_sweep",
    "ExperimentFinishedError",
    "register_worker",
    "heartbeat_worker",
    "stop_worker",
    "reap_lost",
    "WORKER_LOST",
    "STEP_FIELDS",
]

#: Error text of an experiment failed because its worker was lost ``max_attempts`` times.
WORKER_LOST = "worker lost"

#: Numeric per-step fields a step record carries (times in ms, memory in bytes).
STEP_FIELDS = (
    "forward_ms",
    "backward_ms",
    "optimizer_ms",
    "step_ms",
    "allocated_bytes",
    "peak_allocated_bytes",
    "reserved_bytes",
)


def create_experiment(
    session: Session, *, spec: ExperimentSpec, status: str = "queued", worker_id: str | None = None
) -> Experiment:
    """Store a validated spec as a new experiment (``queued`` unless told otherwise)."""
    now = utcnow()
    exp = Experiment(
        spec=spec.model_dump(mode="json"),
        model_kind=spec.model.kind,
        strategy=spec.checkpoint.strategy,
        status=status,
        created_at=now,
        attempt=1 if status == "running" else 0,
        started_at=now if status == "running" else None,
        worker_id=worker_id,
    )
    session.add(exp)
    session.commit()
    return exp


def claim_next(session: Session, *, worker_id: str) -> Experiment | None:
    """Atomically move the oldest queued experiment to ``running`` for ``worker_id``.

    One ``UPDATE ... WHERE status = 'queued' ... RETURNING`` statement, so two workers can
    never claim the same experiment: on SQLite the write lock serialises them; on PostgreSQL
    the inner select takes ``FOR UPDATE SKIP LOCKED``. Returns None when the queue is empty.
    """
    inner = select(Experiment.id).where(Experiment.status == "queued").order_by(Experiment.id).limit(1)
    if _is_postgresql(session):
        inner = inner.with_for_update(skip_locked=True)
    stmt = (
        update(Experiment)
        .where(Experiment.id == inner.scalar_subquery(), Experiment.status == "queued")
        .values(
            status="running",
            worker_id=worker_id,
            started_at=_now(session),
            finished_at=None,
            attempt=Experiment.attempt + 1,
        )
        .returning(Experiment.id)
    )
    claimed = session.execute(stmt).scalar_one_or_none()
    session.commit()
    if claimed is None:
        return None
    return session.get(Experiment, claimed, populate_existing=True)


def _step_row(experiment_id: int, attempt: int, rec: Mapping[str, Any]) -> dict[str, Any]:
    loss = rec.get("loss")
    nonfinite = None
    if loss is not None and not math.isfinite(loss):
        nonfinite = "nan" if math.isnan(loss) else ("inf" if loss > 0 else "-inf")
        loss = None
    row = {k: rec.get(k) for k in STEP_FIELDS}
    row.update(
        experiment_id=experiment_id,
        attempt=attempt,
        step=rec["step"],
        loss=loss,
        loss_nonfinite=nonfinite,
        extra=rec.get("extra"),
    )
    return row


def add_steps(
    session: Session,
    *,
    experiment_id: int,
    attempt: int,
    records: Iterable[Mapping[str, Any]],
    skip_existing: bool = False,
) -> int:
    """Insert step records in one batch and commit; returns the number of records given.

    A non-finite ``loss`` is stored as NULL with ``loss_nonfinite`` = ``nan``/``inf``/``-inf``.

    Args:
        skip_existing: silently skip records whose (experiment, attempt, step) is already
            stored (``INSERT ... ON CONFLICT DO NOTHING``), so a batch can be retried after
            a commit whose outcome was unknown. Default False: a duplicate raises
            ``sqlalchemy.exc.IntegrityError``.
    """
    rows = [_step_row(experiment_id, attempt, r) for r in records]
    if rows:
        stmt = Step.__table__.insert()
        if skip_existing:
            dialect_insert = postgresql.insert if _is_postgresql(session) else sqlite.insert
            stmt = dialect_insert(Step.__table__).on_conflict_do_nothing(
                index_elements=["experiment_id", "attempt", "step"]
            )
        session.execute(stmt, rows)
        session.commit()
    return len(rows)


def finish_experiment(
    session: Session,
    *,
    experiment_id: int,
    status: str,
    summary: Mapping[str, Any] | None = None,
    error: str | None = None,
    warnings: Sequence[str] | None = None,
    snapshot_path: str | None = None,
    attempt: int | None = None,
) -> bool:
    """Record the outcome of a running experiment; returns whether it was recorded.

    Only an experiment still ``running`` (and, when ``attempt`` is given, still in that
    attempt) is changed: a worker that lost its lease cannot overwrite a later attempt, and a
    cancelled or finished experiment keeps its outcome.

    Args:
        status: one of the finished statuses (``succeeded``, ``failed``, ``oom``,
            ``timed_out``, ``cancelled``).
        summary: JSON-able summary (the engine's on success; ``{"oom": details}`` on oom).
        error: error text (None on success).
        warnings: warnings raised during the run, stored in ``experiments.warnings``.
        snapshot_path: path of a CUDA memory snapshot written by the run.
        attempt: the attempt being finished. Default: whichever is current.

    Raises:
        ValueError: ``status`` is not a finished status.
    """
    if status not in FINISHED_STATUSES:
        raise ValueError(f"{status!r} is not a finished status; expected one of {', '.join(FINISHED_STATUSES)}")
    stmt = update(Experiment).where(Experiment.id == experiment_id, Experiment.status == "running")
    if attempt is not None:
        stmt = stmt.where(Experiment.attempt == attempt)
    values: dict[str, Any] = {
        "status": status,
        "summary": dict(summary) if summary else None,
        "error": error,
        "finished_at": _now(session),
    }
    if warnings is not None:
        values["warnings"] = list(warnings)
    if snapshot_path is not None:
        values["snapshot_path"] = snapshot_path
    done = session.execute(stmt.values(**values)).rowcount
    session.commit()
    return bool(done)


def requeue_experiment(session: Session, *, experiment_id: int, attempt: int) -> bool:
    """Put a running experiment back in the queue; returns whether it was requeued.

    Its ``attempt`` is kept (the next claim raises it) and the steps of this attempt stay
    stored. Used when a worker shuts down before the experiment finished. Only changes the
    experiment while it is ``running`` in ``attempt``.
    """
    done = session.execute(
        update(Experiment)
        .where(Experiment.id == experiment_id, Experiment.status == "running", Experiment.attempt == attempt)
        .values(status="queued", worker_id=None, started_at=None)
    ).rowcount
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
    ``cancelled``. Asking again for a running experiment is harmless.

    Returns:
        The experiment as stored after the request, or None when there is no such id.

    Raises:
        ExperimentFinishedError: the experiment had already finished.
    """
    now = _now(session)
    cancelled = session.execute(
        update(Experiment)
        .where(Experiment.id == experiment_id, Experiment.status == "queued")
        .values(status="cancelled", cancel_requested=True, finished_at=now, error="cancelled before it started")
        .returning(Experiment.id)
    ).first()
    flagged = None
    if cancelled is None:
        flagged = session.execute(
            update(Experiment)
            .where(Experiment.id == experiment_id, Experiment.status == "running")
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
        .where(Experiment.sweep_id == sweep_id, Experiment.status == "queued")
        .values(
            status="cancelled", cancel_requested=True, finished_at=_now(session), error="cancelled before it started"
        )
    ).rowcount
    running = session.execute(
        update(Experiment)
        .where(Experiment.sweep_id == sweep_id, Experiment.status == "running")
        .values(cancel_requested=True)
    ).rowcount
    session.commit()
    return queued + running


@dataclass(frozen=True)
class RunState:
    """What a worker re-reads about the experiment it runs (see :func:`get_run_state`)."""

    status: str
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
    return RunState(row[0], row[1], row[2], bool(row[3])) if row else None


def register_worker(session: Session, *, worker_id: str, host: str, pid: int, devices: Sequence[str]) -> Worker:
    """Insert or refresh the ``workers`` row of a starting worker (heartbeat now)."""
    now = _now(session)
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
        update(Worker).where(Worker.id == worker_id).values(heartbeat_at=_now(session), stopped_at=None)
    ).rowcount
    session.commit()
    return bool(done)


def stop_worker(session: Session, *, worker_id: str) -> None:
    """Mark a worker stopped (``stopped_at`` now): the reaper no longer waits for its lease."""
    session.execute(update(Worker).where(Worker.id == worker_id).values(stopped_at=_now(session)))
    session.commit()


def reap_lost(session: Session, *, lease_s: float, max_attempts: int) -> int:
    """Requeue (or fail) running experiments whose worker is lost; returns how many changed.

    An experiment is lost when it is ``running``, was claimed more than ``lease_s`` ago, and
    its worker is not a registered, unstopped worker that heartbeated within ``lease_s``.
    A lost experiment with ``cancel_requested`` becomes ``cancelled``; one already claimed
    ``max_attempts`` times becomes ``failed`` with error :data:`WORKER_LOST`; any other goes
    back to ``queued`` with its attempt kept (the next claim raises it, and the lost
    attempt's steps stay stored under their attempt number). Safe to run from every worker
    and the backend at once: on PostgreSQL the rows are locked ``FOR UPDATE SKIP LOCKED``,
    and every update re-checks that the experiment is still lost.

    Args:
        lease_s: seconds of heartbeat silence after which a worker is lost (> 0).
        max_attempts: attempts after which a lost experiment fails instead (>= 1).
    """
    now = _now(session)
    cutoff = now - timedelta(seconds=lease_s)
    alive = select(Worker.id).where(
        Worker.id == Experiment.worker_id, Worker.stopped_at.is_(None), Worker.heartbeat_at >= cutoff
    )
    lost = and_(Experiment.status == "running", Experiment.started_at < cutoff, ~exists(alive))
    candidates = select(Experiment.id).where(lost).order_by(Experiment.id)
    if _is_postgresql(session):
        candidates = candidates.with_for_update(skip_locked=True, of=Experiment)
    ids = list(session.scalars(candidates))
    if not ids:
        session.rollback()
        return 0
    chosen = update(Experiment).where(Experiment.id.in_(ids), lost)
    changed = session.execute(
        chosen.where(Experiment.cancel_requested.is_(True)).values(
            status="cancelled", finished_at=now, error="cancelled; its worker was lost"
        )
    ).rowcount
    changed += session.execute(
        chosen.where(Experiment.attempt >= max_attempts).values(status="failed", finished_at=now, error=WORKER_LOST)
    ).rowcount
    changed += session.execute(chosen.values(status="queued", worker_id=None, started_at=None)).rowcount
    session.commit()
    return changed


def list_experiments(
    session: Session, *, status: str | None = None, offset: int = 0, limit: int = 100
) -> tuple[list[Experiment], int]:
    """Experiments, newest first, and the total count matching the filter."""
    q = select(Experiment)
    cq = select(func.count()).select_from(Experiment)
    if status:
        q = q.where(Experiment.status == status)
        cq = cq.where(Experiment.status == status)
    rows = session.scalars(q.order_by(Experiment.id.desc()).offset(offset).limit(limit)).all()
    return list(rows), session.scalar(cq) or 0


def get_experiment(session: Session, *, experiment_id: int) -> Experiment | None:
    """One experiment, or None."""
    return session.get(Experiment, experiment_id)


def list_steps(session: Session, *, experiment_id: int, attempt: int | None = None) -> list[Step]:
    """The steps of an experiment's attempt (default: its current attempt), by step.

    Steps of other attempts (those lost with their worker) are never mixed in; list them
    with ``attempt=N`` (see :func:`list_attempts`).
    """
    if attempt is None:
        attempt = session.scalar(select(Experiment.attempt).where(Experiment.id == experiment_id)) or 1
    q = select(Step).where(Step.experiment_id == experiment_id, Step.attempt == attempt).order_by(Step.step)
    return list(session.scalars(q).all())


@dataclass(frozen=True)
class Attempt:
    """One attempt of an experiment.

    Attributes:
        attempt: the attempt number (1-based; the claim that started it).
        steps: how many steps of this attempt are stored.
        lost: the attempt ended without an outcome (its worker was lost, or it was requeued
            at shutdown); its steps are kept but are not the experiment's series.
        current: it is the experiment's current attempt (``experiments.attempt``).
    """

    attempt: int
    steps: int
    lost: bool
    current: bool


def list_attempts(session: Session, *, experiment_id: int) -> list[Attempt]:
    """Every attempt of an experiment, oldest first, with its step count and whether it was lost.

    Attempts ``1 .. experiments.attempt`` are listed (also those that stored no step). Every
    attempt before the current one was lost; the current one is lost too when the
    experiment went back to the queue, or failed with :data:`WORKER_LOST`. Returns an empty
    list for an unknown id or an experiment never claimed.
    """
    exp = session.get(Experiment, experiment_id)
    if exp is None:
        return []
    counts = dict(
        session.execute(
            select(Step.attempt, func.count()).where(Step.experiment_id == experiment_id).group_by(Step.attempt)
        ).all()
    )
    last = max([exp.attempt, *counts])
    current_lost = exp.status == "queued" or (exp.status == "failed" and exp.error == WORKER_LOST)
    return [
        Attempt(
            attempt=n,
            steps=counts.get(n, 0),
            lost=n < exp.attempt or (n == exp.attempt and current_lost),
            current=n == exp.attempt,
        )
        for n in range(1, last + 1)
    ]


def _is_postgresql(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def _now(session: Session) -> datetime | ColumnElement[datetime]:
    """Now, from the database's clock on PostgreSQL (workers on many hosts compare their
    heartbeats against it), else from this process's clock (SQLite is one host's file)."""
    return func.now() if _is_postgresql(session) else utcnow()
