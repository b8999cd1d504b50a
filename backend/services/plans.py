"""Plans for a memory budget (``/api/plans``): a sweep that runs strategy ``auto`` for the
budget beside the comparison points a user needs, and its verdict.

A plan is stored as a sweep (its runs, progress, charts and streams are the sweep's): the
base spec with ``checkpoint: {strategy: auto, budget_bytes}``, and the axes
``checkpoint.strategy`` (``auto``, ``per_block``, ``sequential``) and
``checkpoint.segments`` (powers of two up to the depth, and the depth), and the compiler's
own budget (``compile_budget`` at each ``checkpoint.activation_memory_budget`` asked for,
paired with the eager copy like every point; ``auto`` then searches it too). Strategies that do
not read segments are queued once (:func:`ckptlab.spec.sweeps.canonical`); the ``none`` baseline
is the sweep's own. A sweep is a plan when it holds an ``auto`` run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ckptlab.backend.services.recommend import Recommendation, recommend
from ckptlab.backend.services.sweeps import SweepRow, sweep_rows
from ckptlab.db.models import Sweep
from ckptlab.domain import Status
from ckptlab.spec.kinds import MODEL_KIND_TABLE, default_model_kind
from ckptlab.strategies import BASELINE, STRATEGIES

__all__ = [
    "plan_request",
    "model_label",
    "PlanPoint",
    "PredictedPoint",
    "PlanVerdict",
    "plan_verdict",
    "predicted_front",
    "PLANNED",
    "COMPARED",
    "COMPILED",
]

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
    points (none: no such point); with them the ``auto`` point searches the compiler's
    budget too (``checkpoint.search_compile``), unless the base is a sharded run.
    """
    compiled: dict[str, list[Any]] = (
        {"checkpoint.activation_memory_budget": list(dict.fromkeys(compile_budgets))} if compile_budgets else {}
    )
    extra = COMPILED if compile_budgets else []
    model = base.get("model") or {}
    depth = model.get("depth") if isinstance(model, Mapping) else None
    if depth is None and isinstance(model, Mapping):
        depth = model.get("num_hidden_layers")
    # with compiled points, auto searches the compiler's budget too (its measured choice);
    # not in a sharded run, which compiles nothing (its compiled points are refused alone)
    distributed = base.get("distributed")
    sharded = isinstance(distributed, Mapping) and distributed.get("kind", "none") != "none"
    planned = {
        "strategy": PLANNED,
        "budget_bytes": budget_bytes,
        **({"search_compile": True} if compile_budgets and not sharded else {}),
    }
    spec = {**base, "checkpoint": {**(base.get("checkpoint") or {}), **planned}}
    if isinstance(depth, int) and depth >= 1:
        axes = {"checkpoint.strategy": [PLANNED, *COMPARED, *extra], "checkpoint.segments": _segment_counts(depth)}
        return spec, {**axes, **compiled}
    # No depth to split by (an hf ResNet's stages): the strategies that need no segment count.
    kept = [c for c in COMPARED if "segments" not in STRATEGIES[c].fields]
    return spec, {"checkpoint.strategy": [PLANNED, *kept, *extra], **compiled}


def model_label(model: Mapping[str, Any] | None) -> str:
    """The one-line description of a spec's ``model`` (``"hf gpt2 4 layers, seq 256"``,
    ``"mlp 8×64"``): its kind's label template filled in
    (:meth:`ckptlab.spec.kinds.ModelKind.label_for`); the bare kind when the table no
    longer knows it."""
    model = dict(model or {})
    kind = model.get("kind") or default_model_kind()
    entry = MODEL_KIND_TABLE.get(kind)
    return entry.label_for(model) if entry is not None else str(kind)


