"""Errors an experiment run ends with, carrying what the worker must store."""

from __future__ import annotations

from typing import Any

from ckptlab.domain import Status

__all__ = ["RunError", "RunOutOfMemory", "RankLost", "RunCancelled"]


class RunError(Exception):
    """A run failed. ``status`` is the experiment status to record (:attr:`Status.FAILED`).

    Attributes:
        warnings: warnings and checkpoint errors raised before the failure.
        details: JSON-able facts about the failure (phase, step, bytes).
    """

    status = Status.FAILED

    def __init__(self, message: str, *, warnings: list[str] | None = None, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.warnings = list(warnings or [])
        self.details = dict(details or {})


class RunOutOfMemory(RunError):
    """The run ran out of device memory (real CUDA OOM, or the CPU tracker's emulated limit).

    ``details`` holds ``phase`` (forward / backward / optimizer / setup), ``step`` (1-based,
    0 during setup), ``live_bytes`` at failure and ``limit_bytes`` when a limit was set.
    """

    status = Status.OOM


class RankLost(RunError):
    """A rank of a sharded run exited on a signal without a summary (``kill -9``, the
    kernel's OOM killer): the host lost a process, the spec did not fail. The run's other
    ranks are stopped; the worker requeues the attempt like a lost worker's run while
    attempts are left (:func:`ckptlab.worker.service.outcome.record_run`) and fails it with
    this message after the last.
    """


class RunCancelled(RunError):
    """Someone asked to cancel the run (``POST /api/experiments/{id}/cancel``) and a run in
    the caller's own process (``ckptlab run``, ``ckptlab.profile``) saw it between two steps
    (:class:`ckptlab.worker.service.writer.StepWriter` with ``watch_cancel``): recorded as
    ``cancelled``. A worker's slot kills its child instead."""

    status = Status.CANCELLED
