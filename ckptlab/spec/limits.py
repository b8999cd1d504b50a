"""Limits on what one request may ask a worker to do, checked from the spec alone.

The backend never imports torch, so the parameter count of a spec is the model kind's
``count_parameters`` (the model-kind table, :mod:`ckptlab.spec.kinds`; a test checks it
against the models the worker builds), and with it the fixed memory of training: parameters,
gradients and optimizer state. Each kind's own admission check (an entry point installed, a
target allowed, torchvision importable) is its entry's ``check``.
"""

from __future__ import annotations

from typing import Any

from ckptlab.settings import Settings
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.spec.kinds import MODEL_KIND_TABLE

__all__ = ["estimate_param_count", "estimate_fixed_bytes", "limit_errors"]

#: Bytes per parameter of an fp32 parameter and of its gradient (autocast keeps fp32 weights).
PARAM_BYTES = 4
#: fp32 optimizer-state tensors per parameter: Adam / AdamW keep ``exp_avg`` and
#: ``exp_avg_sq``; plain SGD (no momentum, as the engine builds it) keeps none.
OPTIMIZER_STATES_PER_PARAM = {"adam": 2, "adamw": 2, "sgd": 0}


def estimate_param_count(spec: ExperimentSpec) -> int | None:
    """Number of trainable parameters the worker will build for ``spec`` (pure arithmetic).

    Args:
        spec: a validated experiment spec.

    Returns:
        The model kind's ``count_parameters`` of the model (exact for the built-in kinds), or
        None for a kind whose entry has none (its ``uncounted`` says why: ``custom`` and
        ``python``, whose code the API never loads, and ``torchvision``) or that is no longer
        registered.
    """
    entry = MODEL_KIND_TABLE.get(spec.model.kind)
    counter = entry.count_parameters if entry else None
    return counter(spec.model) if counter else None


def estimate_fixed_bytes(spec: ExperimentSpec) -> int | None:
    """Bytes training holds whatever is checkpointed: parameters + gradients + optimizer state.

    ``params × 4 B × (2 + k)`` with ``k`` the optimizer's fp32 state tensors per parameter
    (:data:`OPTIMIZER_STATES_PER_PARAM`, after ``torch.optim.Adam``'s ``exp_avg`` and
    ``exp_avg_sq``). Buffers, Adam's scalar ``step`` tensors and activations are left out, so
    this is a lower bound on a run's memory: a spec over a worker's capacity by this figure
    cannot run there.

    Args:
        spec: a validated experiment spec.

    Returns:
        Bytes, or None where :func:`estimate_param_count` is None.
    """
    params = estimate_param_count(spec)
    if params is None:
        return None
    return params * PARAM_BYTES * (2 + OPTIMIZER_STATES_PER_PARAM[spec.optimizer])


def limit_errors(
    spec: ExperimentSpec, settings: Settings, *, loc: tuple[str | int, ...] = ("body",), allocates: bool = True
) -> list[dict]:
    """The ways ``spec`` exceeds the configured limits, as FastAPI validation errors.

    Args:
        spec: a validated experiment spec.
        settings: supplies ``max_steps``, ``max_batch_size``, ``max_world_size``, ``max_param_count`` and
            ``worker_memory_bytes`` (the capacity the fixed memory,
            :func:`estimate_fixed_bytes`, must fit in), and what the model kind's ``check``
            reads (:mod:`ckptlab.spec.model_kinds`: with ``check_model_entry_points`` an entry
            point must be installed and torchvision must import here; a python target must be
            in ``allowed_model_targets``, compared as text: nothing is imported).
        loc: prefix of each error's location (default ``("body",)``).
        allocates: False for a prediction, which runs on fake tensors and allocates no
            parameter, gradient or optimizer memory: ``max_param_count`` and the fixed-memory
            check protect a worker's memory and are skipped (a prediction's own bounds are
            ``prediction_memory_bytes`` and ``prediction_timeout_s``); the step, batch and
            model-kind checks apply as for a run.

    Returns:
        A list of ``{"type": "limit", "loc": [...], "msg": ..., "input": ...}`` dicts, empty
        when the spec is within every limit.
    """
    errors: list[dict[str, Any]] = []

    def err(path: tuple[str, ...], value: Any, msg: str) -> None:
        errors.append({"type": "limit", "loc": [*loc, *path], "msg": msg, "input": value})

    if spec.steps > settings.max_steps:
        err(("steps",), spec.steps, f"steps ({spec.steps}) exceeds this server's limit of {settings.max_steps}")
    if spec.steps + spec.timed_steps > settings.max_steps:
        total = spec.steps + spec.timed_steps
        err(
            ("timed_steps",),
            spec.timed_steps,
            f"steps + timed_steps ({total}) exceeds this server's limit of {settings.max_steps}",
        )
    if spec.batch_size > settings.max_batch_size:
        err(
            ("batch_size",),
            spec.batch_size,
            f"batch_size ({spec.batch_size}) exceeds this server's limit of {settings.max_batch_size}",
        )
    entry = MODEL_KIND_TABLE.get(spec.model.kind)
    if entry is not None and entry.check is not None:
        for field, value, msg in entry.check(spec.model, settings):
            err(("model", field), value, msg)
    if not allocates:
        return errors
    world = spec.distributed.world_size
    if world > settings.max_world_size:
        err(
            ("distributed", "world_size"),
            world,
            f"world_size ({world}) exceeds this server's limit of {settings.max_world_size} ranks "
            "(CKPTLAB_MAX_WORLD_SIZE: each rank is a process of the worker's host)",
        )
    params = estimate_param_count(spec)
    if params is not None and params > settings.max_param_count:
        err(
            ("model",),
            spec.model.kind,
            f"the model has {params:,} parameters, over this server's limit of {settings.max_param_count:,}",
        )
    fixed = estimate_fixed_bytes(spec)
    if fixed is not None and fixed > settings.worker_memory_bytes:
        err(
            ("model",),
            spec.model.kind,
            f"parameters, gradients and {spec.optimizer} state alone need about {_gib(fixed)} "
            f"({fixed:,} bytes; {params:,} parameters), over a worker's memory of "
            f"{_gib(settings.worker_memory_bytes)} (CKPTLAB_WORKER_MEMORY_BYTES); {_fixed_memory_advice(spec, params)}",
        )
    return errors


def _fixed_memory_advice(spec: ExperimentSpec, params: int) -> str:
    """What would make the fixed memory fit, true for this spec: checkpointing cannot help
    (it only drops activations); sgd helps only a run that keeps optimizer state."""
    advice = "use a smaller model (checkpointing cannot help: it only drops activations)"
    if OPTIMIZER_STATES_PER_PARAM[spec.optimizer]:
        sgd = params * PARAM_BYTES * 2
        advice += f", or sgd, which keeps no optimizer state ({_gib(sgd)} for parameters and gradients)"
    return advice


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"
