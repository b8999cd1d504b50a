"""Predictions from request to stored rows: the server's cap on concurrent prediction
processes, one prediction process for a request's targets, the rows it leaves, and their
export records."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from ckptlab.backend.services.exports import flatten
from ckptlab.backend.services.predictions.child import Outcome, outcomes, run_child
from ckptlab.db import store
from ckptlab.db.models import Prediction, utcnow
from ckptlab.settings import Settings
from ckptlab.spec.experiment import ExperimentSpec

__all__ = [
    "PREDICTION_COLUMNS",
    "RETRY_AFTER_S",
    "PredictionSlots",
    "SlotsBusy",
    "predict",
    "store_outcomes",
    "prediction_record",
]

#: Leading columns of a prediction export; flattened ``spec.*`` and ``summary.*`` follow.
PREDICTION_COLUMNS = (
    "id",
    "status",
    "target",
    "capacity_bytes",
    "model_kind",
    "strategy",
    "created_at",
    "finished_at",
    "elapsed_s",
    "error",
)
#: Seconds a request refused for the cap is told to wait (``Retry-After``).
RETRY_AFTER_S = 5


class SlotsBusy(Exception):
    """Every prediction slot of this server is taken."""


class PredictionSlots:
    """A server's cap on concurrent prediction processes (``prediction_slots``): each
    imports torch (seconds of CPU) and may use up to ``prediction_memory_bytes``."""

    def __init__(self, limit: int):
        self.limit = limit
        self.busy = 0
        self._lock = threading.Lock()

    @contextmanager
    def claim(self) -> Iterator[None]:
        """Hold a slot for the block.

        Raises:
            SlotsBusy: all ``limit`` slots are taken (nothing waits for one).
        """
        with self._lock:
            if self.busy >= self.limit:
                raise SlotsBusy(
                    f"{self.limit} predictions are running on this server (CKPTLAB_PREDICTION_SLOTS); "
                    f"retry in {RETRY_AFTER_S} s"
                )
            self.busy += 1
        try:
            yield
        finally:
            with self._lock:
                self.busy -= 1


def store_outcomes(
    session: Session,
    *,
    spec: ExperimentSpec,
    capacity_bytes: int | None,
    found: Sequence[Outcome],
    started: datetime,
    budget_per_target: bool = False,
) -> list[Prediction]:
    """Store one prediction per outcome in one transaction; returns them in order.

    Args:
        spec: the spec predicted.
        budget_per_target: the spec's planned strategy gave no budget: each row's spec gets
            the budget its target planned for (its summary's ``budget_bytes``; None for a
            target that had none).
        capacity_bytes: the capacity the request gave (bytes), or None.
        found: the outcomes, one per target (with a succeeded one's memory timelines).
        started: when the request arrived (UTC datetime): every row's ``created_at``.
    """
    finished = utcnow()
    rows = [
        store.create_prediction(
            session,
            spec=_with_budget(spec, o.summary.budget_bytes if o.summary else None) if budget_per_target else spec,
            target=o.target,
            capacity_bytes=capacity_bytes,
            status=o.status,
            summary=o.summary,
            error=o.error,
            created_at=started,
            finished_at=finished,
            elapsed_s=o.elapsed_s,
            commit=False,
            timelines=o.timelines,
        )
        for o in found
    ]
    session.commit()
    return rows


def _with_budget(spec: ExperimentSpec, budget_bytes: int | None) -> ExperimentSpec:
    """``spec`` with ``checkpoint.budget_bytes`` set (not revalidated: None is stored as null)."""
    return spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(update={"budget_bytes": budget_bytes})})


async def predict(
    session: Session,
    settings: Settings,
    slots: PredictionSlots,
    *,
    spec: ExperimentSpec,
    targets: Sequence[str],
    capacity_bytes: int | None = None,
    module: str | None = None,
    budget_per_target: bool = False,
) -> list[Prediction]:
    """Predict ``spec`` for ``targets`` in one prediction process and store the outcomes.

    The process runs under ``settings.prediction_timeout_s`` (for all its targets) and
    ``settings.prediction_memory_bytes`` (:func:`ckptlab.backend.services.predictions.child.run_child`);
    whatever it does, each target is stored ``succeeded``, ``failed`` or ``timed_out``. The
    database is written from a worker thread, so the event loop never waits on it.

    Args:
        session: the request's session.
        settings: the server's settings.
        slots: the server's :class:`PredictionSlots`.
        spec: a validated spec, within the server's limits.
        targets: names of the targets table (validated).
        capacity_bytes: the device's memory instead of the target's, bytes.
        module: the predictor's module (default ``ckptlab.worker.predict``).
        budget_per_target: ``spec``'s planned strategy gave no budget (its ``budget_bytes``
            is a stand-in): the process plans each target for its default budget.

    Returns:
        The stored predictions, in ``targets``' order.

    Raises:
        SlotsBusy: every slot is taken; nothing was run or stored.
    """
    started = utcnow()
    timeout_s = settings.prediction_timeout_s
    memory = settings.prediction_memory_bytes
    sent = _with_budget(spec, None) if budget_per_target else spec
    request: dict[str, Any] = {"spec": sent.model_dump(mode="json"), "capacity_bytes": capacity_bytes}
    request.update({"target": targets[0]} if len(targets) == 1 else {"targets": list(targets)})
    with slots.claim():
        run = await run_child(request, timeout_s=timeout_s, memory_bytes=memory, module=module)
    found = outcomes(run, targets, timeout_s=timeout_s, memory_bytes=memory)
    return await run_in_threadpool(
        store_outcomes,
        session,
        spec=spec,
        capacity_bytes=capacity_bytes,
        found=found,
        started=started,
        budget_per_target=budget_per_target,
    )


def prediction_record(row: Prediction) -> dict[str, Any]:
    """One prediction as a flat record: :data:`PREDICTION_COLUMNS`, then ``spec.*`` and
    ``summary.*`` (``summary.prediction.fits`` and so on) with dotted names."""
    rec = {c: getattr(row, c) for c in PREDICTION_COLUMNS}
    rec.update(flatten(row.spec or {}, "spec"))
    rec.update(flatten(row.run_summary.dump(), "summary"))
    return rec
