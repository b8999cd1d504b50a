"""Sweeps: a base spec crossed with axes of values at dotted spec paths (pure planning; no
database, no process).

:func:`plan_sweep` expands ``axes`` into the cartesian product of runs (each validated with
:class:`ckptlab.spec.experiment.ExperimentSpec`; a combination that does not validate is reported, not
dropped) and adds one ``none`` baseline (``checkpoint.strategy = "none"``) for every
combination of the axes that are not checkpoint settings (paths outside ``checkpoint.``),
queued first and again after every other run, so that the step-time overheads are taken
against both and a drift of the machine's speed during the sweep shows. The backend
stores a plan with :func:`ckptlab.db.store.create_sweep` and answers a dry run
with the plan itself.
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

from ckptlab.settings import Settings
from ckptlab.spec.experiment import CheckpointSpec, ExperimentSpec
from ckptlab.spec.kinds import MODEL_KIND_TABLE, default_model_kind, model_kind_names
from ckptlab.spec.limits import limit_errors
from ckptlab.strategies import BASELINE, STRATEGIES, get_strategy

__all__ = [
    "SweepError",
    "PlannedRun",
    "SweepPlan",
    "unknown_axis_error",
    "axis_paths",
    "axis_value",
    "set_path",
    "is_checkpoint_axis",
    "axis_label",
    "canonical",
    "reads",
    "AXIS_NAMES",
    "plan_sweep",
]

CHECKPOINT_PREFIX = "checkpoint."
STRATEGY_PATH = "checkpoint.strategy"
#: The checkpoint fields a strategy may read (``Strategy.fields``); the others are reset.
CHECKPOINT_FIELDS = tuple(name for name in CheckpointSpec.model_fields if name != "strategy")
#: How the well-known axes read: path -> (short name in labels, one value, several values).
#: Served by ``GET /api/meta`` (``sweep_axes``); other paths read as their last component.
AXIS_NAMES: dict[str, tuple[str, str, str]] = {
    "checkpoint.strategy": ("strategy", "strategy", "strategies"),
    "checkpoint.segments": ("segments", "segment count", "segment counts"),
    "checkpoint.every": ("every", "group size", "group sizes"),
    "checkpoint.policy": ("policy", "policy", "policies"),
    "checkpoint.activation_memory_budget": ("budget", "activation memory budget", "activation memory budgets"),
    "checkpoint.compile_scope": ("scope", "compile scope", "compile scopes"),
    "checkpoint.preserve_rng_state": ("rng", "RNG setting", "RNG settings"),
    "checkpoint.use_reentrant": ("reentrant", "reentrant setting", "reentrant settings"),
    "amp": ("amp", "AMP mode", "AMP modes"),
    "batch_size": ("batch_size", "batch size", "batch sizes"),
    "distributed.world_size": ("ranks", "world size", "world sizes"),
    "distributed.kind": ("sharding", "sharding", "shardings"),
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
        repeat: it is the second run of a baseline, queued after every other run so that
            a drift of the machine's speed during the sweep shows (issue: "or repeat the
            baseline so drift shows").
    """

    values: dict[str, Any]
    spec: ExperimentSpec
    baseline: bool = False
    repeat: bool = False


@dataclass
class SweepPlan:
    """The expansion of a sweep request.

    Attributes:
        runs: valid runs, baselines first, then the product in axis order, then each
            baseline again (``repeat``) when the sweep has runs to compare with it.
        invalid: combinations that did not validate:
            ``{"values": {...}, "baseline": bool, "errors": [{"loc": [...], "msg": ...}]}``.
        combinations: size of the cartesian product of the axes.
        baselines: ``none`` baselines asked for (one per combination of the axes outside
            ``checkpoint.``), not counting their repeats.
        repeats: baselines queued a second time, at the end.
        duplicates: valid combinations whose spec equals an earlier run's (queued once).
    """

    runs: list[PlannedRun] = field(default_factory=list)
    invalid: list[dict[str, Any]] = field(default_factory=list)
    combinations: int = 0
    baselines: int = 0
    repeats: int = 0
    duplicates: int = 0


def axis_value(spec: ExperimentSpec, path: str, default: Any = None) -> Any:
    """The value a run's spec holds at a sweep axis's dotted ``path`` (``checkpoint.segments``,
    ``model.depth``), read through the model's attributes; ``default`` when a part is not a
    field of this run's model (a ``model.width`` axis on a transformer run).

    Args:
        spec: a validated spec.
        path: a dotted axis path (:data:`AXIS_NAMES` or a model field).
    """
    node: Any = spec
    for part in path.split("."):
        if isinstance(node, Mapping):  # a free-form field: custom options, hf config fields
            node = node.get(part, default)
        else:
            node = getattr(node, part, default)
        if node is default:
            return default
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
    return " ".join(f"{_short_name(p)}={_format_value(values.get(p))}" for p in paths)


