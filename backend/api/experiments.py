"""Routes for experiments: thin wrappers over :mod:`ckptlab.db.store`."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query, status

from backend.deps import SessionDep
from backend.schemas import ExperimentCreate, ExperimentPublic, ExperimentsPublic, StepsPublic
from ckptlab.db import store
from ckptlab.db.models import Experiment
from ckptlab.spec import ExperimentSpec

router = APIRouter(prefix="/experiments", tags=["experiments"])

NOT_FOUND = {404: {"description": "No experiment with this id"}}


def _get_or_404(session, experiment_id: int) -> Experiment:
    exp = store.get_experiment(session, experiment_id=experiment_id)
    if exp is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"experiment {experiment_id} not found")
    return exp


@router.post("", status_code=status.HTTP_201_CREATED, response_model=ExperimentPublic, summary="Submit an experiment")
def create_experiment(session: SessionDep, body: ExperimentCreate) -> Experiment:
    """Queue an experiment; a worker claims it. Invalid specs get 422 naming the field."""
    spec = ExperimentSpec.model_validate(body.model_dump())
    return store.create_experiment(session, spec=spec)


@router.get("", response_model=ExperimentsPublic, summary="List experiments, newest first")
def list_experiments(
    session: SessionDep,
    status_: Annotated[Literal["queued", "running", "succeeded", "failed"] | None, Query(alias="status")] = None,
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> ExperimentsPublic:
    rows, count = store.list_experiments(session, status=status_, offset=offset, limit=limit)
    return ExperimentsPublic(data=[ExperimentPublic.model_validate(r) for r in rows], count=count)


@router.get("/{experiment_id}", response_model=ExperimentPublic, responses=NOT_FOUND, summary="One experiment")
def get_experiment(session: SessionDep, experiment_id: int) -> Experiment:
    return _get_or_404(session, experiment_id)


@router.get(
    "/{experiment_id}/steps", response_model=StepsPublic, responses=NOT_FOUND, summary="Per-step time and memory"
)
def list_steps(session: SessionDep, experiment_id: int) -> StepsPublic:
    exp = _get_or_404(session, experiment_id)
    rows = store.list_steps(session, experiment_id=exp.id, attempt=exp.attempt)
    return StepsPublic.model_validate({"data": rows, "count": len(rows)}, from_attributes=True)
