"""Sweeps: a base spec crossed with axes of values at dotted spec paths.

:func:`plan_sweep` expands ``axes`` into the cartesian product of runs (each validated with
:class:`ckptlab.spec.ExperimentSpec`; a combination that does not validate is reported, not
dropped) and adds one ``none`` baseline (``checkpoint.strategy = "none"``) for every
combination of the axes that are not checkpoint settings (paths outside ``checkpoint.``).
:func:`create_sweep` stores the plan in one transaction; :func:`sweep_rows` turns a stored
sweep into one row per experiment with its axis values, its baseline and the summary
metrics the charts and exports use.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from ckptlab.db.models import FINISHED_STATUSES, STATUSES, Experiment, Sweep, utcnow
from ckptlab.limits import limit_errors
from ckptlab.settings import Settings
from ckptlab.spec import MODEL_KINDS, ExperimentSpec

__all__ = [
    "SweepError",
    "PlannedRun",
    "SweepPlan",
    "Progress",
    "SweepRow",
    "unknown_axis_error",
    "get_path",
    "set_path",
    "is_checkpoint_axis",
    "axis_label",
    "plan_sweep",
    "create_sweep",
    "get_sweep",
    "list_sweeps",
    "sweep_progress",
    "sweep_rows",
]

CHECKPOINT_PREFIX = "checkpoint."
_SHORT_NAMES = {
    "checkpoint.preserve_rng_state": "rng",
    "checkpoint.use_reentrant": "reentrant",
    "checkpoint.segments": "segments",
    "checkpoint.strategy": "strategy",
    "checkpoint.every": "every",
    "checkpoint.policy": "policy",
}


class SweepError(ValueError):
    """A sweep request that cannot be planned.

    Attributes:
        errors: FastAPI-style validation errors (``loc`` relative to the request body's
            fields, e.g. ``["axes", "checkpoint.segmnts"]``) naming what to fix.
    """

    def __init__(self, errors: list[dict[str, Any]]):
        super().__init__("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors))
        self.errors = errors


@dataclass(frozen=True)
class PlannedRun:
    """One experiment of a sweep plan.

    Attributes:
        values: the axis values of this run (dotted path -> value).
        spec: the validated spec.
        baseline: it is the ``none`` baseline of its non-checkpoint axis values.
    """

    values: dict[str, Any]
    spec: ExperimentSpec
    baseline: bool = False


@dataclass
class SweepPlan:
    """The expansion of a sweep request.

    Attributes:
        runs: valid runs, baselines first, then the product in axis order.
        invalid: combinations that did not validate:
            ``{"values": {...}, "baseline": bool, "errors": [{"loc": [...], "msg": ...}]}``.
        combinations: size of the cartesian product of the axes.
    """

    runs: list[PlannedRun] = field(default_factory=list)
    invalid: list[dict[str, Any]] = field(default_factory=list)
    combinations: int = 0


@dataclass(frozen=True)
class Progress:
    """How far a sweep has got.

    Attributes:
        total: experiments in the sweep.
        finished: those in a finished status (succeeded, failed, oom, timed_out, cancelled).
        counts: experiments per status (every status present, zeros included).
    """

    total: int
    finished: int
    counts: dict[str, int]

    @property
    def done(self) -> bool:
        """Every experiment has finished."""
        return self.finished >= self.total


def get_path(data: Mapping[str, Any], path: str, default: Any = None) -> Any:
    """The value at dotted ``path`` in nested dicts, or ``default`` when a part is missing."""
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def set_path(data: dict[str, Any], path: str, value: Any) -> None:
    """Set dotted ``path`` in nested dicts to ``value`` in place, creating missing dicts."""
    *parents, leaf = path.split(".")
    node = data
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[leaf] = value


def is_checkpoint_axis(path: str) -> bool:
    """Whether an axis changes the checkpointing setting (``checkpoint`` or ``checkpoint.*``)."""
    return path == CHECKPOINT_PREFIX.rstrip(".") or path.startswith(CHECKPOINT_PREFIX)


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "-"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return str(value)


def axis_label(values: Mapping[str, Any], paths: Iterable[str] | None = None) -> str:
    """A short label such as ``rng=on amp=off`` for axis values.

    Args:
        values: dotted path -> value.
        paths: which paths to show, in order (default: all of ``values``).

    Returns:
        ``name=value`` pairs joined by spaces; booleans read on/off; well-known checkpoint
        paths get short names (``checkpoint.preserve_rng_state`` -> ``rng``), others their
        last component. Empty string when there is nothing to show.
    """
    paths = list(values) if paths is None else list(paths)
    return " ".join(f"{_SHORT_NAMES.get(p, p.rsplit('.', 1)[-1])}={_format_value(values.get(p))}" for p in paths)


def _members(annotation: Any) -> tuple[list[type[BaseModel]], bool]:
    """The pydantic models an annotation may hold, and whether it is a free-form mapping."""
    args = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
    mapping = any(a is dict or get_origin(a) is dict for a in args)
    return models, mapping


def _model_kinds(base: Mapping[str, Any], axes: Mapping[str, Sequence[Any]]) -> set[str]:
    """The model kinds a sweep's runs can have (fields of other kinds are unknown)."""
    if "model" in axes:
        return set(MODEL_KINDS)
    if "model.kind" in axes:
        return {v for v in axes["model.kind"] if isinstance(v, str)} or set(MODEL_KINDS)
    kind = get_path(base, "model.kind", "mlp")
    return {kind} if kind in MODEL_KINDS else set(MODEL_KINDS)


