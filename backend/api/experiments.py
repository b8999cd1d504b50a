"""Routes for experiments: thin wrappers over :mod:`ckptlab.db.store`, :mod:`ckptlab.db.queue`
and :mod:`ckptlab.backend.services.queries`."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse
from sse_starlette import EventSourceResponse

from ckptlab.backend.deps import (
    MAX_ID,
    ComputedReadDep,
    ExperimentId,
    PerStepQuery,
    SeriesCacheDep,
    SessionDep,
    SettingsDep,
    TokenDep,
)
from ckptlab.backend.encoding import json_without_per_step
from ckptlab.backend.schemas import (
    AttemptPublic,
    AttemptsPublic,
    ComparisonPublic,
    EventPublic,
    EventsPublic,
    ExperimentCreate,
    ExperimentPublic,
    ExperimentsPublic,
    Format,
    Message,
    Metric,
    RunLogPublic,
    RunProgressPublic,
    SeriesPoint,
    SeriesPublic,
    Status,
    StepsPublic,
)
from ckptlab.backend.services import comparison, exports, queries, series, series_view, streams
from ckptlab.backend.services.progress import experiment_progress
from ckptlab.backend.services.responses import CSV_RESPONSE, SSE_RESPONSE, WRITE_RESPONSES
from ckptlab.db import events, queue, store
from ckptlab.db.models import Experiment
from ckptlab.spec.experiment import ExperimentSpec, StrategyName
from ckptlab.spec.kinds import ModelKindName
from ckptlab.spec.limits import limit_errors

#: Largest attempt number: ``steps.attempt`` and ``experiments.attempt`` are 32-bit columns
#: (a worker would need 2**31 claims to reach it); beyond it, the same 422 on both databases.
MAX_ATTEMPT = 2**31 - 1
#: Largest step number (``steps.step`` is a 32-bit column).
MAX_STEP = 2**31 - 1

router = APIRouter(prefix="/experiments", tags=["experiments"])

#: The largest ``max_points`` the schema admits (a server may cap lower: series_max_points).
MAX_SERIES_POINTS = 1_000_000

NOT_FOUND = {404: {"model": Message, "description": "No experiment with this id"}}
#: The 401 of a read that needs the token when one is set.
TOKEN_RESPONSE = {401: WRITE_RESPONSES[401]}


def experiment_filters(
    status_: Annotated[Status | None, Query(alias="status", description="only this status")] = None,
    sweep_id: Annotated[int | None, Query(ge=1, le=MAX_ID, description="only this sweep's")] = None,
    model_kind: Annotated[ModelKindName | None, Query(description="only this model kind")] = None,
    strategy: Annotated[StrategyName | None, Query(description="only this checkpoint strategy")] = None,
    ids: Annotated[
        str | None,
        Query(
            pattern=r"^\d{1,18}(,\d{1,18})*$",
            max_length=20_000,
            description="only these ids, comma-separated (for comparison); in this order unless sort is given",
            examples=["1,2,3"],
        ),
    ] = None,
    sort: Annotated[
        Literal[queries.SORT_KEYS] | None,  # type: ignore[valid-type]
        Query(description="column to sort by; '-' prefix for descending (default: -id)", examples=["-created_at"]),
    ] = None,
) -> dict[str, Any]:
    """The listing filters of a request, as keyword arguments of
    :func:`ckptlab.backend.services.queries.query_experiments`."""
    return {
        "status": status_,
        "sweep_id": sweep_id,
        "model_kind": model_kind,
        "strategy": strategy,
        "ids": [int(i) for i in ids.split(",")] if ids else None,
        "sort": sort,
    }


FiltersDep = Annotated[dict[str, Any], Depends(experiment_filters)]


def _get_or_404(session, experiment_id: int) -> Experiment:
    exp = store.get_experiment(session, experiment_id=experiment_id)
    if exp is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"experiment {experiment_id} not found")
    return exp


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=ExperimentPublic,
    responses=WRITE_RESPONSES,
    summary="Submit an experiment",
)
def create_experiment(session: SessionDep, settings: SettingsDep, body: ExperimentCreate) -> Experiment:
    """Queue an experiment; a worker claims it. Invalid specs, and specs over this server's
    limits (steps, batch size, parameter count), get 422 naming the field."""
    spec = ExperimentSpec.model_validate(body.model_dump())
    errors = limit_errors(spec, settings)
    if errors:
        raise RequestValidationError(errors)
    return store.create_experiment(session, spec=spec)


@router.get("", response_model=ExperimentsPublic, summary="List, filter, sort and page experiments")
def list_experiments(
    session: SessionDep,
    filters: FiltersDep,
    offset: Annotated[int, Query(ge=0, le=2**31)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    per_step: PerStepQuery = True,
) -> ExperimentsPublic | Response:
    """A page of experiments matching every filter given; ``count`` is the total match. With
    ``per_step=false`` the summaries leave out :data:`ckptlab.summary.PER_STEP_FIELDS` (100
    runs of 1,000 timed steps: 7.6 MB with them, 0.39 MB without; bench/bench_list_page.py)."""
    rows, count = queries.query_experiments(session, **filters, offset=offset, limit=limit)
    page = ExperimentsPublic(data=[ExperimentPublic.model_validate(r) for r in rows], count=count)
    if per_step:
        return page
    return json_without_per_step(page, "data")


@router.get(
    "/export",
    dependencies=[ComputedReadDep],
    response_model=ExperimentsPublic,
    responses=CSV_RESPONSE,
    summary="Export experiments as CSV or JSON",
)
def export_experiments(
    session: SessionDep,
    filters: FiltersDep,
    format: Annotated[Format, Query(description="csv: one row per experiment, spec and summary flattened")] = "json",
):
    """Every experiment matching the filters (same filters as the listing, no paging). CSV
    columns: id, status, sweep_id, model_kind, strategy, attempt, times, worker_id, error,
    corrupt (what of a stored row failed to read; empty when nothing did), then ``spec.*``
    and ``summary.*`` flattened with dotted names."""
    rows, count = queries.query_experiments(session, **filters, limit=None)
    if format == "csv":
        return exports.csv_response([exports.experiment_record(r) for r in rows], filename="experiments.csv")
    return ExperimentsPublic(data=[ExperimentPublic.model_validate(r) for r in rows], count=count)


@router.get("/{experiment_id}", response_model=ExperimentPublic, responses=NOT_FOUND, summary="One experiment")
def get_experiment(session: SessionDep, experiment_id: ExperimentId) -> ExperimentPublic:
    """The experiment with its spec, status, summary and error; while queued or running, its
    ``progress`` (place in the queue, or step k of N and an ETA)."""
    exp = _get_or_404(session, experiment_id)
    public = ExperimentPublic.model_validate(exp)
    progress = experiment_progress(session, exp)
    if progress is not None:
        public.progress = RunProgressPublic.model_validate({**asdict(progress), "text": progress.words()})
    return public


@router.get(
    "/{experiment_id}/steps",
    response_model=StepsPublic,
    responses={**NOT_FOUND, **CSV_RESPONSE},
    summary="Per-step time and memory (JSON or CSV)",
)
def list_steps(
    request: Request,
    session: SessionDep,
    experiment_id: ExperimentId,
    format: Annotated[Format, Query(description="csv streams one row per step")] = "json",
    attempt: Annotated[
        int | None,
        Query(ge=1, le=MAX_ATTEMPT, description="an earlier (lost) attempt; default: the current one"),
    ] = None,
):
    """The steps of the experiment's current attempt (or of ``attempt``), by step: times in ms,
    memory in bytes."""
    exp = _get_or_404(session, experiment_id)
    which = attempt or exp.attempt
    if format == "csv":
        sessions = request.app.state.sessionmaker

        def rows():
            with sessions() as s:  # its own session: the response outlives the request's
                yield from exports.step_csv_rows(queries.iter_step_rows(s, experiment_id=exp.id, attempt=which))

        return exports.csv_response(
            rows(), filename=f"experiment-{exp.id}-steps.csv", columns=exports.STEP_EXPORT_COLUMNS
        )
    rows = store.list_steps(session, experiment_id=exp.id, attempt=which)
    return StepsPublic.model_validate({"data": rows, "count": len(rows)}, from_attributes=True)


@router.get(
    "/{experiment_id}/attempts",
    response_model=AttemptsPublic,
    responses=NOT_FOUND,
    summary="Attempts of an experiment, lost ones marked",
)
def list_attempts(session: SessionDep, experiment_id: ExperimentId) -> AttemptsPublic:
    """Every claim of the experiment with its stored step count; an attempt whose worker was
    lost keeps its steps, marked ``lost``, apart from the current attempt's series."""
    exp = _get_or_404(session, experiment_id)
    rows = store.list_attempts(session, experiment_id=exp.id)
    return AttemptsPublic(data=[AttemptPublic.model_validate(a) for a in rows])