@dataclass
class PlanPoint:
    """One run of a plan: what it cost and whether it fits the budget.

    ``paired_overhead``: its step-time overhead over the un-checkpointed copy it was timed
    with, round by round in its own process (:meth:`SweepRow.paired_overhead`, as
    ``RatioInterval.as_dict``; ``overhead_clock`` names the clock), or None where its
    timing pass was not paired (the baseline itself, a sharded run, a copy that did not fit,
    a compiled point stored before compiled runs were paired): the only overhead the plan's
    front is drawn with. ``on_front``: no point ranked
    before it (by the high end of the overhead's CI, as the recommendation ranks) has a
    lower peak.
    ``predicted_overhead``: for the auto run, the plan's own prediction of its overhead
    (``plan.predicted_overhead``, in % with its interval) where the planner gives one."""

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
    paired_overhead: dict[str, Any] | None = None
    overhead_clock: str | None = None
    predicted_overhead: dict[str, float | None] | None = None


@dataclass
class PredictedPoint:
    """One point of the front the planner predicted (``plan.front``): for a budget, the
    peak and the step-time overhead (%, with its interval where given) of the plan it
    would choose."""

    peak_bytes: int
    overhead_pct: float | None
    overhead_low_pct: float | None = None
    overhead_high_pct: float | None = None
    budget_bytes: int | None = None


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
    model: str = ""
    predicted_front: list[PredictedPoint] = field(default_factory=list)


def _budget(sweep: Sweep) -> int | None:
    """The budget (bytes) of the sweep's planned run, or None when it has none."""
    for exp in sweep.experiments:
        spec = exp.experiment_spec
        if spec is not None and spec.checkpoint.strategy == PLANNED and spec.checkpoint.budget_bytes is not None:
            return spec.checkpoint.budget_bytes
    return None