def unknown_axis_error(path: str, *, kinds: Iterable[str] = MODEL_KINDS) -> str | None:
    """Why ``path`` names no field of :class:`ExperimentSpec`, or None when it does.

    Args:
        path: dotted spec path, e.g. ``checkpoint.segments`` or ``model.depth``.
        kinds: model kinds whose fields count under ``model.`` (default: every kind).

    Returns:
        An error message naming the first unknown part, or None.
    """
    classes: list[type[BaseModel]] = [ExperimentSpec]
    parts = path.split(".")
    for i, part in enumerate(parts):
        here = ".".join(parts[: i + 1])
        fields = [c.model_fields[part] for c in classes if part in c.model_fields]
        if not fields:
            suffix = f" for model kind {', '.join(sorted(kinds))}" if i and parts[0] == "model" else ""
            return f"unknown spec field {here!r}{suffix}"
        if i == len(parts) - 1:
            return None
        nested: list[type[BaseModel]] = []
        for f in fields:
            models, mapping = _members(f.annotation)
            if mapping:
                return None  # free-form options: any key below is the factory's business
            nested += models
        if here == "model":
            nested = [m for m in nested if m.model_fields["kind"].default in set(kinds)] or nested
        if not nested:
            return f"spec field {here!r} has no fields below it"
        classes = nested
    return None


def _errors_of(exc: ValidationError) -> list[dict[str, Any]]:
    return [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors(include_url=False)]


def _validate(data: dict[str, Any], settings: Settings | None) -> tuple[ExperimentSpec | None, list[dict[str, Any]]]:
    try:
        spec = ExperimentSpec.model_validate(data)
    except ValidationError as exc:
        return None, _errors_of(exc)
    if settings is not None:
        errors = limit_errors(spec, settings, loc=())
        if errors:
            return None, [{"loc": e["loc"], "msg": e["msg"], "type": e["type"]} for e in errors]
    return spec, []


def plan_sweep(
    base: Mapping[str, Any],
    axes: Mapping[str, Sequence[Any]],
    *,
    max_size: int = 256,
    settings: Settings | None = None,
) -> SweepPlan:
    """Expand a sweep request into validated runs and reported invalid combinations.

    Args:
        base: the spec every run starts from (JSON dict; need not be valid by itself).
        axes: dotted spec path -> list of values; the runs are their cartesian product.
        max_size: most runs (baselines included) the plan may hold. Default 256.
        settings: when given, each run is also checked against its limits (steps, batch
            size, parameter count); a run over a limit is reported as invalid.

    Returns:
        The plan: valid runs (baselines first) and invalid combinations with their errors.

    Raises:
        SweepError: an axis names no spec field, an axis repeats a value, the product is
            larger than ``max_size``, or no combination is valid.
    """
    kinds = _model_kinds(base, axes)
    errors = []
    for path, values in axes.items():
        msg = unknown_axis_error(path, kinds=kinds)
        if msg:
            errors.append({"loc": ["axes", path], "msg": msg, "type": "unknown_axis"})
        canon = [json.dumps(v, sort_keys=True) for v in values]
        if len(set(canon)) != len(canon):
            errors.append({"loc": ["axes", path], "msg": f"axis {path!r} repeats a value", "type": "duplicate_value"})
    if errors:
        raise SweepError(errors)

    paths = list(axes)
    other = [p for p in paths if not is_checkpoint_axis(p)]
    combinations = math.prod(len(axes[p]) for p in paths)
    baselines = math.prod(len(axes[p]) for p in other)
    if combinations + baselines > max_size:
        raise SweepError(
            [
                {
                    "loc": ["axes"],
                    "msg": f"the sweep would queue {combinations} runs and {baselines} baselines, "
                    f"over this server's limit of {max_size}",
                    "type": "sweep_too_large",
                }
            ]
        )

    plan = SweepPlan(combinations=combinations)
    seen: set[str] = set()

    def add(values: dict[str, Any], baseline: bool) -> bool:
        """Validate one combination; queue it unless the plan holds the same spec already."""
        data = copy.deepcopy(dict(base))
        for p, v in values.items():
            set_path(data, p, copy.deepcopy(v))
        spec, errs = _validate(data, settings)
        if spec is None:
            plan.invalid.append({"values": values, "baseline": baseline, "errors": errs})
            return False
        key = json.dumps(spec.model_dump(mode="json"), sort_keys=True)
        if key not in seen:  # e.g. a run with strategy "none" is its own baseline
            seen.add(key)
            plan.runs.append(PlannedRun(values=values, spec=spec, baseline=baseline))
        return True

    for combo in itertools.product(*(axes[p] for p in other)):
        add({**dict(zip(other, combo, strict=True)), "checkpoint.strategy": "none"}, True)
    valid = [add(dict(zip(paths, combo, strict=True)), False) for combo in itertools.product(*(axes[p] for p in paths))]
    if not any(valid):
        examples = [e for e in plan.invalid if not e["baseline"]][:5]
        raise SweepError(_no_valid_errors(examples, combinations, paths))
    return plan


