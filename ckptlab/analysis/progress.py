"""How far a run or a sweep has got, and about how long it still needs (issue 23).

One place for the arithmetic the API (``GET /api/experiments/{id}``, a sweep's
``progress``) and ``ckptlab run``'s progress bar share. Pure: no database, no torch.

The estimates are linear extrapolations of the elapsed wall time, as a progress bar's:
``elapsed * (total - done) / done``. A run's elapsed time includes building the model and
the first (slowest) steps, and the timing pass of a paired run takes two optimizer steps
per recorded step, so the estimate is rough early on and tightens as the run goes; it is
shown as "about".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckptlab.spec.experiment import ExperimentSpec

__all__ = [
    "RunProgress",
    "SweepEta",
    "STEPS_PLANNED",
    "format_duration",
    "run_progress",
    "steps_planned",
    "sweep_eta",
]

#: The step record's ``extra`` key holding how many steps the run will record in all, as
#: known at that step (the memory pass may stop early: then the timed steps say the rest).
STEPS_PLANNED = "steps_planned"


def steps_planned(memory_steps: int, timed_steps: int) -> int:
    """Steps a run records in all: its memory pass (``spec.steps`` while it runs, the steps
    it ran once it stopped) and then its ``timed_steps``."""
    return memory_steps + timed_steps


@dataclass(frozen=True)
class RunProgress:
    """Where one run is.

    Attributes:
        queue_position: 1 for the next run a worker claims, 2 after it, ...; None unless queued.
        step: the last step recorded (1-based); None before the first.
        total_steps: the steps the run will record in all, as known at ``step``.
        elapsed_s: wall seconds since the run started (s); None unless running.
        eta_s: about how many seconds remain (s); None before the first step.
    """

    queue_position: int | None = None
    step: int | None = None
    total_steps: int | None = None
    elapsed_s: float | None = None
    eta_s: float | None = None

    def words(self) -> str:
        """``position 2 in the queue``, ``step 7 of 25, about 12 s left``, or ``starting (building the model)``."""
        if self.queue_position is not None:
            return f"position {self.queue_position} in the queue"
        if self.step is None:
            return "starting (building the model)"
        text = f"step {self.step} of {self.total_steps}" if self.total_steps else f"step {self.step}"
        if self.eta_s is not None:
            text += f", about {format_duration(self.eta_s)} left"
        return text


def format_duration(seconds: float) -> str:
    """``45 s``, ``3 min``, ``1 h 20 min`` (rounded up to the unit shown)."""
    s = max(0, int(round(seconds)))
    if s < 90:
        return f"{s} s"
    if s < 3600:
        return f"{-(-s // 60)} min"
    h, m = divmod(-(-s // 60), 60)
    return f"{h} h {m} min" if m else f"{h} h"


def run_progress(
    *,
    spec: Mapping[str, Any],
    last_step: int | None,
    last_extra: Mapping[str, Any] | None,
    elapsed_s: float | None,
    queue_position: int | None = None,
) -> RunProgress:
    """A running (or queued) run's progress from its last step record.

    Args:
        spec: the stored spec (``steps``, ``timed_steps`` are read when the step record
            predates :data:`STEPS_PLANNED`).
        last_step: the largest step number recorded in the current attempt, or None.
        last_extra: that step's ``extra`` (its :data:`STEPS_PLANNED`).
        elapsed_s: seconds since the run started, or None when it has not.
        queue_position: for a queued run, its place in the queue.

    Returns:
        The progress; ``eta_s`` is ``elapsed_s * (total - step) / step``.
    """
    if queue_position is not None:
        return RunProgress(queue_position=queue_position)
    planned = (last_extra or {}).get(STEPS_PLANNED)
    if not isinstance(planned, int):
        fields = ExperimentSpec.model_fields  # a stored spec has both; these are its defaults
        planned = steps_planned(
            int(spec.get("steps", fields["steps"].default)), int(spec.get("timed_steps", fields["timed_steps"].default))
        )
    if not last_step:
        return RunProgress(total_steps=planned, elapsed_s=elapsed_s)
    total = max(planned, last_step)
    eta = None if elapsed_s is None else max(0.0, elapsed_s * (total - last_step) / last_step)
    return RunProgress(step=last_step, total_steps=total, elapsed_s=elapsed_s, eta_s=eta)


@dataclass(frozen=True)
class SweepEta:
    """About how long a sweep still needs.

    Attributes:
        elapsed_s: wall seconds since its first run started (s).
        eta_s: about how many seconds remain (s); None before a run has finished.
    """

    elapsed_s: float | None
    eta_s: float | None


def sweep_eta(*, total: int, finished: int, elapsed_s: float | None) -> SweepEta:
    """The sweep's estimate: ``elapsed * (total - finished) / finished`` from its first run's
    start (runs in parallel slots are then counted as they ran). None until one finished.

    Args:
        total: runs in the sweep. finished: those in a finished status.
        elapsed_s: seconds since the first run started, None before any did.
    """
    if elapsed_s is None or finished <= 0:
        return SweepEta(elapsed_s, None)
    return SweepEta(elapsed_s, max(0.0, elapsed_s * (total - finished) / finished))
