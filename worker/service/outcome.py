"""The one outcome recorder: run a claimed attempt, stream its steps, store its outcome.

Both runners (:class:`ckptlab.worker.service.runners.InProcessRunner` for ``ckptlab run`` and the
child-process runner of the worker's slots) hand a :class:`Job` to :func:`record_run`, so
an experiment's status, summary, error and warnings are decided in one place.
"""

from __future__ import annotations

import re
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from ckptlab.analysis.timeline_rows import timeline_row  # re-exported: what finish_experiment stores
from ckptlab.db.queue import finish_experiment, requeue_experiment
from ckptlab.db.retry import with_retry
from ckptlab.db.store import get_experiment
from ckptlab.domain import Status
from ckptlab.spec.experiment import ExperimentSpec, PythonModelSpec
from ckptlab.summary import RunSummary
from ckptlab.worker.errors import RankLost, RunCancelled, RunError, RunOutOfMemory
from ckptlab.worker.measure.hostmem import is_out_of_memory, oom_details
from ckptlab.worker.service.devices import engine_device
from ckptlab.worker.service.writer import StepWriteError, StepWriter

__all__ = [
    "Job",
    "record_run",
    "timeline_row",
    "error_text",
    "log_text",
    "RECORD_DEADLINE_S",
    "ERROR_LIMIT",
    "LOG_LIMIT",
]

#: How long the last steps and the outcome are each retried against a locked or unreachable
#: database, seconds: twice the default 60 s lease, so a stall the worker's heartbeats
#: outlast never fails a run that finished. (Recording late is safe: the outcome only lands
#: on the attempt that is still running, see :func:`ckptlab.db.queue.finish_experiment`.)
RECORD_DEADLINE_S = 120.0


@dataclass(frozen=True)
class Job:
    """A claimed attempt and where to run it (what a slot hands its child).

    Attributes:
        experiment_id: the experiment, already ``running`` in ``attempt``.
        attempt: the attempt its steps are stored under.
        device: the slot's device (``cpu``, ``cuda:1``), mapped with
            :func:`ckptlab.worker.service.devices.engine_device`; None: the spec's own.
        snapshot_dir: folder for CUDA memory snapshots, or None for none.
        claimed_at: ``time.time()`` at the claim (for the claim-to-first-step latency), or
            None when there was no claim (``ckptlab run``).
        cpu_threads: torch intra-op threads for a CPU slot's child, its share of the cores
            (None: torch's default).
        spec: the spec, validated once by whoever claimed the attempt; None: read it from
            the database (``ckptlab run``) and validate it there.
        memory_limit_bytes: host memory the run may use (bytes); the child runs under a
            cap a little above it (:func:`ckptlab.worker.measure.hostmem.apply_cap`). None: no cap
            (``ckptlab run``).
        allowed_model_targets: ``python`` model targets this worker may import (its
            ``allowed_model_targets`` setting); None: any (``ckptlab run``, one's own
            process). A target outside them fails the run before anything is imported.
        max_attempts: attempts an experiment gets (the ``max_attempts`` setting): an attempt
            that lost a rank (:class:`ckptlab.worker.errors.RankLost`) before the last is
            requeued, as the reaper requeues a lost worker's. None: never requeued (``ckptlab
            run``, one's own process).
        watch_cancel: stop at the next step once the experiment's cancel flag is set
            (:class:`ckptlab.worker.errors.RunCancelled`, recorded ``cancelled``): a run in
            its caller's process, which no slot can kill (``ckptlab run``,
            ``ckptlab.profile``). Default False (a slot's child: the slot kills it).
        model: a model already built in this process (``ckptlab.profile``), trained instead
            of building ``spec.model`` (:func:`ckptlab.worker.engine.run.run_experiment`); never sent to
            a child (None there). Typed loosely: this module does not import torch.
    """

    experiment_id: int
    attempt: int
    device: str | None = None
    snapshot_dir: str | None = None
    claimed_at: float | None = None
    cpu_threads: int | None = None
    spec: ExperimentSpec | None = None
    memory_limit_bytes: int | None = None
    allowed_model_targets: tuple[str, ...] | None = None
    max_attempts: int | None = None
    watch_cancel: bool = False
    model: Any = None


