"""Routes for predictions ("will it fit?"): thin wrappers over
:mod:`ckptlab.backend.services.predictions` and :mod:`ckptlab.db.store`.

A prediction answers synchronously: the request waits for its prediction process (a child
interpreter running ``ckptlab.worker.predict``; the backend never imports torch) and gets
the stored prediction, ``succeeded``, ``failed`` or ``timed_out``: a prediction that failed
is a 201 too, with its error in one sentence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status
from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool

from ckptlab.backend.deps import PredictionId, PredictionSlotsDep, SessionDep, SettingsDep
from ckptlab.backend.schemas import Format, Message, Status
from ckptlab.backend.schemas.predictions import (
    PredictionBatchCreate,
    PredictionCreate,
    PredictionPublic,
    PredictionsPublic,
)
from ckptlab.backend.services import exports, predictions
from ckptlab.backend.services.responses import CSV_RESPONSE, DATABASE_BUSY, WRITE_RESPONSES, retry_later
from ckptlab.db import store
from ckptlab.db.models import Prediction
from ckptlab.settings import Settings
from ckptlab.spec.kinds import ModelKindName
from ckptlab.spec.limits import limit_errors

__all__ = ["router"]

router = APIRouter(prefix="/predictions", tags=["predictions"])

NOT_FOUND = {404: {"model": Message, "description": "No prediction with this id"}}
PREDICT_RESPONSES = {
    **WRITE_RESPONSES,
    **retry_later(f"every prediction slot of the server is taken, or {DATABASE_BUSY}"),
}
TargetFilter = Annotated[str | None, Query(max_length=64, description="only this target")]
StatusFilter = Annotated[Status | None, Query(alias="status", description="only this status")]
KindFilter = Annotated[ModelKindName | None, Query(description="only this model kind")]


async def _predict(
    session, settings: Settings, slots, body: PredictionCreate | PredictionBatchCreate, targets: Sequence[str]
) -> list[Prediction]:
    """The server's limits checked as ``POST /api/experiments`` checks them (422 at
    ``spec.<field>``) but for the parameter count and fixed memory, which a prediction does
    not allocate; then the prediction run and stored; 503 when every slot is taken."""
    errors = await run_in_threadpool(limit_errors, body.spec, settings, loc=("body", "spec"), allocates=False)
    if errors:
        raise RequestValidationError(errors)
    try:
        return await predictions.predict(
            session,
            settings,
            slots,
            spec=body.spec,
            targets=targets,
            capacity_bytes=getattr(body, "capacity_bytes", None),
            budget_per_target=body.budget_per_target,
        )
    except predictions.SlotsBusy as exc:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            detail=str(exc),
            headers={"Retry-After": str(predictions.RETRY_AFTER_S)},
        ) from None


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=PredictionPublic,
    responses=PREDICT_RESPONSES,
    summary="Predict a spec's memory on a target: will it fit?",
)
async def create_prediction(
    session: SessionDep, settings: SettingsDep, slots: PredictionSlotsDep, body: PredictionCreate
) -> Prediction:
    """Predict one training step of ``spec`` on ``target`` (allocated, reserved and device-used
    bytes, and whether it fits in the target's memory or ``capacity_bytes``) and store it.
    Answers when the prediction has ended, after at most ``CKPTLAB_PREDICTION_TIMEOUT_S``
    (default 120 s; then ``timed_out``). Invalid specs, specs over this server's limits, an
    unknown ``target`` and a ``capacity_bytes`` not above 0 get 422 naming the field."""
    (row,) = await _predict(session, settings, slots, body, [body.target])
    return row


@router.post(
    "/batch",
    status_code=status.HTTP_201_CREATED,
    response_model=PredictionsPublic,
    responses=PREDICT_RESPONSES,
    summary="Predict a spec on several targets: what fits where",
)
async def create_predictions(
    session: SessionDep, settings: SettingsDep, slots: PredictionSlotsDep, body: PredictionBatchCreate
) -> PredictionsPublic:
    """One prediction per target, in the order given, from one prediction process (its time
    limit, ``CKPTLAB_PREDICTION_TIMEOUT_S``, is the whole batch's: targets it had not
    answered by then are ``timed_out``), each stored."""
    rows = await _predict(session, settings, slots, body, body.targets)
    return PredictionsPublic(data=[PredictionPublic.model_validate(r) for r in rows], count=len(rows))


@router.get("", response_model=PredictionsPublic, summary="List, filter and page predictions")
def list_predictions(
    session: SessionDep,
    target: TargetFilter = None,
    status_: StatusFilter = None,
    model_kind: KindFilter = None,
    offset: Annotated[int, Query(ge=0, le=2**31)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> PredictionsPublic:
    """A page of predictions, newest first, matching every filter given; ``count`` is the
    total match."""
    rows, count = store.list_predictions(
        session, target=target, status=status_, model_kind=model_kind, offset=offset, limit=limit
    )
    return PredictionsPublic(data=[PredictionPublic.model_validate(r) for r in rows], count=count)


@router.get(
    "/export",
    response_model=PredictionsPublic,
    responses=CSV_RESPONSE,
    summary="Export predictions as CSV or JSON",
)
def export_predictions(
    session: SessionDep,
    target: TargetFilter = None,
    status_: StatusFilter = None,
    model_kind: KindFilter = None,
    format: Annotated[Format, Query(description="csv: one row per prediction, spec and summary flattened")] = "json",
):
    """Every prediction matching the filters (as the listing's, no paging). CSV columns: id,
    status, target, capacity_bytes, model_kind, strategy, times, elapsed_s, error, then
    ``spec.*`` and ``summary.*`` flattened with dotted names (``summary.prediction.fits``)."""
    rows, count = store.list_predictions(session, target=target, status=status_, model_kind=model_kind, limit=None)
    if format == "csv":
        return exports.csv_response([predictions.prediction_record(r) for r in rows], filename="predictions.csv")
    return PredictionsPublic(data=[PredictionPublic.model_validate(r) for r in rows], count=count)


@router.get("/{prediction_id}", response_model=PredictionPublic, responses=NOT_FOUND, summary="One prediction")
def get_prediction(session: SessionDep, prediction_id: PredictionId) -> Prediction:
    """The prediction with its spec, target, status, summary and error."""
    row = store.get_prediction(session, prediction_id=prediction_id)
    if row is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"prediction {prediction_id} not found")
    return row
