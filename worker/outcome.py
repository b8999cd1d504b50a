"""The one outcome recorder: run a claimed attempt, stream its steps, store its outcome.

Both runners (:class:`worker.runners.InProcessRunner` for ``ckptlab run`` and the
child-process runner of the worker's slots) hand a :class:`Job` to :func:`record_run`, so
an experiment's status, summary, error and warnings are decided in one place.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from ckptlab.db.queue import finish_experiment
from ckptlab.db.retry import with_retry
from ckptlab.db.store import get_experiment
from ckptlab.domain import Status
from ckptlab.spec import ExperimentSpec
from ckptlab.summary import RunSummary
from worker.devices import engine_device
from worker.hostmem import is_out_of_memory, oom_details
from worker.writer import StepWriteError, StepWriter

__all__ = ["Job", "record_run", "error_text", "RECORD_DEADLINE_S"]

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
            :func:`worker.devices.engine_device`; None: the spec's own.
        snapshot_dir: folder for CUDA memory snapshots, or None for none.
        claimed_at: ``time.time()`` at the claim (for the claim-to-first-step latency), or
            None when there was no claim (``ckptlab run``).
        cpu_threads: torch intra-op threads for a CPU slot's child, its share of the cores
            (None: torch's default).
        spec: the spec, validated once by whoever claimed the attempt; None: read it from
            the database (``ckptlab run``) and validate it there.
        memory_limit_bytes: host memory the run may use (bytes); the child runs under a
            cap a little above it (:func:`worker.hostmem.apply_cap`). None: no cap
            (``ckptlab run``).
        allowed_model_targets: ``python`` model targets this worker may import (its
            ``allowed_model_targets`` setting); None: any (``ckptlab run``, one's own
            process). A target outside them fails the run before anything is imported.
        model: a model already built in this process (``ckptlab.profile``), trained instead
            of building ``spec.model`` (:func:`worker.engine.run_experiment`); never sent to
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
    model: Any = None


def error_text(exc: BaseException) -> str:
    """``Type: message`` and the last frames of the traceback, as stored in ``error``."""
    tb = traceback.format_exception(exc)
    return f"{type(exc).__name__}: {exc}\n\n{''.join(tb[-6:])}"


def record_run(Session: sessionmaker[Session], job: Job) -> Status:
    """Run ``job`` with batched step writes and record its outcome.

    The outcome is ``succeeded`` (the engine's summary, plus ``warnings``), the status of a
    :class:`worker.errors.RunError` (``oom`` with the details under ``summary[Status.OOM]``, or
    ``failed`` with its details under ``summary["failure"]``), ``oom`` for a failed host
    allocation the engine did not map (:func:`worker.hostmem.is_out_of_memory`), or
    ``failed`` for any other exception (the error text with the traceback; the exception is not re-raised). Every
    step is committed before the outcome; a step that cannot be written fails the run.

    Args:
        Session: session factory of the database holding the experiment.
        job: the claimed attempt.

    Returns:
        The recorded status.

    Raises:
        LookupError: no experiment with this id.
    """
    from worker.engine import run_experiment  # imports torch: only where experiments run
    from worker.errors import RunError, RunOutOfMemory

    spec_json = None
    if job.spec is None:
        with Session() as session:
            exp = get_experiment(session, experiment_id=job.experiment_id)
            if exp is None:
                raise LookupError(f"experiment {job.experiment_id} does not exist")
            spec_json = exp.spec
    first_step_at: list[float] = []
    status, summary, error, warnings, snapshot = Status.FAILED, None, None, None, None
    writer = StepWriter(Session, experiment_id=job.experiment_id, attempt=job.attempt).start()
    try:
        spec = job.spec or ExperimentSpec.model_validate(spec_json)
        allowed = job.allowed_model_targets
        in_hand = job.model is not None  # nothing is imported for a model in hand
        if not in_hand and spec.model.kind == "python" and allowed is not None and spec.model.target not in allowed:
            raise RunError(
                f"python target {spec.model.target!r} is not allowed on this worker; its operator allows "
                "exact names with CKPTLAB_ALLOWED_MODEL_TARGETS"
            )
        if spec.memory_snapshot and job.snapshot_dir:
            Path(job.snapshot_dir).mkdir(parents=True, exist_ok=True)
            snapshot = str(Path(job.snapshot_dir) / f"experiment-{job.experiment_id}-attempt-{job.attempt}.pickle")

        def on_step(rec: dict[str, Any]) -> None:
            if not first_step_at:
                first_step_at.append(time.time())
            writer.put(rec)

        device = engine_device(spec.device, job.device)
        summary = dict(run_experiment(spec, on_step=on_step, device=device, snapshot_path=snapshot, model=job.model))
        status = Status.SUCCEEDED
        warnings = list(summary.setdefault("warnings", []))
        if job.claimed_at is not None and first_step_at:
            summary["claim_to_first_step_s"] = first_step_at[0] - job.claimed_at
    except RunError as exc:  # RunOutOfMemory included: its status is oom
        status, warnings, error = Status(exc.status), exc.warnings, f"{type(exc).__name__}: {exc}"
        if exc.__cause__ is not None and not isinstance(exc, RunOutOfMemory):  # where the model failed
            error += "\n\n" + "".join(traceback.format_exception(exc.__cause__)[-6:])
        if isinstance(exc, RunOutOfMemory):
            summary = RunSummary(oom=exc.details).dump()
        elif exc.details:
            summary = RunSummary(failure=exc.details).dump()
    except Exception as exc:  # noqa: BLE001 - any failure of the run is its outcome
        status, error = Status.FAILED, error_text(exc)
        if is_out_of_memory(exc):  # outside the engine's own mapping (building the spec, a hook)
            status, summary = Status.OOM, RunSummary(oom=oom_details({"phase": "setup", "step": 0}, exc, None)).dump()
    try:
        writer.close(timeout_s=RECORD_DEADLINE_S)  # every step is committed before the outcome is
    except StepWriteError as exc:
        status, summary, error = Status.FAILED, None, f"{type(exc).__name__}: {exc}"
    if snapshot is not None and not Path(snapshot).exists():
        snapshot = None
    with_retry(
        Session,
        lambda s: finish_experiment(
            s,
            experiment_id=job.experiment_id,
            attempt=job.attempt,
            status=status,
            summary=summary,
            error=error,
            warnings=warnings,
            snapshot_path=snapshot if status == Status.SUCCEEDED else None,
        ),
        deadline_s=RECORD_DEADLINE_S,
    )
    return status