@router.get(
    "/{experiment_id}/events/history",
    response_model=EventsPublic,
    responses=NOT_FOUND,
    summary="Every status change of an experiment: when, which attempt and worker, why",
)
def list_events(session: SessionDep, experiment_id: ExperimentId) -> EventsPublic:
    """The recorded history (``experiment_events``, written with each change): a requeued
    experiment shows which worker lost which attempt, when and why."""
    exp = _get_or_404(session, experiment_id)
    return EventsPublic(data=[EventPublic.model_validate(e) for e in events.history(session, experiment_id=exp.id)])


@router.get(
    "/{experiment_id}/log",
    response_model=RunLogPublic,
    responses={**NOT_FOUND, **TOKEN_RESPONSE},
    dependencies=[TokenDep],
    summary="A run's log: the traceback of its failure (needs the API token when one is set)",
)
def get_log(session: SessionDep, experiment_id: ExperimentId) -> RunLogPublic:
    """The traceback the worker recorded when the run failed (``log``; null when none was:
    a run that succeeded, or one stopped from outside), beside its public one-sentence
    ``error``. Tracebacks name the host's files, so when the server sets
    ``CKPTLAB_API_TOKEN`` this read needs ``Authorization: Bearer <token>`` (401 without)."""
    exp = _get_or_404(session, experiment_id)
    return RunLogPublic(experiment_id=exp.id, attempt=exp.attempt, status=exp.status, error=exp.error, log=exp.log)


