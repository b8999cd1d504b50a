"""Routes for a run's and a prediction's memory timeline (issue 34), and the predictions of
a run's spec that have one: thin wrappers over :mod:`ckptlab.backend.services.timelines`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status
from fastapi.exceptions import RequestValidationError

from ckptlab.backend.deps import ExperimentId, PredictionId, SessionDep
from ckptlab.backend.schemas import Message, PeakHoldersPublic, TimelinePublic
from ckptlab.backend.schemas.predictions import PredictionPublic, PredictionsPublic
from ckptlab.backend.schemas.timelines import MAX_HOLDERS, MAX_TIMELINE_POINTS
from ckptlab.backend.services import timelines
from ckptlab.db import store

router = APIRouter(prefix="/experiments", tags=["experiments"])
prediction_router = APIRouter(prefix="/predictions", tags=["predictions"])

#: Largest step number (``steps.step`` is a 32-bit column).
MAX_STEP = 2**31 - 1

NO_TIMELINE = {
    404: {
        "model": Message,
        "description": "No experiment with this id, or no timeline to serve, saying why: the run did not succeed, "
        "it has none (a run stored before timelines, a CUDA or compiled run), or the step has none",
    }
}

NO_PREDICTION_TIMELINE = {
    404: {
        "model": Message,
        "description": "No prediction with this id, or no timeline to serve, saying why: the prediction did not "
        "succeed, it has none (stored before predictions recorded one, a sharded spec), or the step has none",
    }
}

StepQuery = Annotated[
    int | None,
    Query(
        ge=1,
        le=MAX_STEP,
        description="the step (default: the step that reached the run's peak); the first step and the peak step "
        "have a timeline; a step beyond the run's memory pass is a 422",
    ),
]


MaxPoints = Annotated[int, Query(ge=10, le=MAX_TIMELINE_POINTS, description="most points to return")]


def _experiment(session, experiment_id: int):
    """The experiment, or the 404 naming it."""
    exp = store.get_experiment(session, experiment_id=experiment_id)
    if exp is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"experiment {experiment_id} not found")
    return exp


def _loaded(session, experiment_id: int, step: int | None) -> timelines.LoadedTimeline:
    """The step's timeline, or the 404 / 422 that says why there is none."""
    exp = _experiment(session, experiment_id)
    return _answer(lambda: timelines.load_timeline(session, exp, step), step)


def _answer(load, step: int | None) -> timelines.LoadedTimeline:
    """``load()``'s timeline, its refusals as the 422 at ``step`` or the 404 that says why."""
    try:
        return load()
    except timelines.StepBeyondRun as exc:
        raise RequestValidationError(
            [{"type": "value_error", "loc": ["query", "step"], "msg": str(exc), "input": step}]
        ) from None
    except timelines.NoTimeline as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=str(exc)) from None


@router.get(
    "/{experiment_id}/timeline",
    response_model=TimelinePublic,
    responses=NO_TIMELINE,
    summary="One step's memory timeline: every allocation and free, downsampled, by category and module",
)
def get_timeline(
    session: SessionDep,
    experiment_id: ExperimentId,
    step: StepQuery = None,
    max_points: MaxPoints = timelines.DEFAULT_TIMELINE_POINTS,
) -> TimelinePublic:
    """Live bytes after each allocation and free the live-tensor tracker counted in the step
    (CPU and CUDA runs, not compiled ones; the first step and the peak step are recorded;
    on CUDA the allocator's bytes that are no tensor's are one block), at most ``max_points`` of
    them picked by MinMaxLTTB with the peak's event always kept, exact; stacked by memory
    category, each point naming its event's module, op, bytes, whether its block was saved
    for backward and its checkpoint region; the forward / backward / optimizer spans and the
    recomputations. 404 naming why when there is none; 422 for a step beyond the run."""
    return timelines.timeline_view(_loaded(session, experiment_id, step), max_points)


@router.get(
    "/{experiment_id}/peak-holders",
    response_model=PeakHoldersPublic,
    responses=NO_TIMELINE,
    summary="Who holds a step's peak: live bytes by module, category and saved vs temporary",
)
def get_peak_holders(
    session: SessionDep,
    experiment_id: ExperimentId,
    step: StepQuery = None,
    top: Annotated[
        int, Query(ge=1, le=MAX_HOLDERS, description="groups to name, largest first")
    ] = timelines.DEFAULT_HOLDERS,
) -> PeakHoldersPublic:
    """The blocks alive at the step's peak grouped by (module, category, saved for backward or
    temporary), largest first: the ``top`` groups by name and the rest summed; together
    they are the peak to the byte. ``named_bytes``: what a module (or the batch, the loss,
    the optimizer) holds, ``unknown_bytes`` the rest. 404 naming why when the run has no
    timeline; 422 for a step beyond the run."""
    return timelines.peak_holders_view(_loaded(session, experiment_id, step), top)


#: Predictions of a run's spec listed at most.
MAX_MATCHES = 20


@router.get(
    "/{experiment_id}/predictions",
    response_model=PredictionsPublic,
    responses={404: {"model": Message, "description": "No experiment with this id"}},
    summary="The predictions of a run's spec that have a memory timeline: compare predicted with measured",
)
def get_matching_predictions(session: SessionDep, experiment_id: ExperimentId) -> PredictionsPublic:
    """The predictions that succeeded with a memory timeline whose spec is the run's but for
    the fields a prediction does not read (``device``, ``timed_steps``, ``paired_timing``,
    ``verify_gradients``, ``memory_snapshot``, ``memory_early_stop``, ``memory_limit_bytes``,
    ``timeout_s``), of any target, newest first (at most 20): what the browser offers to
    overlay (``#/timeline?ids=<run>&predictions=<ids>``)."""
    rows = timelines.predictions_of(session, _experiment(session, experiment_id), MAX_MATCHES)
    return PredictionsPublic(data=[PredictionPublic.model_validate(r) for r in rows], count=len(rows))


@prediction_router.get(
    "/{prediction_id}/timeline",
    response_model=TimelinePublic,
    responses=NO_PREDICTION_TIMELINE,
    summary="One step's predicted memory timeline: the fake tensors' allocations and frees, downsampled",
)
def get_prediction_timeline(
    session: SessionDep,
    prediction_id: PredictionId,
    step: StepQuery = None,
    max_points: MaxPoints = timelines.DEFAULT_TIMELINE_POINTS,
) -> TimelinePublic:
    """A prediction's memory timeline, as a run's (``GET /api/experiments/{id}/timeline``,
    the same shape and parameters) but of its memory pass on fake tensors: every allocation
    and free the live-tensor tracker counted, with ``prediction_id`` and ``target`` in place
    of ``experiment_id`` and ``attempt``. On target ``cpu`` its peak is the predicted peak to
    the byte; on a CUDA target it is the fake tensor count (blocks rounded to 512 B) and the
    predicted peak adds the cuBLAS workspaces to it (reserved bytes and the CUDA context are
    modelled apart). 404 naming why when there is none; 422 for a step beyond the
    prediction's memory pass."""
    row = store.get_prediction(session, prediction_id=prediction_id)
    if row is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"prediction {prediction_id} not found")
    loaded = _answer(lambda: timelines.load_prediction_timeline(session, row, step), step)
    return timelines.timeline_view(loaded, max_points)
