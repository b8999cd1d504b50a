"""A run's (or a prediction's) memory timeline as the API serves it: which steps have one,
one step read back (:func:`load_timeline`, :func:`load_prediction_timeline`), downsampled
for a chart (:func:`timeline_view`: MinMaxLTTB over the live bytes with the exact peak kept,
as :func:`ckptlab.backend.services.series.downsample_indices`) and who holds its peak
(:func:`peak_holders_view`). What cannot be served says why: :class:`NoTimeline` (404) and
:class:`StepBeyondRun` (422)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session
from tsdownsample import MinMaxLTTBDownsampler

from ckptlab.analysis.timeline import SAVED, StepTimeline, TimelineFormatError, decode, peak_holders
from ckptlab.backend.schemas.timelines import HolderPublic, PeakHoldersPublic, SpanPublic, TimelinePublic
from ckptlab.db.models import Experiment, MemoryTimeline, Prediction, PredictionTimeline
from ckptlab.domain import Status

__all__ = [
    "DEFAULT_TIMELINE_POINTS",
    "DEFAULT_HOLDERS",
    "NoTimeline",
    "StepBeyondRun",
    "LoadedTimeline",
    "load_timeline",
    "load_prediction_timeline",
    "timeline_view",
    "peak_holders_view",
]

#: Points a timeline request returns unless it asks for another number.
DEFAULT_TIMELINE_POINTS = 2000
#: Peak holders named unless a request asks for another number.
DEFAULT_HOLDERS = 20


class NoTimeline(LookupError):
    """The run, or the step asked for, has no memory timeline to serve; the message says why
    (a 404)."""


class StepBeyondRun(ValueError):
    """The step asked for is beyond the run's memory pass (a 422 at ``step``)."""


@dataclass(frozen=True)
class LoadedTimeline:
    """One step's timeline read back, with its run's (or prediction's) other recorded steps.

    Attributes:
        experiment_id: the experiment (None for a prediction's).
        attempt: its current attempt, the one read (None for a prediction's).
        steps: the steps with a timeline, ascending.
        peak_step: the step that reached the peak (None when none is marked).
        timeline: the step's timeline.
        prediction_id: the prediction (None for a run's).
        target: the prediction's target (None for a run's).
    """

    experiment_id: int | None
    attempt: int | None
    steps: list[int]
    peak_step: int | None
    timeline: StepTimeline
    prediction_id: int | None = None
    target: str | None = None


@dataclass(frozen=True)
class _Stored:
    """Where one owner's timelines are: its table, the key's conditions, what to call it in
    a sentence (``experiment 3``) and what it is (``run``, ``prediction``), the steps its
    memory pass ran (None: unknown) and why it has none."""

    table: type[MemoryTimeline] | type[PredictionTimeline]
    key: tuple[Any, ...]
    name: str
    kind: str
    ran: int | None
    why_none: str


def _why_none(exp: Experiment) -> str:
    """Why a run that succeeded has no timeline stored, in words."""
    source = exp.run_summary.memory_source
    read = f" (this run's memory was read from: {source})" if source else ""
    return (
        f"experiment {exp.id} has no memory timeline: runs the live-tensor tracker can follow record one (CPU and "
        f"CUDA runs, not compiled ones, not the ranks of a sharded run){read}; runs stored before timelines were "
        "recorded, or run with CKPTLAB_RECORD_TIMELINE off, have none"
    )


def _read(session: Session, stored: _Stored, step: int | None) -> tuple[list[int], int | None, StepTimeline]:
    """The recorded steps, the peak step and the timeline of ``step`` (None: the peak step's)
    of ``stored``.

    Raises:
        NoTimeline: none recorded, ``step`` has none, or the blob does not read back.
        StepBeyondRun: ``step`` is past the memory pass.
    """
    table = stored.table
    rows = session.execute(select(table.step, table.is_peak).where(*stored.key)).all()
    if not rows:
        raise NoTimeline(stored.why_none)
    steps = sorted(r.step for r in rows)
    peak_step = next((r.step for r in rows if r.is_peak), None)
    listed = ", ".join(map(str, steps))
    ran = stored.ran or steps[-1]
    if step is not None and step > ran:
        raise StepBeyondRun(
            f"step {step} is beyond the {stored.kind}: its memory pass measured steps 1 to {ran} "
            f"(steps with a timeline: {listed})"
        )
    chosen = step if step is not None else (peak_step or steps[-1])
    if chosen not in steps:
        raise NoTimeline(
            f"step {chosen} of {stored.name} has no memory timeline: the first step and the peak step are "
            f"recorded (steps {listed})"
        )
    blob = session.scalar(select(table.data).where(*stored.key, table.step == chosen))
    try:
        return steps, peak_step, decode(blob)
    except TimelineFormatError as exc:
        raise NoTimeline(f"the memory timeline of step {chosen} of {stored.name}: {exc}") from None


