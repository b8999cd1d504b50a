"""How far a run or a sweep has got, and about how long it still needs (issues 23, 32).

One place for the arithmetic the API (``GET /api/experiments/{id}``, a sweep's
``progress``), ``ckptlab run``'s progress bar and the worker's step records share. Pure: no
database, no torch.

A run's estimate is the steps left times its measured step time, pass by pass: the worker
writes on each step record the median time of the pass's recent steps
(:data:`PASS_STEP_MS`, from :class:`StepTimes`: a paired timed step counts its round, this
run's step and its un-checkpointed copy's; the warm-up's slower steps are left out). The
memory pass's steps run under the memory tracker, several times slower than the timed
steps on CPU (the README's example: 2.8 s against 0.55 s), so its step time says nothing
about the timing pass: while the memory pass runs and timed steps follow, the estimate
covers the memory pass only (``memory_left_s``) and the whole is "estimating…" until the
first timed step. Model building, the gradient check (run before the first step) and the
paired copy's set-up are not counted.

``total_steps`` is fixed from the start: ``steps + timed_steps``. A memory pass that stops
early (``memory_early_stop``) leaves fewer steps to run, not a smaller total: its skipped
steps count as done (``done_steps``) once the timing pass starts, and the words say
"memory step 2 of ≤5, then 20 timed steps".
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckptlab.spec.experiment import ExperimentSpec

__all__ = [
    "PASS_STEP_MS",
    "RunProgress",
    "StepTimes",
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
#: The step record's ``extra`` key holding the median time (ms) of one of its pass's recent
#: steps (:class:`StepTimes`); absent while the pass has only warm-up steps.
PASS_STEP_MS = "pass_step_ms"
#: The step record's ``extra`` key naming its pass, ``memory`` or ``timed``.
PASS = "pass"
#: How many of a pass's latest steps the step time is the median of.
WINDOW = 15


def steps_planned(memory_steps: int, timed_steps: int) -> int:
    """Steps a run records in all: its memory pass (``spec.steps`` while it runs, the steps
    it ran once it stopped) and then its ``timed_steps``."""
    return memory_steps + timed_steps


class StepTimes:
    """One pass's recent step times (ms) and their median: what the estimate multiplies the
    steps left by. The first ``skip`` steps (the memory pass's warm-up: the first steps build
    optimizer state and caches, and take several times as long) are left out; of the rest,
    the latest :data:`WINDOW`, so the median follows a run that speeds up or slows down."""

    def __init__(self, skip: int = 0, window: int = WINDOW):
        self._skip = skip
        self._recent: deque[float] = deque(maxlen=window)

    def add(self, ms: float) -> float | None:
        """Count one step of ``ms`` milliseconds (a paired round: both steps' sum); returns
        the median of the recent ones, None while the steps are still the skipped ones."""
        if self._skip > 0:
            self._skip -= 1
            return None
        self._recent.append(ms)
        return statistics.median(self._recent)


@dataclass(frozen=True)
class RunProgress:
    """Where one run is.

    Attributes:
        queue_position: 1 for the next run a worker claims, 2 after it, ...; None unless queued.
        step: the last step recorded (1-based); None before the first.
        total_steps: the steps the run may record in all, ``steps + timed_steps``, fixed
            from the start (a memory pass that stops early records fewer).
        done_steps: how far along ``total_steps`` the run is (a progress bar's value): the
            memory steps recorded, then ``steps`` plus the timed steps recorded (memory steps
            an early stop skipped count as done); None before the first step.
        run_pass: the pass of the last step, ``memory`` or ``timed``; None before the first.
        pass_step: the steps of that pass recorded so far.
        pass_steps: the steps that pass has in all (the memory pass's ``steps``, at most
            that many when ``memory_early_stop`` is on: ``pass_steps_at_most``).
        pass_steps_at_most: the memory pass may stop before ``pass_steps``.
        timed_steps: the timing pass's steps (after the memory pass).
        elapsed_s: wall seconds since the run started (s); None unless running.
        eta_s: about how many seconds remain (s): the steps left times the measured step
            time of their pass; None while that is not known yet ("estimating…").
        memory_left_s: during the memory pass, about how many seconds of it remain (s);
            None outside it or during its warm-up.
    """

    queue_position: int | None = None
    step: int | None = None
    total_steps: int | None = None
    done_steps: int | None = None
    run_pass: str | None = None
    pass_step: int | None = None
    pass_steps: int | None = None
    pass_steps_at_most: bool = False
    timed_steps: int | None = None
    elapsed_s: float | None = None
    eta_s: float | None = None
    memory_left_s: float | None = None

    def words(self) -> str:
        """``position 2 in the queue``, ``starting (building the model)``, ``timed step 7 of
        20, about 12 s left``, or while the memory pass runs ``memory step 2 of ≤5 (about
        6 s left in it), then 20 timed steps: time left estimated once they start``."""
        if self.queue_position is not None:
            return f"position {self.queue_position} in the queue"
        if self.step is None:
            return "starting (building the model)"
        bound = "≤" if self.pass_steps_at_most else ""
        text = f"{self.run_pass} step {self.pass_step} of {bound}{self.pass_steps}"
        if self.run_pass == "memory" and self.timed_steps:
            left = (
                f" (about {format_duration(self.memory_left_s)} left in it)" if self.memory_left_s is not None else ""
            )
            return f"{text}{left}, then {self.timed_steps} timed steps: time left estimated once they start"
        if self.eta_s is None:
            return f"{text}, time left: estimating…"
        return f"{text}, about {format_duration(self.eta_s)} left"


def format_duration(seconds: float) -> str:
    """``45 s``, ``3 min``, ``1 h 20 min`` (rounded up to the unit shown)."""
    s = max(0, int(round(seconds)))
    if s < 90:
        return f"{s} s"
    if s < 3600:
        return f"{-(-s // 60)} min"
    h, m = divmod(-(-s // 60), 60)
    return f"{h} h {m} min" if m else f"{h} h"


def _spec_int(spec: Mapping[str, Any], name: str) -> Any:
    """A stored spec's field, or its default (a stored spec has them all; an old one may not)."""
    return spec.get(name, ExperimentSpec.model_fields[name].default)


def _seconds(steps_left: int, step_ms: Any) -> float | None:
    """``steps_left`` steps of ``step_ms`` ms each, in seconds; None without a step time."""
    return steps_left * step_ms / 1e3 if isinstance(step_ms, int | float) else None


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
        spec: the stored spec (``steps``, ``timed_steps``, ``memory_early_stop``; their
            defaults where absent).
        last_step: the largest step number recorded in the current attempt, or None.
        last_extra: that step's ``extra``: its :data:`PASS` (a record without one reads as
            a memory step), :data:`PASS_STEP_MS` and, on a timed step,
            :data:`STEPS_PLANNED` (where the memory pass ended).
        elapsed_s: seconds since the run started, or None when it has not.
        queue_position: for a queued run, its place in the queue.

    Returns:
        The progress (see :class:`RunProgress`; ``eta_s`` in seconds).
    """
    if queue_position is not None:
        return RunProgress(queue_position=queue_position)
    steps, timed = int(_spec_int(spec, "steps")), int(_spec_int(spec, "timed_steps"))
    at_most = bool(_spec_int(spec, "memory_early_stop"))
    total = steps + timed
    if not last_step:
        return RunProgress(total_steps=total, timed_steps=timed, elapsed_s=elapsed_s)
    extra = last_extra or {}
    ms = extra.get(PASS_STEP_MS)
    common = {"step": last_step, "total_steps": total, "timed_steps": timed, "elapsed_s": elapsed_s}
    if extra.get(PASS) == "timed":
        planned = extra.get(STEPS_PLANNED)
        memory_run = planned - timed if isinstance(planned, int) else steps
        done = min(timed, max(0, last_step - memory_run))
        return RunProgress(
            **common,
            done_steps=steps + done,
            run_pass="timed",
            pass_step=done,
            pass_steps=timed,
            eta_s=_seconds(timed - done, ms),
        )
    done = min(last_step, steps)
    memory_left = _seconds(steps - done, ms)
    return RunProgress(
        **common,
        done_steps=done,
        run_pass="memory",
        pass_step=done,
        pass_steps=steps,
        pass_steps_at_most=at_most,
        eta_s=memory_left if not timed else None,
        memory_left_s=memory_left,
    )


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