def _no_valid_errors(examples: list[dict[str, Any]], combinations: int, paths: list[str]) -> list[dict[str, Any]]:
    """422 errors for a sweep with no valid run: each distinct error, located at the axis
    that set the field, else in ``base``."""
    out: list[dict[str, Any]] = []
    seen = set()
    for ex in examples:
        for e in ex["errors"]:
            key = (tuple(e["loc"]), e["msg"])
            if key in seen:
                continue
            seen.add(key)
            dotted = ".".join(map(str, e["loc"]))
            axis = next((p for p in paths if dotted == p or dotted.startswith(p + ".")), None)
            out.append(
                {
                    "loc": ["axes", axis] if axis else ["base", *e["loc"]],
                    "msg": f"no valid combination among {combinations}: {e['msg']} (e.g. with {ex['values']})",
                    "type": "no_valid_combination",
                }
            )
    return out or [{"loc": ["axes"], "msg": "no valid combination", "type": "no_valid_combination"}]


def create_sweep(
    session: Session, *, name: str, base: Mapping[str, Any], axes: Mapping[str, Sequence[Any]], plan: SweepPlan
) -> Sweep:
    """Store a sweep and queue its runs (baselines first) in one transaction.

    Args:
        name: the sweep's name.
        base: the base spec as submitted.
        axes: the axes as submitted.
        plan: the result of :func:`plan_sweep` for ``base`` and ``axes``.

    Returns:
        The stored sweep (committed), its experiments loaded.
    """
    now = utcnow()
    sweep = Sweep(name=name, base=dict(base), axes=dict(axes), invalid=plan.invalid, created_at=now, cancelled=False)
    sweep.experiments = [
        Experiment(
            spec=run.spec.model_dump(mode="json"),
            model_kind=run.spec.model.kind,
            strategy=run.spec.checkpoint.strategy,
            status="queued",
            created_at=now,
            attempt=0,
        )
        for run in plan.runs
    ]
    session.add(sweep)
    session.commit()
    return sweep


def get_sweep(session: Session, *, sweep_id: int) -> Sweep | None:
    """One sweep with its experiments (by id), or None."""
    return session.scalars(
        select(Sweep)
        .where(Sweep.id == sweep_id)
        .options(selectinload(Sweep.experiments))
        .execution_options(populate_existing=True)
    ).first()


def sweep_progress(session: Session, *, sweep_ids: Sequence[int]) -> dict[int, Progress]:
    """Progress of each sweep in ``sweep_ids`` (one grouped count query).

    Returns:
        sweep id -> :class:`Progress` (sweeps without experiments get a zero total).
    """
    counts: dict[int, dict[str, int]] = {sid: dict.fromkeys(STATUSES, 0) for sid in sweep_ids}
    if sweep_ids:
        rows = session.execute(
            select(Experiment.sweep_id, Experiment.status, func.count())
            .where(Experiment.sweep_id.in_(sweep_ids))
            .group_by(Experiment.sweep_id, Experiment.status)
        ).all()
        for sid, status, n in rows:
            counts[sid][status] = counts[sid].get(status, 0) + n
    return {
        sid: Progress(total=sum(c.values()), finished=sum(n for s, n in c.items() if s in FINISHED_STATUSES), counts=c)
        for sid, c in counts.items()
    }