#: Longest public error, characters (the whole message is in the log).
ERROR_LIMIT = 2000
#: Longest log kept, characters: a traceback's last part (its innermost frames and the error).
LOG_LIMIT = 64_000
#: A traceback frame's header, as a message may quote one.
_FRAME = re.compile(r'\s*File "[^"]*", line \d+(, in [^\s,]+)?,?')
#: An absolute file path (two parts or more; not a URL's), reduced to its last part.
_PATH = re.compile(r"(?<![\w.:/\\])(?:[A-Za-z]:)?(?:[/\\][^\s/\\'\"(),:;\[\]]+){2,}")


def error_text(exc: BaseException) -> str:
    """The public error of a run that raised ``exc``, as stored in ``error``: one line, the
    exception's type and message, with no traceback frame and no file path (a path keeps
    its last part: ``conv.py``), at most :data:`ERROR_LIMIT` characters. The traceback is
    the log's (:func:`log_text`)."""
    message = _PATH.sub(lambda m: re.split(r"[/\\]", m.group())[-1], _FRAME.sub(" ", str(exc)))
    message = " ".join(message.split())
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return text if len(text) <= ERROR_LIMIT else text[: ERROR_LIMIT - 1] + "…"


def log_text(exc: BaseException) -> str:
    """The traceback of ``exc`` with its causes, as stored in the run's log (served behind
    the API token); the last :data:`LOG_LIMIT` characters of a longer one."""
    text = "".join(traceback.format_exception(exc))
    return text if len(text) <= LOG_LIMIT else "[… cut]\n" + text[-LOG_LIMIT:]


@dataclass
class _Outcome:
    """What :func:`record_run` stores: the status, summary, error sentence, warnings and log."""

    status: Status = Status.FAILED
    summary: RunSummary | None = None
    error: str | None = None
    warnings: list[str] | None = None
    #: The host lost a process of the run (:class:`RankLost`): requeue while attempts are left.
    lost: bool = False
    #: The traceback of a run that raised (:func:`log_text`), for ``experiments.log``.
    log: str | None = None
    #: The memory timelines of a run that succeeded, as stored (:func:`timeline_row`).
    timelines: list[dict[str, Any]] = field(default_factory=list)


def record_run(Session: sessionmaker[Session], job: Job) -> Status:
    """Run ``job`` with batched step writes and record its outcome.

    An attempt that lost a rank (:class:`ckptlab.worker.errors.RankLost`) goes back to the
    queue while ``job.max_attempts`` allows another, its event naming the rank and signal.
    Otherwise the outcome is ``succeeded`` (the engine's summary, plus ``warnings``), the status of a
    :class:`ckptlab.worker.errors.RunError` (``oom`` with the details in the summary's
    ``oom``, or ``failed`` with its details in its ``failure``), ``oom`` for a failed host
    allocation the engine did not map (:func:`ckptlab.worker.measure.hostmem.is_out_of_memory`),
    or ``failed`` for any other exception (the error text with the traceback; the exception
    is not re-raised). Every step is committed before the outcome; a step that cannot be
    written fails the run.

    Args:
        Session: session factory of the database holding the experiment.
        job: the claimed attempt.

    Returns:
        The recorded status (``queued`` for a requeued attempt).

    Raises:
        LookupError: no experiment with this id.
    """
    spec_json = _stored_spec(Session, job) if job.spec is None else None
    snapshot: str | None = None
    writer = StepWriter(
        Session, experiment_id=job.experiment_id, attempt=job.attempt, watch_cancel=job.watch_cancel
    ).start()
    try:
        spec = job.spec or ExperimentSpec.model_validate(spec_json)
        _check_target_allowed(spec, job)
        snapshot = _snapshot_path(spec, job)
        outcome = _run(spec, job, writer, snapshot)
    except Exception as exc:  # noqa: BLE001 - any failure of the run is its outcome
        outcome = _failure(exc)
    try:
        writer.close(timeout_s=RECORD_DEADLINE_S)  # every step is committed before the outcome is
    except StepWriteError as exc:
        outcome = _Outcome(Status.FAILED, None, error_text(exc), outcome.warnings, log=log_text(exc))
    if snapshot is not None and not Path(snapshot).exists():
        snapshot = None
    if outcome.lost and job.max_attempts is not None and job.attempt < job.max_attempts:
        reason = outcome.error or "a rank was lost"
        with_retry(
            Session,
            lambda s: requeue_experiment(s, experiment_id=job.experiment_id, attempt=job.attempt, reason=reason),
            deadline_s=RECORD_DEADLINE_S,
        )
        return Status.QUEUED
    with_retry(
        Session,
        lambda s: finish_experiment(
            s,
            experiment_id=job.experiment_id,
            attempt=job.attempt,
            status=outcome.status,
            summary=outcome.summary,
            error=outcome.error,
            warnings=outcome.warnings,
            snapshot_path=snapshot if outcome.status == Status.SUCCEEDED else None,
            log=outcome.log,
            timelines=outcome.timelines if outcome.status == Status.SUCCEEDED else (),
        ),
        deadline_s=RECORD_DEADLINE_S,
    )
    return outcome.status


