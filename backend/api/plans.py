"""Routes of plans for a memory budget: ``POST /api/plans`` queues one, ``GET
/api/plans/{id}`` answers its verdict (:mod:`ckptlab.backend.services.plans`)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status
from fastapi.exceptions import RequestValidationError

from ckptlab.analysis.explain import format_bytes
from ckptlab.backend.deps import ComputedReadDep, SessionDep, SettingsDep, SweepId
from ckptlab.backend.schemas.plans import PlanCreate, PlanPublic
from ckptlab.backend.services import plans
from ckptlab.backend.services.responses import WRITE_RESPONSES
from ckptlab.db import store
from ckptlab.spec import sweeps as planning

router = APIRouter(prefix="/plans", tags=["plans"])

NOT_FOUND = {404: {"description": "No plan with this id (no sweep, or a sweep without an auto run)"}}


def _verdict(session, settings, sweep_id: int) -> PlanPublic:
    sweep = store.get_sweep(session, sweep_id=sweep_id)
    verdict = plans.plan_verdict(sweep, noise_threshold_pct=settings.noise_threshold_pct) if sweep else None
    if verdict is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"plan {sweep_id} not found")
    return PlanPublic.model_validate(verdict, from_attributes=True)


def _located(loc: list) -> list:
    """A sweep error's location in the plan's request: the budget for the spec's
    ``checkpoint.budget_bytes``, else the field of ``base`` (an axis path split at dots)."""
    parts = [str(p) for p in loc[1:]] if loc[:1] == ["base"] else ".".join(map(str, loc[1:])).split(".")
    if parts[:2] == ["checkpoint", "budget_bytes"]:
        return ["body", "budget"]
    return ["body", "base", *(p for p in parts if p)]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=PlanPublic,
    responses=WRITE_RESPONSES,
    summary="Plan for a memory budget: auto beside none, per_block and uniform sequential splits",
)
def create_plan(session: SessionDep, settings: SettingsDep, body: PlanCreate) -> PlanPublic:
    """Queue, as one sweep, strategy ``auto`` for the budget, the ``none`` baseline,
    ``per_block`` and ``sequential`` at 2, 4, 8, ... segments up to the depth. 422 (naming
    the field) for a spec that cannot run or a budget that is not a size."""
    base, axes = plans.plan_request(body.base, int(body.budget), compile_budgets=body.compile_budgets)
    try:
        plan = planning.plan_sweep(base, axes, max_size=settings.max_sweep_size, settings=settings)
    except planning.SweepError as exc:
        raise RequestValidationError([{**e, "loc": _located(e["loc"])} for e in exc.errors]) from None
    auto = next((r for r in plan.runs if r.spec.checkpoint.strategy == plans.PLANNED), None)
    if auto is None:  # the base spec itself cannot run: its errors, where they are
        errs = next((i["errors"] for i in plan.invalid if i["values"].get("checkpoint.strategy") == plans.PLANNED), [])
        raise RequestValidationError([{**e, "loc": _located(["base", *e["loc"]])} for e in errs])
    model = plans.model_label(auto.spec.model.model_dump(mode="json"))
    name = body.name or f"plan: {model} under {format_bytes(int(body.budget))}"
    sweep = store.create_sweep(session, name=name, base=base, axes=axes, plan=plan)
    return _verdict(session, settings, sweep.id)


@router.get(
    "/{plan_id}",
    response_model=PlanPublic,
    responses=NOT_FOUND,
    dependencies=[ComputedReadDep],
    summary="A plan's verdict",
)
def get_plan(session: SessionDep, settings: SettingsDep, plan_id: SweepId) -> PlanPublic:
    """Every point with its peak, step time and overhead (its paired overhead over the
    un-checkpointed copy it was timed with, where its timing was paired), whether it fits
    the budget, the front of paired overhead against peak, the model, the auto run's plan
    (predicted peak beside the measured one; the planner's predicted front where it gives
    one) and the recommendation for the budget (the same one ``GET
    /api/sweeps/{id}/recommendation`` gives)."""
    return _verdict(session, settings, plan_id)
