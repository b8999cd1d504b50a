"""Routes for sweeps: thin wrappers over :mod:`ckptlab.spec.sweeps` and the chart, export and
stream services."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Response, status
from fastapi.exceptions import RequestValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session
from sse_starlette import EventSourceResponse

from ckptlab.backend.deps import ComputedReadDep, PerStepQuery, SessionDep, SettingsDep, SweepId
from ckptlab.backend.encoding import json_without_per_step
from ckptlab.backend.schemas import (
    ChartName,
    ChartPublic,
    Format,
    InvalidCombination,
    Message,
    PlannedRunPublic,
    ProgressPublic,
    RecommendationPublic,
    SweepCreate,
    SweepExperimentPublic,
    SweepPlanPublic,
    SweepPublic,
    SweepResultPublic,
    SweepResultsPublic,
    SweepsPublic,
    SweepSummaryPublic,
)
from ckptlab.backend.services import charts, exports, streams
from ckptlab.backend.services import sweeps as sweep_reads
from ckptlab.backend.services.recommend import rank_rows, recommend
from ckptlab.backend.services.responses import CSV_RESPONSE, SSE_RESPONSE, WRITE_RESPONSES
from ckptlab.db import queue, store
from ckptlab.db.models import Experiment, Sweep
from ckptlab.spec import sweeps as planning

router = APIRouter(prefix="/sweeps", tags=["sweeps"])

NOT_FOUND = {404: {"model": Message, "description": "No sweep with this id"}}


def _get_or_404(session: Session, sweep_id: int) -> Sweep:
    sweep = store.get_sweep(session, sweep_id=sweep_id)
    if sweep is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"sweep {sweep_id} not found")
    return sweep


def _progress(p: sweep_reads.Progress) -> ProgressPublic:
    return ProgressPublic(
        total=p.total, finished=p.finished, counts=p.counts, elapsed_s=p.elapsed_s, eta_s=p.eta_s, eta_text=p.eta_text
    )


def _public(session: Session, sweep: Sweep) -> SweepPublic:
    listed = {sweep.id: [e.status for e in sweep.experiments]}  # counted as listed, not read again
    progress = sweep_reads.sweep_progress(session, sweep_ids=[sweep.id], statuses=listed)[sweep.id]
    by_id = {e.id: e for e in sweep.experiments}
    experiments = [
        SweepExperimentPublic(
            id=r.experiment_id,
            status=r.status,
            role=r.role,
            values=r.values,
            label=r.label,
            baseline_id=r.baseline_id,
            repeat_of=r.repeat_of,
            attempt=by_id[r.experiment_id].attempt,
            summary=by_id[r.experiment_id].run_summary if by_id[r.experiment_id].summary is not None else None,
            error=by_id[r.experiment_id].error,
        )
        for r in sweep_reads.sweep_rows(sweep)
    ]
    return SweepPublic(
        id=sweep.id,
        name=sweep.name,
        axes=sweep.axes,
        base=sweep.base,
        created_at=sweep.created_at,
        cancelled=sweep.cancelled,
        progress=_progress(progress),
        invalid=sweep.invalid or [],
        experiments=experiments,
        corrupt=sweep.corrupt,
    )


def _plan_public(plan: planning.SweepPlan) -> SweepPlanPublic:
    return SweepPlanPublic(
        combinations=plan.combinations,
        baselines=plan.baselines,
        repeats=plan.repeats,
        total=len(plan.runs),
        duplicates=plan.duplicates,
        runs=[
            PlannedRunPublic(
                values=r.values,
                label=planning.axis_label(r.values),
                baseline=r.baseline,
                repeat=r.repeat,
                spec=r.spec.model_dump(mode="json"),
            )
            for r in plan.runs
        ],
        invalid=[InvalidCombination.model_validate(i) for i in plan.invalid],
    )


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=SweepPublic | SweepPlanPublic,
    responses={**WRITE_RESPONSES, 200: {"model": SweepPlanPublic, "description": "The plan of a dry run"}},
    summary="Create a sweep (or, with dry_run, plan one): the product of axes over a base spec",
)
def create_sweep(
    session: SessionDep,
    settings: SettingsDep,
    body: SweepCreate,
    response: Response,
    dry_run: Annotated[
        bool, Query(description="plan only: answer 200 with the runs and invalid combinations, store nothing")
    ] = False,
) -> SweepPublic | SweepPlanPublic:
    """Queue one experiment per valid combination of axis values, plus a ``none`` baseline
    for each combination of the axes outside ``checkpoint.``. Invalid combinations are
    returned in ``invalid``. 422 when an axis names no spec field, repeats a value, the sweep
    is over the server's ``max_sweep_size``, or no combination is valid (also on a dry run,
    so a form can show the server's own verdict before submitting)."""
    try:
        plan = planning.plan_sweep(body.base, body.axes, max_size=settings.max_sweep_size, settings=settings)
    except planning.SweepError as exc:
        raise RequestValidationError([{**e, "loc": ["body", *e["loc"]]} for e in exc.errors]) from None
    if dry_run:
        response.status_code = status.HTTP_200_OK
        return _plan_public(plan)
    sweep = store.create_sweep(session, name=body.name, base=body.base, axes=body.axes, plan=plan)
    return _public(session, sweep)