def load_timeline(session: Session, exp: Experiment, step: int | None) -> LoadedTimeline:
    """The timeline of ``exp``'s current attempt at ``step`` (None: the peak step's).

    Raises:
        NoTimeline: the run did not succeed, has no timeline (an older run, a CUDA or
            compiled run, recording off), ``step`` is one of its steps without a timeline,
            or the stored one does not read back.
        StepBeyondRun: ``step`` is past the run's memory pass.
    """
    if exp.status != Status.SUCCEEDED:
        raise NoTimeline(f"experiment {exp.id} is {exp.status}: only a run that succeeded has a memory timeline")
    key = (MemoryTimeline.experiment_id == exp.id, MemoryTimeline.attempt == exp.attempt)
    stored = _Stored(
        MemoryTimeline, key, f"experiment {exp.id}", "run", exp.run_summary.memory_steps_run, _why_none(exp)
    )
    steps, peak_step, timeline = _read(session, stored, step)
    return LoadedTimeline(exp.id, exp.attempt, steps, peak_step, timeline)


def load_prediction_timeline(session: Session, row: Prediction, step: int | None) -> LoadedTimeline:
    """The timeline of prediction ``row``'s fake memory pass at ``step`` (None: the peak
    step's): the fake tensors' bytes as the live-tensor tracker counted them.

    Raises:
        NoTimeline: the prediction did not succeed, has no timeline (stored before
            predictions recorded one, a sharded spec, recording off), ``step`` is one of
            its steps without a timeline, or the stored one does not read back.
        StepBeyondRun: ``step`` is past the prediction's memory pass.
    """
    if row.status != Status.SUCCEEDED:
        raise NoTimeline(f"prediction {row.id} is {row.status}: only a prediction that succeeded has a memory timeline")
    why = (
        f"prediction {row.id} has no memory timeline: predictions stored before timelines were recorded, of a "
        "sharded spec (one rank is traced, not recorded), or made with CKPTLAB_RECORD_TIMELINE off have none"
    )
    key = (PredictionTimeline.prediction_id == row.id,)
    ran = row.run_summary.memory_steps_run
    stored = _Stored(PredictionTimeline, key, f"prediction {row.id}", "prediction", ran, why)
    steps, peak_step, timeline = _read(session, stored, step)
    return LoadedTimeline(None, None, steps, peak_step, timeline, prediction_id=row.id, target=row.target)


def timeline_view(loaded: LoadedTimeline, max_points: int) -> TimelinePublic:
    """At most ``max_points`` (>= 4) events of the step, picked by MinMaxLTTB over the live
    bytes (every event when there are no more), the peak's event always among them: each
    with its live bytes, by category, and its event's bytes, module, op, saved flag and
    checkpoint region; the phase and recomputation spans."""
    tl = loaded.timeline
    peak_bytes, peak_index = tl.peak()
    n = tl.n_events
    if n <= max_points:
        idx = np.arange(n, dtype=np.int64)
    else:  # x is the event index: tsdownsample's default
        picked = MinMaxLTTBDownsampler().downsample(tl.live_bytes, n_out=max_points - 2)
        ends = [int(np.argmin(tl.live_bytes)), max(peak_index, 0)]  # the exact peak, always
        idx = np.union1d(picked.astype(np.int64), ends)
    levels = tl.levels_by_category(idx)
    block = tl.block_of_event[idx]
    regions = tl.region[block]
    return TimelinePublic(
        experiment_id=loaded.experiment_id,
        attempt=loaded.attempt,
        prediction_id=loaded.prediction_id,
        target=loaded.target,
        step=tl.step,
        steps=loaded.steps,
        peak_step=loaded.peak_step,
        n_events=n,
        downsampled=len(idx) < n,
        baseline_bytes=tl.baseline_bytes,
        peak_bytes=peak_bytes,
        peak_index=peak_index,
        t_index=idx.tolist(),
        live_bytes=tl.live_bytes[idx].tolist(),
        by_category={c: levels[i].tolist() for i, c in enumerate(tl.categories) if levels[i].any()},
        bytes_delta=tl.bytes_delta[idx].tolist(),
        module=[tl.modules[m] for m in tl.module[block]],
        op=[tl.ops[o] for o in tl.op[block]],
        saved_for_backward=((tl.flags[block] & SAVED) > 0).tolist(),
        checkpoint_region=[tl.regions[r] if 0 <= r < len(tl.regions) else None for r in regions],
        phases=[SpanPublic(phase=p, start=s, end=e) for p, s, e in tl.phase_spans()],
        recomputations=[SpanPublic(start=s, end=e) for s, e in tl.recompute_spans],
        region_keeps=tl.region_keeps,
    )


def peak_holders_view(loaded: LoadedTimeline, top: int) -> PeakHoldersPublic:
    """Who holds the step's peak (:func:`ckptlab.analysis.timeline.peak_holders`): the ``top``
    largest (module, category, saved) groups by name and the rest summed, so that
    ``holders`` and ``others_bytes`` add up to ``peak_bytes`` exactly."""
    found = peak_holders(loaded.timeline, top)
    peak = found.peak_bytes
    return PeakHoldersPublic(
        experiment_id=loaded.experiment_id,
        attempt=loaded.attempt,
        step=found.step,
        peak_bytes=peak,
        peak_index=found.peak_index,
        phase=found.phase,
        named_bytes=found.named_bytes,
        unknown_bytes=peak - found.named_bytes,
        groups=found.groups,
        holders=[
            HolderPublic(
                module=h.module,
                category=h.category,
                saved=h.saved,
                bytes=h.bytes,
                share=h.bytes / peak if peak else 0.0,
                blocks=h.blocks,
                recomputed_bytes=h.recomputed_bytes,
                ops=list(h.ops),
            )
            for h in found.holders
        ],
        others_bytes=found.others_bytes,
        others_groups=found.others_groups,
        by_category=found.by_category,
    )