def _short_name(path: str) -> str:
    return AXIS_NAMES[path][0] if path in AXIS_NAMES else path.rsplit(".", 1)[-1]


def _members(annotation: Any) -> tuple[list[type[BaseModel]], bool]:
    """The pydantic models an annotation may hold, and whether it is a free-form mapping."""
    args = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
    mapping = any(a is dict or get_origin(a) is dict for a in args)
    return models, mapping


def _model_kinds(base: Mapping[str, Any], axes: Mapping[str, Sequence[Any]]) -> set[str]:
    """The model kinds a sweep's runs can have (fields of other kinds are unknown)."""
    every = set(model_kind_names())
    if "model" in axes:
        return every
    if "model.kind" in axes:
        return {v for v in axes["model.kind"] if isinstance(v, str)} or every
    model = base.get("model")
    kind = model.get("kind", default_model_kind()) if isinstance(model, Mapping) else default_model_kind()
    return {kind} if kind in every else every


def axis_paths(kinds: Iterable[str] | None = None) -> tuple[list[str], list[str]]:
    """The dotted paths a sweep axis may name (every field of :class:`ExperimentSpec` and
    below; under ``model.`` the fields and ``extra_fields`` of ``kinds``, default every
    registered kind), and the free-form ones among them, below which any key is a path
    (``model.options``). :func:`unknown_axis_error` checks an axis against them; the API's
    schema lists them as the axes' names."""
    kinds = set(model_kind_names()) if kinds is None else set(kinds)
    paths, free = _fields_below([ExperimentSpec], "", kinds)
    extra = {f"model.{f}" for k in kinds & MODEL_KIND_TABLE.keys() for f in MODEL_KIND_TABLE[k].extra_fields}
    return paths + sorted(extra - set(paths)), free


def _fields_below(classes: list[type[BaseModel]], prefix: str, kinds: set[str]) -> tuple[list[str], list[str]]:
    """:func:`axis_paths` below ``prefix``: the fields of ``classes`` and theirs."""
    groups: dict[str, list[Any]] = {}
    for name, f in ((n, f) for c in classes for n, f in c.model_fields.items()):
        groups.setdefault(prefix + name, []).append(f)
    paths, free = list(groups), []
    for here, fields in groups.items():
        nested = _of_kinds(kinds) if here == "model" else _models_below(fields)
        below = ([], [here]) if nested is None else _fields_below(nested, here + ".", kinds)
        paths, free = paths + below[0], free + below[1]
    return paths, free


def unknown_axis_error(path: str, *, kinds: Iterable[str] | None = None) -> str | None:
    """Why ``path`` names no field of :class:`ExperimentSpec` (a message naming its first
    unknown part), or None when it does: it is one of :func:`axis_paths` for ``kinds``
    (default: every registered kind) or lies below a free-form one (any key below options
    is the factory's business)."""
    kinds = set(model_kind_names()) if kinds is None else set(kinds)
    paths, free = axis_paths(kinds)
    parts = path.split(".")
    for i in range(len(parts)):
        here = ".".join(parts[: i + 1])
        if here in free:
            return None
        if here not in paths:
            suffix = f" for model kind {', '.join(sorted(kinds))}" if i and parts[0] == "model" else ""
            return f"unknown spec field {here!r}{suffix}"
    return None


def _models_below(fields: list[Any]) -> list[type[BaseModel]] | None:
    """The pydantic models ``fields`` may hold, or None when one is a free-form mapping."""
    nested: list[type[BaseModel]] = []
    for f in fields:
        models, mapping = _members(f.annotation)
        if mapping:
            return None
        nested += models
    return nested


def _of_kinds(kinds: Iterable[str]) -> list[type[BaseModel]]:
    """The spec classes of the registered kinds among ``kinds`` (every registered kind's when none is)."""
    known = [MODEL_KIND_TABLE[k].spec for k in kinds if k in MODEL_KIND_TABLE]
    return known or [MODEL_KIND_TABLE[k].spec for k in model_kind_names()]


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
    return canonical(spec), []


def canonical(spec: ExperimentSpec) -> ExperimentSpec:
    """``spec`` with the checkpoint fields its strategy does not read (the strategy table's
    ``fields``) at their defaults: two settings that run the same (``per_block`` with
    segments 2 or 4) are one spec, so a sweep queues it once."""
    strategy = get_strategy(spec.checkpoint.strategy)
    defaults = CheckpointSpec()
    reset = {f: getattr(defaults, f) for f in CHECKPOINT_FIELDS if f not in strategy.fields}
    return spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(update=reset)})