def list_sweeps(session: Session, *, offset: int = 0, limit: int = 100) -> tuple[list[Sweep], int]:
    """Sweeps, newest first, and the total count.

    Args:
        offset: sweeps to skip (default 0).
        limit: most sweeps to return (default 100).
    """
    rows = session.scalars(select(Sweep).order_by(Sweep.id.desc()).offset(offset).limit(limit)).all()
    return list(rows), session.scalar(select(func.count()).select_from(Sweep)) or 0


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


#: Summary keys copied into :class:`SweepRow` metrics when they are finite numbers.
ROW_METRICS = (
    "activation_bytes",
    "peak_allocated_bytes",
    "recompute_peak_bytes",
    "step_time_ms",
    "forward_ms",
    "backward_ms",
    "optimizer_ms",
    "grad_max_abs_diff",
    "loss_diff",
    "final_loss",
)


@dataclass
class SweepRow:
    """One experiment of a sweep, as the charts and exports see it.

    Attributes:
        experiment_id: the experiment.
        status: its status.
        role: ``baseline`` (``checkpoint.strategy`` is ``none``) or ``run``.
        values: axis path -> value (checkpoint axes are None for baselines, except
            ``checkpoint.strategy``).
        group: the values of the non-checkpoint axes (which baseline applies).
        baseline_id: the experiment id of the matching baseline, or None.
        metrics: numbers from the summary (:data:`ROW_METRICS`; missing keys are None) plus
            ``overhead_pct`` (step time over the baseline's, %) and
            ``activation_saving_pct`` (activation bytes saved against the baseline, %).
        gradients_match: the summary's ``gradients_match`` (None when not verified).
        error: the error text's first line, or None.
        label: ``axis_label`` of the values (e.g. ``segments=2 rng=on amp=off``).
    """

    experiment_id: int
    status: str
    role: str
    values: dict[str, Any]
    group: dict[str, Any]
    baseline_id: int | None
    metrics: dict[str, float | None]
    gradients_match: bool | None
    error: str | None
    label: str


def _group_key(values: Mapping[str, Any]) -> str:
    return json.dumps(values, sort_keys=True, default=str)


def sweep_rows(sweep: Sweep) -> list[SweepRow]:
    """One :class:`SweepRow` per experiment of ``sweep`` (in id order), baselines matched.

    Robust to summaries that lack keys or hold non-numbers (those metrics are None).
    """
    paths = list(sweep.axes or {})
    other = [p for p in paths if not is_checkpoint_axis(p)]
    rows: list[SweepRow] = []
    for exp in sorted(sweep.experiments, key=lambda e: e.id):
        spec = exp.spec or {}
        baseline = get_path(spec, "checkpoint.strategy") == "none"
        values = {
            p: (None if baseline and is_checkpoint_axis(p) and p != "checkpoint.strategy" else get_path(spec, p))
            for p in paths
        }
        summary = exp.summary if isinstance(exp.summary, dict) else {}
        metrics = {k: _number(summary.get(k)) for k in ROW_METRICS}
        gm = summary.get("gradients_match")
        rows.append(
            SweepRow(
                experiment_id=exp.id,
                status=exp.status,
                role="baseline" if baseline else "run",
                values=values,
                group={p: values[p] for p in other},
                baseline_id=None,
                metrics=metrics,
                gradients_match=gm if isinstance(gm, bool) else None,
                error=exp.error.splitlines()[0] if exp.error else None,
                label=axis_label(values, [p for p in paths if not (baseline and values[p] is None)]) or "base",
            )
        )
    baselines: dict[str, SweepRow] = {}
    for r in rows:
        if r.role == "baseline":
            key = _group_key(r.group)
            # Prefer a succeeded baseline when the group has several.
            if key not in baselines or (baselines[key].status != "succeeded" and r.status == "succeeded"):
                baselines[key] = r
    for r in rows:
        b = baselines.get(_group_key(r.group))
        r.baseline_id = b.experiment_id if b else None
        t, bt = r.metrics["step_time_ms"], b.metrics["step_time_ms"] if b else None
        a, ba = r.metrics["activation_bytes"], b.metrics["activation_bytes"] if b else None
        r.metrics["overhead_pct"] = 100.0 * (t / bt - 1.0) if t is not None and bt else None
        r.metrics["activation_saving_pct"] = 100.0 * (1.0 - a / ba) if a is not None and ba else None
    return rows