def _stored_spec(Session: sessionmaker[Session], job: Job) -> Any:
    """The experiment's stored spec (JSON), for a job that does not carry it.

    Raises:
        LookupError: no experiment with this id.
    """
    with Session() as session:
        exp = get_experiment(session, experiment_id=job.experiment_id)
        if exp is None:
            raise LookupError(f"experiment {job.experiment_id} does not exist")
        return exp.spec


def _check_target_allowed(spec: ExperimentSpec, job: Job) -> None:
    """A ``python`` target this worker does not allow fails the run before it is imported
    (a model in hand imports nothing).

    Raises:
        RunError: the target is not in ``job.allowed_model_targets``.
    """
    model, allowed = spec.model, job.allowed_model_targets
    if job.model is None and isinstance(model, PythonModelSpec) and allowed is not None and model.target not in allowed:
        raise RunError(
            f"python target {model.target!r} is not allowed on this worker; its operator allows "
            "exact names with CKPTLAB_ALLOWED_MODEL_TARGETS"
        )


def _snapshot_path(spec: ExperimentSpec, job: Job) -> str | None:
    """Where the run's CUDA memory snapshot goes (its folder created), or None for none."""
    if not (spec.memory_snapshot and job.snapshot_dir):
        return None
    Path(job.snapshot_dir).mkdir(parents=True, exist_ok=True)
    return str(Path(job.snapshot_dir) / f"experiment-{job.experiment_id}-attempt-{job.attempt}.pickle")


def _run(spec: ExperimentSpec, job: Job, writer: StepWriter, snapshot: str | None) -> _Outcome:
    """Run the engine, each step to ``writer``; the claim-to-first-step latency (s) is added
    to its summary."""
    from ckptlab.worker.engine.run import run_experiment  # imports torch: only where experiments run

    first_step_at: list[float] = []
    timelines: list[dict[str, Any]] = []

    def on_step(rec: dict[str, Any]) -> None:
        if not first_step_at:
            first_step_at.append(time.time())
        writer.put(rec)

    device = engine_device(spec.device, job.device)
    if spec.distributed.kind != "none":  # one process per rank, started from this one
        from ckptlab.worker.distributed import run_distributed

        summary = run_distributed(spec, on_step=on_step, device="cpu")
    else:
        summary = run_experiment(
            spec,
            on_step=on_step,
            device=device,
            snapshot_path=snapshot,
            model=job.model,
            on_timeline=lambda tl, is_peak: timelines.append(timeline_row(tl, is_peak)),
        )
    if job.claimed_at is not None and first_step_at:
        summary.claim_to_first_step_s = first_step_at[0] - job.claimed_at
    return _Outcome(Status.SUCCEEDED, summary, None, list(summary.warnings), timelines=timelines)


def _failure(exc: Exception) -> _Outcome:
    """The outcome of a run that raised: a :class:`RunError`'s status, warnings and details
    (out of memory, or where it failed), a host allocation that failed outside the engine's
    own mapping (``oom``), or ``failed``. The error is one sentence (:func:`error_text`); the
    traceback, with where the model failed, is the log (:func:`log_text`)."""
    if isinstance(exc, RunCancelled):  # asked for, not a failure: the words a worker's cancel records
        return _Outcome(Status.CANCELLED, None, str(exc), exc.warnings)
    error, log = error_text(exc), log_text(exc)
    if isinstance(exc, RunError):  # RunOutOfMemory included: its status is oom
        if isinstance(exc, RunOutOfMemory):
            summary = RunSummary(oom=exc.details)
        else:
            summary = RunSummary(failure=exc.details) if exc.details else None
        return _Outcome(Status(exc.status), summary, error, exc.warnings, lost=isinstance(exc, RankLost), log=log)
    if is_out_of_memory(exc):  # outside the engine's own mapping (building the spec, a hook)
        oom = RunSummary(oom=oom_details({"phase": "setup", "step": 0}, exc, None))
        return _Outcome(Status.OOM, oom, error, log=log)
    return _Outcome(Status.FAILED, None, error, log=log)