def _number(value: Any) -> float | None:
    """``value`` as a float when it is a finite number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value or abs(value) == float("inf"):
        return None
    return float(value)


def _overhead(value: Any) -> dict[str, float | None] | None:
    """A predicted overhead as ``{estimate_pct, low_pct, high_pct}`` (%), from what the
    planner stores: a fraction of the un-checkpointed step (``0.12``), ``[estimate, low,
    high]`` fractions, ``{estimate, low, high}`` fractions, or ``{estimate_pct, low_pct,
    high_pct}``; None for anything else."""
    if isinstance(value, Mapping):
        if _number(value.get("estimate_pct")) is not None:
            return {k: _number(value.get(k)) for k in ("estimate_pct", "low_pct", "high_pct")}
        parts = [value.get("estimate", value.get("fraction")), value.get("low"), value.get("high")]
    elif isinstance(value, Sequence) and not isinstance(value, str):
        parts = [*list(value)[:3], None, None][:3]
    else:
        parts = [value, None, None]
    fractions = [_number(v) for v in parts]
    if fractions[0] is None:
        return None
    pct = [None if f is None else 100.0 * f for f in fractions]
    return {"estimate_pct": pct[0], "low_pct": pct[1], "high_pct": pct[2]}


def _front_point(entry: Any) -> PredictedPoint | None:
    """One entry of ``plan.front`` (``{budget_bytes, predicted_peak_bytes,
    predicted_overhead}``, or ``[budget, peak, overhead]``), or None when it has no peak."""
    if isinstance(entry, Mapping):
        budget = entry.get("budget_bytes", entry.get("budget"))
        peak = entry.get("predicted_peak_bytes", entry.get("peak_bytes"))
        raw = entry.get("predicted_overhead", entry.get("overhead"))
        if raw is None and _number(entry.get("overhead_pct")) is not None:
            raw = {k: entry.get(f"overhead_{k}") for k in ("estimate_pct", "low_pct", "high_pct")}
            raw["estimate_pct"] = entry["overhead_pct"]
    elif isinstance(entry, Sequence) and not isinstance(entry, str) and len(entry) >= 3:
        budget, peak, raw = entry[0], entry[1], entry[2]
    else:
        return None
    if _number(peak) is None:
        return None
    o = _overhead(raw) or {}
    b = _number(budget)
    return PredictedPoint(
        peak_bytes=int(peak),
        overhead_pct=o.get("estimate_pct"),
        overhead_low_pct=o.get("low_pct"),
        overhead_high_pct=o.get("high_pct"),
        budget_bytes=int(b) if b is not None else None,
    )


def predicted_front(plan: Mapping[str, Any] | None) -> list[PredictedPoint]:
    """The front the planner predicted (``plan.front``), lowest peak first; [] when the plan
    carries none."""
    raw = (plan or {}).get("front")
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        return []
    return sorted((p for p in map(_front_point, raw) if p is not None), key=lambda p: p.peak_bytes)


def _point(r: SweepRow, budget: int) -> PlanPoint:
    """A sweep row as a point of the plan: its peak, fit and overheads."""
    peak = r.metrics.get("peak_allocated_bytes")
    paired = r.paired_overhead() if r.role == "run" else None
    return PlanPoint(
        experiment_id=r.experiment_id,
        label=r.label,
        strategy=r.strategy,
        status=r.status,
        peak_allocated_bytes=int(peak) if peak is not None else None,
        step_time_ms=r.metrics.get("step_time_ms"),
        overhead_text=r.overhead_text,
        fits=None if peak is None else peak <= budget,
        gradients_match=r.gradients_match,
        paired_overhead=paired.as_dict() if paired is not None else None,
        overhead_clock=r.paired[2] if paired is not None and r.paired is not None else None,
    )


def _mark_front(points: Sequence[PlanPoint]) -> None:
    """Set ``on_front`` as the recommendation ranks (:func:`ckptlab.backend.services.recommend.order_by_overhead`):
    the measured points ordered by the high end of their paired overhead's 95% CI (the
    baseline's is 0), then peak; a point is on the front when no point before it has a lower
    peak, so the recommended point is on it. Points without a paired overhead (their times
    come from separate runs) and points whose gradients differ are not compared."""
    ranked = sorted(
        (
            (0.0 if p.strategy == BASELINE else p.paired_overhead["high_pct"], p.peak_allocated_bytes, i)
            for i, p in enumerate(points)
            if p.peak_allocated_bytes is not None
            and p.status == Status.SUCCEEDED
            and p.gradients_match is not False
            and (p.strategy == BASELINE or p.paired_overhead is not None)
        ),
    )
    lowest = float("inf")
    for _high, peak, i in ranked:
        if peak < lowest:
            points[i].on_front, lowest = True, peak


def plan_verdict(sweep: Sweep, *, noise_threshold_pct: float) -> PlanVerdict | None:
    """The verdict of the plan stored as ``sweep``; None when the sweep holds no ``auto`` run."""
    budget = _budget(sweep)
    if budget is None:
        return None
    rows: Sequence[SweepRow] = sweep_rows(sweep, noise_threshold_pct=noise_threshold_pct)
    points = [_point(r, budget) for r in rows if r.repeat_of is None]
    _mark_front(points)
    plan, model = None, None
    for exp in sweep.experiments:
        spec = exp.experiment_spec
        if exp.strategy == PLANNED and spec is not None:
            model = spec.model.model_dump(mode="json")
        if exp.strategy == PLANNED and exp.status == Status.SUCCEEDED:
            summary = exp.run_summary
            plan = summary.plan
            for p in points:
                if p.experiment_id == exp.id:
                    p.predicted_peak_bytes = summary.predicted_peak_bytes
                    p.predicted_overhead = _overhead((plan or {}).get("predicted_overhead"))
    finished = all(Status(r.status).finished for r in rows)
    return PlanVerdict(
        sweep_id=sweep.id,
        name=sweep.name,
        budget_bytes=budget,
        finished=finished,
        points=points,
        plan=plan,
        recommendation=recommend(rows, budget_bytes=budget),
        model=model_label(model if model is not None else (sweep.base or {}).get("model")),
        predicted_front=predicted_front(plan),
    )