def reads(strategy: str | None, path: str) -> bool:
    """Whether a run of ``strategy`` reads the checkpoint field at ``path`` (True for paths
    outside ``checkpoint.``, for ``checkpoint.strategy`` and for unknown strategies)."""
    if not is_checkpoint_axis(path) or path == STRATEGY_PATH or strategy not in STRATEGIES:
        return True
    return path[len(CHECKPOINT_PREFIX) :] in STRATEGIES[strategy].fields


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
    _check_axes(base, axes)
    paths = list(axes)
    other = [p for p in paths if not is_checkpoint_axis(p)]
    combinations = math.prod(len(axes[p]) for p in paths)
    baselines = math.prod(len(axes[p]) for p in other)
    _check_size(combinations, baselines, max_size)
    expansion = _Expansion(base, settings, SweepPlan(combinations=combinations, baselines=baselines))
    expansion.add_product(axes, other, baseline=True)
    if not any(expansion.add_product(axes, paths, baseline=False)):
        examples = [e for e in expansion.plan.invalid if not e["baseline"]][:5]
        raise SweepError(_no_valid_errors(examples, combinations, paths))
    _repeat_baselines(expansion.plan)
    return expansion.plan


def _check_axes(base: Mapping[str, Any], axes: Mapping[str, Sequence[Any]]) -> None:
    """Raise :class:`SweepError` for every axis that names no spec field or repeats a value."""
    kinds = _model_kinds(base, axes)
    errors = [e for path, values in axes.items() for e in _axis_errors(path, values, kinds)]
    if errors:
        raise SweepError(errors)


def _axis_errors(path: str, values: Sequence[Any], kinds: set[str]) -> list[dict[str, Any]]:
    """The errors of one axis: an unknown spec field, a repeated value."""
    errors = []
    msg = unknown_axis_error(path, kinds=kinds)
    if msg:
        errors.append({"loc": ["axes", path], "msg": msg, "type": "unknown_axis"})
    canon = [json.dumps(v, sort_keys=True) for v in values]
    if len(set(canon)) != len(canon):
        errors.append({"loc": ["axes", path], "msg": f"axis {path!r} repeats a value", "type": "duplicate_value"})
    return errors


def _check_size(combinations: int, baselines: int, max_size: int) -> None:
    """Raise :class:`SweepError` when the runs and the baselines (each queued twice) are over
    ``max_size``."""
    if combinations + 2 * baselines > max_size:
        msg = (
            f"the sweep would queue {combinations} runs and {baselines} baselines (each run twice), "
            f"over this server's limit of {max_size}"
        )
        raise SweepError([{"loc": ["axes"], "msg": msg, "type": "sweep_too_large"}])


@dataclass
class _Expansion:
    """A plan being filled: each combination validated from ``base``, each spec queued once."""

    base: Mapping[str, Any]
    settings: Settings | None
    plan: SweepPlan
    seen: set[str] = field(default_factory=set)

    def add_product(self, axes: Mapping[str, Sequence[Any]], paths: list[str], *, baseline: bool) -> list[bool]:
        """Add every combination of the values of ``paths`` (a baseline's with strategy
        ``none``), in product order; returns whether each validated."""
        extra = {STRATEGY_PATH: BASELINE} if baseline else {}
        combos = itertools.product(*(axes[p] for p in paths))
        return [self.add({**dict(zip(paths, combo, strict=True)), **extra}, baseline) for combo in combos]

    def add(self, values: dict[str, Any], baseline: bool) -> bool:
        """Validate one combination; queue it unless the plan holds the same spec already.
        Returns whether it validated."""
        data = copy.deepcopy(dict(self.base))
        for p, v in values.items():
            set_path(data, p, copy.deepcopy(v))
        spec, errs = _validate(data, self.settings)
        if spec is None:
            self.plan.invalid.append({"values": values, "baseline": baseline, "errors": errs})
            return False
        key = json.dumps(spec.model_dump(mode="json"), sort_keys=True)
        if key in self.seen:  # e.g. a run with strategy "none" is its own baseline
            self.plan.duplicates += 1
        else:
            self.seen.add(key)
            self.plan.runs.append(PlannedRun(values=values, spec=spec, baseline=baseline))
        return True


def _repeat_baselines(plan: SweepPlan) -> None:
    """Queue every baseline again at the end when the plan has runs to compare with them."""
    if any(not r.baseline for r in plan.runs):  # something to compare: time the baselines again last
        firsts = [r for r in plan.runs if r.baseline]
        repeats = [PlannedRun(values=r.values, spec=r.spec, baseline=True, repeat=True) for r in firsts]
        plan.runs.extend(repeats)
        plan.repeats = len(repeats)


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