@router.get(
    "/{experiment_id}/comparison",
    dependencies=[ComputedReadDep],
    response_model=ComparisonPublic,
    responses=NOT_FOUND,
    summary="Step-time overhead against the baseline, with its 95% CI",
)
def compare_experiment(session: SessionDep, settings: SettingsDep, experiment_id: ExperimentId) -> ComparisonPublic:
    """The experiment against its ``none`` baseline (the same spec but for ``checkpoint``):
    which baseline runs, and the overhead of the median step time with its bootstrap 95%
    CI; "no measurable difference" when the CI contains 0 or the estimate is below the
    server's noise threshold (``CKPTLAB_NOISE_THRESHOLD_PCT``); ``baseline_refused`` says why
    this server would not queue the baseline (a ``ckptlab.profile`` run's model)."""
    exp = _get_or_404(session, experiment_id)
    found = comparison.compare_with_baseline(session, experiment=exp, noise_threshold_pct=settings.noise_threshold_pct)
    if not found.is_baseline:
        found.baseline_refused = comparison.baseline_refusal(exp, settings)
    return ComparisonPublic.model_validate(found)


@router.get(
    "/{experiment_id}/series",
    response_model=SeriesPublic,
    responses=NOT_FOUND,
    summary="One per-step metric, downsampled for charts",
)
def get_series(
    session: SessionDep,
    settings: SettingsDep,
    cache: SeriesCacheDep,
    experiment_id: ExperimentId,
    metric: Annotated[Metric, Query(description="a per-step column (ms, bytes, or loss)")] = "step_ms",
    max_points: Annotated[
        int,
        Query(
            ge=10,
            le=MAX_SERIES_POINTS,
            description="most points to return; capped at the server's series_max_points (default 20000)",
        ),
    ] = series.DEFAULT_MAX_POINTS,
    step_min: Annotated[
        int | None, Query(ge=0, le=MAX_STEP, description="first step of the range (default: the first stored)")
    ] = None,
    step_max: Annotated[
        int | None, Query(ge=0, le=MAX_STEP, description="last step of the range (default: the last stored)")
    ] = None,
) -> SeriesPublic:
    """At most ``max_points`` points of ``metric`` over the current attempt's steps
    ``step_min`` .. ``step_max`` (inclusive), picked by MinMaxLTTB so that spikes survive;
    the range's minimum and maximum are always among them, exact, with their steps. A long
    range is drawn from the run's rollup (``resolution`` > 1: steps per bucket), a short one
    from every step in it (``resolution`` 1: a zoomed range of up to ``max_points`` steps
    comes back whole). Steps without a finite value (a non-finite loss, reserved bytes on
    CPU) are skipped. ``max_points`` above the server's ``series_max_points`` is capped to
    it; ``step_min`` above ``step_max`` is a 422 naming ``step_max``."""
    if step_min is not None and step_max is not None and step_min > step_max:
        raise RequestValidationError(
            [
                {
                    "type": "value_error",
                    "loc": ["query", "step_max"],
                    "msg": f"step_max ({step_max}) must not be below step_min ({step_min})",
                    "input": step_max,
                }
            ]
        )
    max_points = min(max_points, settings.series_max_points)
    exp = _get_or_404(session, experiment_id)
    view = series_view.read_view(
        session,
        cache,
        experiment_id=exp.id,
        attempt=exp.attempt,
        metric=metric,
        max_points=max_points,
        step_min=step_min,
        step_max=step_max,
    )
    return SeriesPublic(
        experiment_id=exp.id,
        attempt=exp.attempt,
        metric=metric,
        step_min=step_min,
        step_max=step_max,
        total=view.total,
        skipped=view.skipped,
        downsampled=len(view.x) < view.total,
        resolution=view.resolution,
        x=view.x,
        y=view.y,
        min=SeriesPoint(step=view.min[0], value=view.min[1]) if view.min else None,
        max=SeriesPoint(step=view.max[0], value=view.max[1]) if view.max else None,
    )


