"""Limits on what one request may ask a worker to do, checked from the spec alone.

The backend never imports torch, so the parameter count of a spec is computed here from the
architectures of :mod:`worker.models` (a test checks the two agree for every built-in kind),
and with it the fixed memory of training: parameters, gradients and optimizer state.
"""

from __future__ import annotations

from typing import Any

from ckptlab.hf_params import hf_param_count
from ckptlab.settings import Settings
from ckptlab.spec import (
    MODEL_ENTRY_POINT_GROUP,
    DenseNetSpec,
    ExperimentSpec,
    HFModelSpec,
    MLPSpec,
    ResNetSpec,
    TransformerSpec,
    installed_model_names,
)
from ckptlab.spec_torchvision import torchvision_problem

__all__ = ["estimate_param_count", "estimate_fixed_bytes", "limit_errors"]

#: Bytes per parameter of an fp32 parameter and of its gradient (autocast keeps fp32 weights).
PARAM_BYTES = 4
#: fp32 optimizer-state tensors per parameter: Adam / AdamW keep ``exp_avg`` and
#: ``exp_avg_sq``; plain SGD (no momentum, as the engine builds it) keeps none.
OPTIMIZER_STATES_PER_PARAM = {"adam": 2, "adamw": 2, "sgd": 0}

N_CLASSES = 10


def _mlp(m: MLPSpec) -> int:
    w = m.width
    linear = w * w + w
    return (linear if m.stem else 0) + m.depth * linear + w * N_CLASSES + N_CLASSES


def _resnet(m: ResNetSpec) -> int:
    c = m.channels

    def conv(cin: int, cout: int, k: int) -> int:  # bias=False
        return cin * cout * k * k

    def bn(ch: int) -> int:
        return 2 * ch

    stem = conv(3, c, 7) + bn(c) + conv(c, 2 * c, 3) + bn(2 * c) + conv(2 * c, 4 * c, 3) + bn(4 * c)
    block = 2 * (conv(4 * c, 4 * c, 3) + bn(4 * c))
    head = conv(4 * c, 2 * c, 3) + bn(2 * c) + conv(2 * c, c, 3) + bn(c) + conv(c, 3, 7) + 3
    return stem + m.depth * block + head


def _transformer(m: TransformerSpec) -> int:
    d = m.d_model
    embed = m.vocab_size * d + m.seq_len * d
    block = 12 * d * d + 13 * d  # 2 LayerNorms, qkv, proj, 4x MLP (all with bias)
    head = 2 * d + d * m.vocab_size  # LayerNorm + Linear without bias
    return embed + m.depth * block + head


def _densenet(m: DenseNetSpec) -> int:
    k, mid = m.growth_rate, m.bn_size * m.growth_rate
    total = 3 * 2 * k * 9  # stem Conv3x3 without bias
    for i in range(m.depth):
        cin = 2 * k + i * k
        total += 2 * cin + cin * mid + 2 * mid + mid * k * 9
    cout = 2 * k + m.depth * k
    return total + 2 * cout + cout * N_CLASSES + N_CLASSES


def _hf(m: HFModelSpec) -> int:
    return hf_param_count(m.architecture, m.config_values, m.input_size)


_COUNTERS = {"mlp": _mlp, "resnet": _resnet, "transformer": _transformer, "densenet": _densenet, "hf": _hf}


def estimate_param_count(spec: ExperimentSpec) -> int | None:
    """Number of trainable parameters the worker will build for ``spec`` (pure arithmetic).

    Args:
        spec: a validated experiment spec.

    Returns:
        The exact parameter count of the built-in models of :mod:`worker.models` (mlp,
        resnet, transformer, densenet) and of ``hf`` models (:mod:`ckptlab.hf_params`), or
        None for ``custom`` and ``python`` models, whose code the backend never loads.
    """
    counter = _COUNTERS.get(spec.model.kind)
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
        Bytes, or None for ``custom`` models (their parameters are not known to the API).
    """
    params = estimate_param_count(spec)
    if params is None:
        return None
    return params * PARAM_BYTES * (2 + OPTIMIZER_STATES_PER_PARAM[spec.optimizer])


def limit_errors(spec: ExperimentSpec, settings: Settings, *, loc: tuple[str | int, ...] = ("body",)) -> list[dict]:
    """The ways ``spec`` exceeds the configured limits, as FastAPI validation errors.

    Args:
        spec: a validated experiment spec.
        settings: supplies ``max_steps``, ``max_batch_size``, ``max_param_count`` and
            ``worker_memory_bytes`` (the capacity the fixed memory,
            :func:`estimate_fixed_bytes`, must fit in); with ``check_model_entry_points``
            a ``custom`` model must name an installed entry point and a ``torchvision``
            model needs a torchvision that imports here
            (:func:`ckptlab.spec_torchvision.torchvision_problem`); a ``python`` target must
            be in ``allowed_model_targets`` (compared as text: nothing is imported).
        loc: prefix of each error's location (default ``("body",)``).

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
    params = estimate_param_count(spec)
    if params is not None and params > settings.max_param_count:
        err(
            ("model",),
            spec.model.kind,
            f"the model has {params:,} parameters, over this server's limit of {settings.max_param_count:,}",
        )
    if spec.model.kind == "custom" and settings.check_model_entry_points:
        names = installed_model_names()
        if spec.model.name not in names:
            err(
                ("model", "name"),
                spec.model.name,
                f"no model {spec.model.name!r} is installed in entry-point group {MODEL_ENTRY_POINT_GROUP!r} "
                f"(installed: {', '.join(sorted(names)) or 'none'}); install the package that registers it "
                "(no restart needed), or set CKPTLAB_CHECK_MODEL_ENTRY_POINTS=false if the API runs "
                "without the workers' model packages",
            )
    if spec.model.kind == "torchvision" and settings.check_model_entry_points:
        problem = torchvision_problem()
        if problem:
            err(("model", "kind"), spec.model.kind, problem)
    if spec.model.kind == "python" and spec.model.target not in settings.allowed_model_targets:
        allowed = ", ".join(settings.allowed_model_targets) or "none"
        err(
            ("model", "target"),
            spec.model.target,
            f"python target {spec.model.target!r} is not allowed on this server (allowed: {allowed}); "
            "an operator allows exact names with CKPTLAB_ALLOWED_MODEL_TARGETS, or run it in your own "
            "process with `ckptlab run`",
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
