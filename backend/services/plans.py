"""Plans for a memory budget (``/api/plans``): a sweep that runs strategy ``auto`` for the
budget beside the comparison points a user needs, and its verdict.

A plan is stored as a sweep (its runs, progress, charts and streams are the sweep's): the
base spec with ``checkpoint: {strategy: auto, budget_bytes}``, and the axes
``checkpoint.strategy`` (``auto``, ``per_block``, ``sequential``) and
``checkpoint.segments`` (powers of two up to the depth, and the depth), and the compiler's
own budget (``compile_budget`` at each ``checkpoint.activation_memory_budget`` asked for;
1.0, the default partition, is their time baseline). Strategies that do
not read segments are queued once (:func:`ckptlab.spec.sweeps.canonical`); the ``none`` baseline
is the sweep's own. A sweep is a plan when it holds an ``auto`` run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ckptlab.backend.services.charts import pareto_frontier
from ckptlab.backend.services.recommend import Recommendation, recommend
from ckptlab.backend.services.sweeps import SweepRow, sweep_rows
from ckptlab.db.models import Sweep
from ckptlab.domain import Status
from ckptlab.strategies import BASELINE, STRATEGIES

__all__ = ["plan_request", "PlanVerdict", "plan_verdict", "PLANNED", "COMPARED", "COMPILED"]

#: The planned strategy (the table's one ``planned`` entry).
PLANNED = next(name for name, s in STRATEGIES.items() if s.planned)
#: The strategies a plan compares it with, besides the baseline: every recompute-only one
#: without a policy (per_block, sequential), simplest first.
COMPARED = [
    name
    for name in sorted(STRATEGIES, key=lambda n: STRATEGIES[n].rank)
    if name not in (BASELINE, PLANNED) and STRATEGIES[name].recomputes and "policy" not in STRATEGIES[name].fields
]

#: The strategies that run under torch.compile with its own budget (compile_budget).
COMPILED = [name for name in sorted(STRATEGIES, key=lambda n: STRATEGIES[n].rank) if STRATEGIES[name].compiles]


def _segment_counts(depth: int) -> list[int]:
    """2, 4, 8, ... up to ``depth``, and ``depth``: the uniform splits worth trying."""
    counts, k = [], 2
    while k < depth:
        counts.append(k)
        k *= 2
    return [*counts, depth] if depth > 1 else [1]


def plan_request(
    base: Mapping[str, Any], budget_bytes: int, *, compile_budgets: Sequence[float] = ()
) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """The sweep (base spec, axes) of a plan for ``budget_bytes``.

    Without a depth (``model.depth`` or an hf ``num_hidden_layers``) there is no uniform
    split to try, and only the strategies that need no segment count are compared.
    ``compile_budgets``: the ``activation_memory_budget`` values of the torch.compile
    points (none: no such point).
    """
    compiled: dict[str, list[Any]] = (
        {"checkpoint.activation_memory_budget": list(dict.fromkeys(compile_budgets))} if compile_budgets else {}
    )
    extra = COMPILED if compile_budgets else []
    model = base.get("model") or {}
    depth = model.get("depth") if isinstance(model, Mapping) else None
    if depth is None and isinstance(model, Mapping):
        depth = model.get("num_hidden_layers")
    spec = {**base, "checkpoint": {**(base.get("checkpoint") or {}), "strategy": PLANNED, "budget_bytes": budget_bytes}}
    if isinstance(depth, int) and depth >= 1:
        axes = {"checkpoint.strategy": [PLANNED, *COMPARED, *extra], "checkpoint.segments": _segment_counts(depth)}
        return spec, {**axes, **compiled}
    # No depth to split by (an hf ResNet's stages): the strategies that need no segment count.
    kept = [c for c in COMPARED if "segments" not in STRATEGIES[c].fields]
    return spec, {"checkpoint.strategy": [PLANNED, *kept, *extra], **compiled}


@dataclass
class PlanPoint:
    """One run of a plan: what it cost and whether it fits the budget."""

    experiment_id: int
    label: str
    strategy: str
    status: str
    peak_allocated_bytes: int | None
    step_time_ms: float | None
    overhead_text: str | None
    fits: bool | None
    gradients_match: bool | None = None
    on_front: bool = False
    predicted_peak_bytes: int | None = None


@dataclass
class PlanVerdict:
    """``GET /api/plans/{id}``: the budget, each point, the time-vs-peak front and the pick."""

    sweep_id: int
    name: str
    budget_bytes: int
    finished: bool
    points: list[PlanPoint] = field(default_factory=list)
    plan: dict[str, Any] | None = None
    recommendation: Recommendation | None = None


def _budget(sweep: Sweep) -> int | None:
    """The budget (bytes) of the sweep's planned run, or None when it has none."""
    for exp in sweep.experiments:
        spec = exp.experiment_spec
        if spec is not None and spec.checkpoint.strategy == PLANNED and spec.checkpoint.budget_bytes is not None:
            return spec.checkpoint.budget_bytes
    return None


def plan_verdict(sweep: Sweep, *, noise_threshold_pct: float) -> PlanVerdict | None:
    """The verdict of the plan stored as ``sweep``; None when the sweep holds no ``auto`` run."""
    budget = _budget(sweep)
    if budget is None:
        return None
    rows: Sequence[SweepRow] = sweep_rows(sweep, noise_threshold_pct=noise_threshold_pct)
    firsts = [r for r in rows if r.repeat_of is None]
    points = []
    for r in firsts:
        peak = r.metrics.get("peak_allocated_bytes")
        points.append(
            PlanPoint(
                experiment_id=r.experiment_id,
                label=r.label,
                strategy=r.strategy,
                status=r.status,
                peak_allocated_bytes=int(peak) if peak is not None else None,
                step_time_ms=r.metrics.get("step_time_ms"),
                overhead_text=r.overhead_text,
                fits=None if peak is None else peak <= budget,
                gradients_match=r.gradients_match,
            )
        )
    done = [i for i, p in enumerate(points) if p.peak_allocated_bytes is not None and p.step_time_ms is not None]
    for i in pareto_frontier([(points[i].step_time_ms, points[i].peak_allocated_bytes) for i in done]):
        points[done[i]].on_front = True
    plan = None
    for exp in sweep.experiments:
        if exp.strategy == PLANNED and exp.status == Status.SUCCEEDED:
            summary = exp.run_summary
            plan = summary.plan
            for p in points:
                if p.experiment_id == exp.id:
                    p.predicted_peak_bytes = summary.predicted_peak_bytes
    finished = all(Status(r.status).finished for r in rows)
    return PlanVerdict(
        sweep_id=sweep.id,
        name=sweep.name,
        budget_bytes=budget,
        finished=finished,
        points=points,
        plan=plan,
        recommendation=recommend(rows, budget_bytes=budget),
    )