@router.get(
    "/{experiment_id}/events",
    response_class=EventSourceResponse,
    responses={**NOT_FOUND, **SSE_RESPONSE},
    summary="Live steps and status changes (Server-Sent Events)",
)
async def experiment_events(experiment_id: ExperimentId, stream: streams.StreamDep):
    """``text/event-stream`` of ``step``, ``status`` and a final ``end`` event (then the
    stream closes). Event ids are cursors: reconnect with ``Last-Event-ID`` to resume. 503
    with ``Retry-After`` when the server already serves ``max_streams`` streams."""
    exp_id = await streams.read_once(stream, lambda session: _get_or_404(session, experiment_id).id)
    return streams.event_stream(stream, experiment_ids=lambda _s: [exp_id], scope=("experiment", exp_id))


@router.get(
    "/{experiment_id}/snapshot",
    response_class=FileResponse,
    responses={
        **NOT_FOUND,
        200: {
            "content": {"application/octet-stream": {"example": "<pickle bytes>"}},
            "description": "the snapshot pickle",
        },
    },
    summary="Download the CUDA memory snapshot",
)
def download_snapshot(session: SessionDep, experiment_id: ExperimentId) -> FileResponse:
    """The CUDA allocator snapshot (``torch.cuda.memory._snapshot``, pickled) recorded for an
    experiment run with ``memory_snapshot: true`` on CUDA: the step its memory timeline keeps
    as the peak step (the whole run where no timeline is recorded); open it at
    pytorch.org/memory_viz. 404 when none."""
    exp = _get_or_404(session, experiment_id)
    if not exp.snapshot_path or not Path(exp.snapshot_path).is_file():
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"experiment {experiment_id} has no memory snapshot")
    return FileResponse(
        exp.snapshot_path, media_type="application/octet-stream", filename=f"ckptlab-{experiment_id}-snapshot.pickle"
    )


@router.post(
    "/{experiment_id}/cancel",
    response_model=ExperimentPublic,
    responses={
        **NOT_FOUND,
        **WRITE_RESPONSES,
        409: {"model": Message, "description": "The experiment has already finished"},
    },
    summary="Cancel an experiment",
)
def cancel_experiment(session: SessionDep, experiment_id: ExperimentId) -> Experiment:
    """A queued experiment is ``cancelled`` at once; a running one is stopped by its worker
    within about a second (``cancel_requested`` is set until then)."""
    try:
        exp = queue.request_cancel(session, experiment_id=experiment_id)
    except queue.ExperimentFinishedError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=str(exc)) from None
    if exp is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"experiment {experiment_id} not found")
    return exp
