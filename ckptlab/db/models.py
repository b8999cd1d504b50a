"""The database schema, defined once and imported by the backend and the worker.

Tables (after MLflow's metric storage: one row per experiment, attempt and step):

Ids are 64-bit on both databases (:data:`Id`).

- ``experiments``: the spec (JSON), lifecycle ``status`` (:class:`ckptlab.domain.Status`,
  held to its values by a CHECK constraint), timestamps
  (UTC), the worker that holds it, the summary (JSON) and the error text.
- ``experiment_events``: every status change of an experiment (after procrastinate's
  ``procrastinate_events``): when, to which status, in which attempt, on which worker, why.
- ``steps``: per-step timings in ms and memory in bytes. Non-finite losses are stored
  explicitly: ``loss`` is NULL and ``loss_nonfinite`` says ``nan``, ``inf`` or ``-inf``.
- ``step_rollups``: a multi-resolution summary of each attempt's steps (per level ``k``,
  per bucket of ``2**k`` steps, per series metric: count, min and max with their steps,
  first and last), written with the steps; see :mod:`ckptlab.db.rollups`.
- ``memory_timelines``: the memory timeline of a run's first and peak steps (issue 34;
  :mod:`ckptlab.analysis.timeline`): one compressed blob per attempt and step, with the
  figures a listing reads without opening it (events, bytes at the start and at the peak).
- ``prediction_timelines``: the same for a prediction's memory pass on fake tensors, one row
  per prediction and step.
- ``predictions``: one "will it fit?" prediction of a spec for a target device
  (:mod:`ckptlab.prediction.targets`): the spec, the target, its outcome
  (:data:`PREDICTION_STATUSES`), the predicted summary and the error text.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

from ckptlab.db.corrupt import (
    TolerantJSON,
    TolerantRead,
    Watched,
    objects_problem,
    spec_problem,
    strings_problem,
    summary_problem,
    watch,
)
from ckptlab.domain import SERIES_METRICS, Status
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.summary import RunSummary

__all__ = [
    "Base",
    "Experiment",
    "ExperimentEvent",
    "MemoryTimeline",
    "Prediction",
    "PredictionTimeline",
    "PREDICTION_STATUSES",
    "TimelineColumns",
    "Step",
    "StepRollup",
    "Sweep",
    "Worker",
    "ROLLUP_STATS",
    "ROLLUP_STEP_STATS",
    "ROLLUP_VALUE_COLUMNS",
    "utcnow",
]


#: Primary and foreign keys: 64-bit (``BIGINT``) on PostgreSQL, as the API promises
#: (``ckptlab.backend.deps.MAX_ID``); ``INTEGER`` on SQLite, whose ``INTEGER PRIMARY KEY`` is the
#: 64-bit rowid already (and autoincrements only under that exact type name).
Id = BigInteger().with_variant(Integer, "sqlite")


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


class UTCDateTime(TolerantRead, TypeDecorator):
    """Timezone-aware UTC datetimes on every dialect (SQLite drops the offset: put it back).
    Text SQLite cannot parse as one reads as :class:`~ckptlab.db.corrupt.Unreadable`."""

    impl = DateTime(timezone=True)
    cache_ok = True
    what = "a date and time"

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        if value is not None and value.tzinfo is not None:
            value = value.astimezone(UTC)
        return value

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value


class Base(DeclarativeBase):
    """Declarative base of the ckptlab schema."""


class Experiment(Watched, Base):
    """One submitted experiment and its outcome. A row that does not read back whole is
    loaded with stand-ins and says what failed in ``corrupt`` (:mod:`ckptlab.db.corrupt`)."""

    __tablename__ = "experiments"
    __table_args__ = (
        CheckConstraint("status IN (" + ", ".join(f"'{s.value}'" for s in Status) + ")", name="ck_experiments_status"),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    status: Mapped[str] = mapped_column(String(16), default=Status.QUEUED, index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(TolerantJSON())
    model_kind: Mapped[str] = mapped_column(String(32))
    strategy: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    worker_id: Mapped[str | None] = mapped_column(String(128))
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    summary: Mapped[dict[str, Any] | None] = mapped_column(TolerantJSON())
    #: Why it did not succeed, in one sentence (no traceback: that is ``log``'s).
    error: Mapped[str | None] = mapped_column(Text)
    #: The traceback of a failed run (the worker's record of it), served behind the API
    #: token (``GET /api/experiments/{id}/log``); None when none was recorded.
    log: Mapped[str | None] = mapped_column(Text, deferred=True)
    #: Warnings and checkpoint errors raised during the run, in order, deduplicated.
    warnings: Mapped[list[str] | None] = mapped_column(TolerantJSON(list))
    sweep_id: Mapped[int | None] = mapped_column(Id, ForeignKey("sweeps.id", ondelete="CASCADE"), index=True)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    #: Path of a CUDA memory snapshot (pickle for pytorch.org/memory_viz), when recorded.
    snapshot_path: Mapped[str | None] = mapped_column(String(1024))

    sweep: Mapped[Sweep | None] = relationship(back_populates="experiments")
    steps: Mapped[list[Step]] = relationship(
        back_populates="experiment", cascade="all, delete-orphan", order_by="Step.step"
    )

    # The store's edge: the JSON columns are parsed here, once per read, and every reader
    # reads the typed records (after mlflow's ``to_mlflow_entity``).

    @property
    def run_summary(self) -> RunSummary:
        """The ``summary`` column as a :class:`~ckptlab.summary.RunSummary`; never raises (a
        missing or corrupt column reads as an empty summary, a corrupt key as its default:
        :meth:`RunSummary.load`)."""
        return RunSummary.load(self.summary)

    @property
    def experiment_spec(self) -> ExperimentSpec | None:
        """The ``spec`` column as an :class:`~ckptlab.spec.experiment.ExperimentSpec`, or None
        when it no longer validates (a row written by another version, or edited by hand);
        never raises."""
        try:
            return ExperimentSpec.model_validate(self.spec)
        except ValueError:  # pydantic.ValidationError is a ValueError
            return None


#: The statuses a prediction is stored with: it is stored once finished, never queued.
PREDICTION_STATUSES: tuple[Status, ...] = (Status.SUCCEEDED, Status.FAILED, Status.TIMED_OUT)


class Prediction(Base):
    """One "will it fit?" prediction: a spec's training step predicted for a target device
    (``POST /api/predictions``, ``ckptlab predict``, ``ckptlab.predict``), stored once it has
    an outcome. Bytes in the summary, seconds in ``elapsed_s``, timestamps UTC."""

    __tablename__ = "predictions"
    __table_args__ = (
        CheckConstraint(
            "status IN (" + ", ".join(f"'{s.value}'" for s in PREDICTION_STATUSES) + ")",
            name="ck_predictions_status",
        ),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    #: A name of the targets table (:func:`ckptlab.prediction.targets.target_names`).
    target: Mapped[str] = mapped_column(String(64), index=True)
    #: The capacity the verdict was taken against when given (bytes); None: the target's.
    capacity_bytes: Mapped[int | None] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16), index=True)
    #: The predicted :class:`~ckptlab.summary.RunSummary` (its ``dump()``), when it succeeded.
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    #: Seconds the prediction took (for a batch: this target's share of its process).
    elapsed_s: Mapped[float | None] = mapped_column(Float)
    model_kind: Mapped[str] = mapped_column(String(32))
    strategy: Mapped[str] = mapped_column(String(32))

    # The store's edge, as Experiment's: the JSON columns parsed once per read.

    @property
    def run_summary(self) -> RunSummary:
        """The ``summary`` column as a :class:`~ckptlab.summary.RunSummary`; never raises (a
        missing or corrupt column reads as an empty summary, a corrupt key as its default)."""
        return RunSummary.load(self.summary)

    @property
    def experiment_spec(self) -> ExperimentSpec | None:
        """The ``spec`` column as an :class:`~ckptlab.spec.experiment.ExperimentSpec`, or None
        when it no longer validates; never raises."""
        try:
            return ExperimentSpec.model_validate(self.spec)
        except ValueError:  # pydantic.ValidationError is a ValueError
            return None


class ExperimentEvent(Base):
    """One status change of an experiment, written by :mod:`ckptlab.db.queue` in the same
    transaction as the change (after procrastinate's ``procrastinate_events``), so that what
    happened to a run is recorded, not inferred: which worker lost attempt 1, when, and why.
    """

    __tablename__ = "experiment_events"
    __table_args__ = (
        CheckConstraint(
            "status IN (" + ", ".join(f"'{s.value}'" for s in Status) + ")", name="ck_experiment_events_status"
        ),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(Id, ForeignKey("experiments.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    #: The status the experiment moved to.
    status: Mapped[str] = mapped_column(String(16))
    #: The attempt the change belongs to (0 before the first claim).
    attempt: Mapped[int] = mapped_column(Integer)
    #: The worker that claimed, finished or lost the attempt (None when none did).
    worker_id: Mapped[str | None] = mapped_column(String(128))
    #: Why, in words (the error's first line, "worker lost: no heartbeat for 60 s", ...).
    reason: Mapped[str | None] = mapped_column(Text)


class Sweep(Watched, Base):
    """A named set of experiments expanded from a base spec and axes (dotted spec paths). A
    row that does not read back whole says what failed in ``corrupt``, as an experiment."""

    __tablename__ = "sweeps"

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    base: Mapped[dict[str, Any]] = mapped_column(TolerantJSON())
    axes: Mapped[dict[str, Any]] = mapped_column(TolerantJSON())
    #: Combinations that failed validation: ``[{"values": {...}, "errors": [...]}]``.
    invalid: Mapped[list[dict[str, Any]] | None] = mapped_column(TolerantJSON(list))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    cancelled: Mapped[bool] = mapped_column(Boolean, default=False)

    experiments: Mapped[list[Experiment]] = relationship(back_populates="sweep", order_by="Experiment.id")


# Rows that do not read back whole are loaded with stand-ins and say so (ckptlab.db.corrupt):
# a spec or summary that does not validate is served as stored, warnings that are not
# strings and invalid combinations that are not objects are not served.
watch(
    Experiment,
    content={"spec": (spec_problem, False), "summary": (summary_problem, False), "warnings": (strings_problem, True)},
)
watch(Sweep, content={"invalid": (objects_problem, True)})


class Worker(Base):
    """A registered worker process and its heartbeat (UTC)."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    devices: Mapped[list[str]] = mapped_column(JSON)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)
    stopped_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class Step(Base):
    """One training step of one attempt: timings (ms) and memory (bytes)."""

    __tablename__ = "steps"
    __table_args__ = (
        UniqueConstraint("experiment_id", "attempt", "step", name="uq_steps_experiment_attempt_step"),
        Index("ix_steps_experiment_attempt", "experiment_id", "attempt"),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(Id, ForeignKey("experiments.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    step: Mapped[int] = mapped_column(Integer)
    forward_ms: Mapped[float] = mapped_column(Float)
    backward_ms: Mapped[float] = mapped_column(Float)
    optimizer_ms: Mapped[float] = mapped_column(Float)
    step_ms: Mapped[float] = mapped_column(Float)
    #: None on the steps of the CPU timing pass (``extra["pass"] == "timed"``): not measured.
    allocated_bytes: Mapped[int | None] = mapped_column(BigInteger)
    peak_allocated_bytes: Mapped[int | None] = mapped_column(BigInteger)
    reserved_bytes: Mapped[int | None] = mapped_column(BigInteger)
    loss: Mapped[float | None] = mapped_column(Float)
    loss_nonfinite: Mapped[str | None] = mapped_column(String(8))
    extra: Mapped[dict[str, Any] | None] = mapped_column(JSON)

    experiment: Mapped[Experiment] = relationship(back_populates="steps")


class TimelineColumns:
    """The columns of a stored memory timeline but its key (issue 34;
    :func:`ckptlab.analysis.timeline_rows.timeline_row` makes them): bytes, event indices."""

    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    #: Whether this is the step whose peak is the run's (the summary's ``peak_allocated_bytes``).
    is_peak: Mapped[bool] = mapped_column(Boolean)
    n_events: Mapped[int] = mapped_column(Integer)
    #: Live bytes as the step began, and at its highest (the peak's first event: ``peak_index``).
    baseline_bytes: Mapped[int] = mapped_column(BigInteger)
    peak_bytes: Mapped[int] = mapped_column(BigInteger)
    peak_index: Mapped[int] = mapped_column(Integer)
    #: The blob (:func:`ckptlab.analysis.timeline.encode`); loaded only when asked for.
    data: Mapped[bytes] = mapped_column(LargeBinary, deferred=True)


class MemoryTimeline(TimelineColumns, Base):
    """The memory timeline of one step of one attempt (issue 34): every allocation and free
    the live-tensor tracker counted, as :func:`ckptlab.analysis.timeline.encode` stores it.
    Written by the worker with the run's outcome (:func:`ckptlab.db.queue.finish_experiment`),
    for the first step and the step that reached the run's peak; bytes, event indices."""

    __tablename__ = "memory_timelines"

    experiment_id: Mapped[int] = mapped_column(Id, ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)


class PredictionTimeline(TimelineColumns, Base):
    """The memory timeline of one step of a prediction's memory pass on fake tensors
    (issue 34), as :class:`MemoryTimeline` stores a run's: the fake tensors' bytes as the
    live-tensor tracker counted them (on target ``cpu`` the predicted peak to the byte; on a
    CUDA target without the modelled terms, such as the cuBLAS workspaces). Stored with the
    prediction (:func:`ckptlab.db.store.create_prediction`) for its first and peak steps."""

    __tablename__ = "prediction_timelines"

    prediction_id: Mapped[int] = mapped_column(Id, ForeignKey("predictions.id", ondelete="CASCADE"), primary_key=True)


#: What a rollup bucket keeps of each metric, in column order: how many of its steps have a
#: finite value, the smallest and largest value with their steps (the earliest on a tie),
#: and the value at the bucket's first and last step (``first_step``, ``last_step``; NULL
#: when that step has none). Values in the metric's unit: ms, bytes, or unitless loss.
ROLLUP_STATS: tuple[str, ...] = ("count", "min", "min_step", "max", "max_step", "first", "last")
#: The stats that are counts or step numbers (integer columns); the others are values.
ROLLUP_STEP_STATS = frozenset({"count", "min_step", "max_step"})
#: The columns after the key, in order: the bucket's step rows (``n_steps``, its first and
#: last step), then ``<metric>_<stat>`` for every series metric and stat.
ROLLUP_VALUE_COLUMNS: tuple[str, ...] = (
    "n_steps",
    "first_step",
    "last_step",
    *(f"{metric}_{stat}" for metric in SERIES_METRICS for stat in ROLLUP_STATS),
)


def _rollup_column(name: str) -> Column:
    if name in ("n_steps", "first_step", "last_step"):
        return Column(name, Integer, nullable=False)
    if name.endswith("_count"):
        return Column(name, Integer, nullable=False)
    integer = any(name.endswith(f"_{stat}") for stat in ROLLUP_STEP_STATS)
    return Column(name, Integer if integer else Float)


class StepRollup(Base):
    """One bucket of an attempt's rollup: steps ``bucket * 2**level`` to
    ``(bucket + 1) * 2**level - 1``, summarised per series metric
    (:data:`ROLLUP_VALUE_COLUMNS`). A metric without a finite value in the bucket has count
    0 and NULL stats; its first or last is NULL when the bucket's first or last step has
    no value. Written in the same transaction as the steps it summarises
    (:func:`ckptlab.db.store.add_steps`); ``ckptlab db rebuild-rollups`` recomputes it."""

    __table__ = Table(
        "step_rollups",
        Base.metadata,
        Column("experiment_id", Id, ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True),
        Column("attempt", Integer, primary_key=True),
        Column("level", Integer, primary_key=True),
        Column("bucket", Integer, primary_key=True),
        *(_rollup_column(name) for name in ROLLUP_VALUE_COLUMNS),
    )