@router.get("", response_model=SweepsPublic, summary="List sweeps, newest first, with progress")
def list_sweeps(
    session: SessionDep,
    offset: Annotated[int, Query(ge=0, le=2**31)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> SweepsPublic:
    """A page of sweeps and the total count; each with its progress."""
    rows, count = sweep_reads.list_sweeps(session, offset=offset, limit=limit)
    progress = sweep_reads.sweep_progress(session, sweep_ids=[s.id for s in rows])
    return SweepsPublic(
        data=[
            SweepSummaryPublic(
                id=s.id,
                name=s.name,
                axes=s.axes,
                created_at=s.created_at,
                cancelled=s.cancelled,
                progress=_progress(progress[s.id]),
                corrupt=s.corrupt,
            )
            for s in rows
        ],
        count=count,
    )


@router.get("/{sweep_id}", response_model=SweepPublic, responses=NOT_FOUND, summary="One sweep with its experiments")
def get_sweep(session: SessionDep, sweep_id: SweepId, per_step: PerStepQuery = True) -> SweepPublic | Response:
    """The sweep's definition, invalid combinations, progress (finished of total, counts per
    status) and every experiment's axis values, baseline and summary; with ``per_step=false``
    the summaries without :data:`ckptlab.summary.PER_STEP_FIELDS` (what the sweep page asks)."""
    public = _public(session, _get_or_404(session, sweep_id))
    return public if per_step else json_without_per_step(public, "experiments")


@router.post(
    "/{sweep_id}/cancel",
    response_model=SweepPublic,
    responses={**NOT_FOUND, **WRITE_RESPONSES},
    summary="Cancel every unfinished experiment of a sweep",
)
def cancel_sweep(session: SessionDep, sweep_id: SweepId) -> SweepPublic:
    """Queued experiments become ``cancelled`` at once; running ones are stopped by their
    workers within about a second. Finished ones keep their outcome. Idempotent."""
    if queue.cancel_sweep(session, sweep_id=sweep_id) is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"sweep {sweep_id} not found")
    return _public(session, _get_or_404(session, sweep_id))


@router.get(
    "/{sweep_id}/events",
    response_class=EventSourceResponse,
    responses={**NOT_FOUND, **SSE_RESPONSE},
    summary="Live steps, status changes and progress of a sweep (Server-Sent Events)",
)
async def sweep_events(sweep_id: SweepId, stream: streams.StreamDep):
    """``text/event-stream`` of ``step``, ``status`` and ``progress`` events for every
    experiment of the sweep, and a final ``end`` once all have finished. 503 with
    ``Retry-After`` when the server already serves ``max_streams`` streams."""
    sid = await streams.read_once(stream, lambda session: _get_or_404(session, sweep_id).id)

    def ids(s: Session) -> list[int]:
        return list(s.scalars(select(Experiment.id).where(Experiment.sweep_id == sid)))

    return streams.event_stream(stream, experiment_ids=ids, sweep_id=sid, scope=("sweep", sid))


@router.get(
    "/{sweep_id}/results",
    dependencies=[ComputedReadDep],
    response_model=SweepResultsPublic,
    responses={**NOT_FOUND, **CSV_RESPONSE},
    summary="A sweep's results table (JSON or CSV)",
)
def sweep_results(
    session: SessionDep,
    settings: SettingsDep,
    sweep_id: SweepId,
    format: Annotated[
        Format, Query(description="csv: one row per experiment, one column per axis and metric")
    ] = "json",
):
    """One row per experiment: role (baseline or run), axis values, its baseline, its rank
    by overhead (the recommendation's ranking), and the numbers compared (activation and
    peak bytes, overhead against the baseline in % with its 95% CI: paired with an
    un-checkpointed copy in one process where timed so, saving in %, gradient difference).
    The run's own step times (ms) are labelled as separate runs, not comparable on a busy
    host (the CSV's column names say so, the JSON's ``raw_times``)."""
    sweep = _get_or_404(session, sweep_id)
    rows = sweep_reads.sweep_rows(sweep, noise_threshold_pct=settings.noise_threshold_pct)
    rank_rows(rows)
    if format == "csv":
        return exports.csv_response(
            [exports.sweep_result_record(r) for r in rows], filename=f"sweep-{sweep.id}-results.csv"
        )
    return SweepResultsPublic(
        sweep_id=sweep.id,
        axes=list(sweep.axes),
        data=[SweepResultPublic.model_validate(r, from_attributes=True) for r in rows],
    )


@router.get(
    "/{sweep_id}/charts/{name}",
    dependencies=[ComputedReadDep],
    response_model=ChartPublic,
    responses=NOT_FOUND,
    summary="A chart of a sweep as a Plotly figure",
)
def sweep_chart(session: SessionDep, sweep_id: SweepId, name: ChartName) -> ChartPublic:
    """``memory_vs_segments`` (with the curve expected from the baseline's blocks),
    ``time_vs_segments`` (overhead against the baseline, %), ``pareto`` (memory against
    time, frontier marked) or ``correctness`` (gradient difference per run). Another name
    gets 422 listing the valid ones."""
    sweep = _get_or_404(session, sweep_id)
    return ChartPublic.model_validate(charts.build_chart(sweep, name=name))


@router.get(
    "/{sweep_id}/recommendation",
    dependencies=[ComputedReadDep],
    response_model=RecommendationPublic,
    responses=NOT_FOUND,
    summary="The setting to use for a memory budget, and why",
)
def sweep_recommendation(
    session: SessionDep,
    settings: SettingsDep,
    sweep_id: SweepId,
    budget_bytes: Annotated[
        int | None, Query(ge=1, le=2**62, description="memory budget for the peak, bytes (optional)")
    ] = None,
    within_pct: Annotated[
        float | None,
        Query(
            ge=0,
            le=1_000_000,
            description="also name the smallest setting whose overhead against its baseline is at most this % "
            "(its estimate)",
        ),
    ] = None,
) -> RecommendationPublic:
    """A setting is better than its baseline only when its peak and activations are lower by
    more than 1% (and 4 KiB) and its gradients do not differ. Time is the overhead against
    the run's own baseline (paired with an un-checkpointed copy in one process where timed
    so), never raw step times of separate runs; ``ranking`` orders the candidates by the
    high end of its 95% CI (then peak, then the simpler setting), and the budget's pick is
    the first that fits: no fitting setting is measurably faster. ``smallest_within``: the
    lowest peak whose overhead estimate is at most ``within_pct``. Says why, and says so
    when nothing beats the baseline."""
    sweep = _get_or_404(session, sweep_id)
    rows = sweep_reads.sweep_rows(sweep, noise_threshold_pct=settings.noise_threshold_pct)
    rec = recommend(rows, budget_bytes=budget_bytes, within_pct=within_pct)
    return RecommendationPublic.model_validate(rec, from_attributes=True)
