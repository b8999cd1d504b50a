"""Limits on what one request may ask a worker to do, checked from the spec alone.

The backend never imports torch, so the parameter count of a spec is the model kind's
``count_parameters`` (the model-kind table, :mod:`ckptlab.spec.kinds`; a test checks it
against the models the worker builds), and with it the fixed memory of training: parameters,
gradients and optimizer state. The activations are bounded from below by the kind's
``activation_floor`` (:func:`estimate_peak_floor`: an analytic lower bound of the run's peak,
stated as such, never a prediction; ``tests/ckptlab/spec/test_activation_floor.py`` checks
it against measured peaks). Each kind's own admission check (an entry point installed, a
target allowed, torchvision importable) is its entry's ``check``.

Memory is per rank: each rank of a sharded run is a process under the worker's cap, its
batch is ``batch_size``, and FSDP2 shards the parameters, gradients and optimizer state
over the ranks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ckptlab.settings import Settings
from ckptlab.spec.experiment import CheckpointSpec, ExperimentSpec
from ckptlab.spec.kinds import MODEL_KIND_TABLE, ActivationFloor
from ckptlab.strategies import BASELINE, CompileScope, Mechanism, Strategy, get_strategy

__all__ = [
    "estimate_param_count",
    "estimate_fixed_bytes",
    "estimate_activation_bytes",
    "estimate_peak_floor",
    "PeakFloor",
    "limit_errors",
]

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
    ``exp_avg_sq``), per rank (``params`` divided by ``world_size`` under FSDP2, which
    shards all three). Buffers, Adam's scalar ``step`` tensors and activations are left out,
    so this is a lower bound on a rank's memory: a spec over a worker's capacity by this
    figure cannot run there.

    Args:
        spec: a validated experiment spec.

    Returns:
        Bytes, or None where :func:`estimate_param_count` is None.
    """
    params = estimate_param_count(spec)
    if params is None:
        return None
    return _rank_params(spec, params) * PARAM_BYTES * (2 + OPTIMIZER_STATES_PER_PARAM[spec.optimizer])


def _rank_params(spec: ExperimentSpec, params: int) -> int:
    """Parameters one rank holds: FSDP2 shards each over the ranks (``ceil(params /
    world_size)`` at least: shards are padded to whole rows), DDP and one process hold all."""
    if spec.distributed.kind == "fsdp2":
        return -(-params // spec.distributed.world_size)
    return params


#: Bytes of an activation element under autocast (``amp`` fp16 or bf16).
HALF_BYTES = 2


def _model_floor(spec: ExperimentSpec) -> ActivationFloor | None:
    """The model kind's activation floor per sample at the spec's precision, or None. Where
    the run may compile its loss with the model (``compile_scope`` ``step``, and ``auto``'s
    compiled search, which tries it), the head's and the loss's term (``kept``) is left
    out: the partitioner may recompute what eager code keeps there (a cross-entropy's
    log-probabilities), so only the batch and the blocks' inputs stay a lower bound."""
    entry = MODEL_KIND_TABLE.get(spec.model.kind)
    floor = entry.activation_floor if entry else None
    if floor is None:
        return None
    found = floor(spec.model, PARAM_BYTES if spec.amp == "off" else HALF_BYTES)
    return replace(found, kept=0) if _may_compile_the_loss(spec) else found


def _may_compile_the_loss(spec: ExperimentSpec) -> bool:
    ck = spec.checkpoint
    strategy = get_strategy(ck.strategy)
    return (strategy.compiles and ck.compile_scope == CompileScope.STEP) or (strategy.planned and ck.search_compile)


def _any_plan(blocks: Sequence[int]) -> tuple[int, int]:
    """What no one-level plan goes below, ``(kept at the loss, held in a recomputation)``.

    A plan that keeps ``k`` of the blocks' inputs at the loss (its groups' first inputs and
    the blocks outside groups) recomputes a group of at least ``n / k`` blocks, so at the
    loss or in that recomputation ``max(k, n / k) ≥ ceil(sqrt(n))`` inputs are alive at once:
    at least the smallest at the loss, and the ``ceil(sqrt(n))`` smallest at one of the two
    (the ``O(sqrt(n))`` memory of Chen et al. 2016 is the least a one-level plan reaches;
    ``torch.compile``'s partitioner recomputes each operation at most once, one level too).
    """
    smallest = sorted(blocks)
    if not smallest:
        return 0, 0
    return smallest[0], sum(smallest[: math.isqrt(len(smallest) - 1) + 1])


def _blocks_kept(strategy: Strategy, ck: CheckpointSpec, blocks: Sequence[int]) -> tuple[int, int]:
    """``(bytes of the blocks' inputs kept at the loss, bytes of the largest checkpointed
    group's inputs, held again while it is recomputed)`` under ``strategy``. Nothing
    checkpointed (``none``, and ``offload``: ``save_on_cpu`` keeps the same tensors in host
    memory) keeps every input; groups keep their first input and every block outside them
    its own. A planned, compiled or unknown mechanism: :func:`_any_plan`."""
    if strategy.mechanism in (Mechanism.KEEP, Mechanism.SAVE_ON_CPU):
        return sum(blocks), 0
    if strategy.planned or strategy.mechanism not in (Mechanism.CHECKPOINT, Mechanism.CHECKPOINT_WITH_POLICY):
        return _any_plan(blocks)
    groups = strategy.groups(len(blocks), ck)
    grouped = {i for start, stop in groups for i in range(start, stop)}
    kept = sum(blocks[start] for start, _ in groups) + sum(b for i, b in enumerate(blocks) if i not in grouped)
    return kept, max((sum(blocks[start:stop]) for start, stop in groups), default=0)


def _per_sample(floor: ActivationFloor, kept: int, recomputed: int) -> int:
    """A step's activation bytes per sample at its peak, at least: the batch, plus the
    larger of what the loss's backward meets (the stem, head and loss's tensors and the
    blocks' kept inputs) and what the largest recomputation holds."""
    return floor.batch + max(floor.kept + kept, recomputed)


def estimate_activation_bytes(spec: ExperimentSpec, strategy: str | None = None) -> int | None:
    """A lower bound of the activation bytes at a training step's peak (the batch included),
    from the shapes alone: ``batch_size × (batch + max(kept + blocks kept, largest
    recomputed group))`` per sample, from the model kind's ``activation_floor``
    (:class:`ckptlab.spec.kinds.ActivationFloor`; each kind's formula is in its docstring)
    and the strategy's groups (:func:`_blocks_kept`). Every term grows with ``batch_size``.

    Args:
        spec: a validated experiment spec (per rank: ``batch_size`` is a rank's batch).
        strategy: count under this strategy instead of the spec's (``none``: the gradient
            check's reference step).

    Returns:
        Bytes, or None for a kind whose entry has no ``activation_floor`` (``custom``,
        ``python``, ``torchvision``: the API never sees their shapes).
    """
    floor = _model_floor(spec)
    if floor is None:
        return None
    kept, recomputed = _blocks_kept(get_strategy(strategy or spec.checkpoint.strategy), spec.checkpoint, floor.blocks)
    return spec.batch_size * _per_sample(floor, kept, recomputed)


@dataclass(frozen=True)
class PeakFloor:
    """A lower bound of one rank's peak host memory, bytes (:func:`estimate_peak_floor`).

    Attributes:
        held: parameters (and the optimizer state, gradients) alive beside the activations.
        per_sample: activation bytes per sample (see :func:`estimate_activation_bytes`).
        least_per_sample: the same under the plan that keeps the least (:func:`_any_plan`).
        batch_size: samples per step.
        gradient_check: whether the bound is the gradient check's reference step (no
            checkpointing, two copies of the model) rather than the run's.
        fields: the model's fields to lower for fewer activations.
    """

    held: int
    per_sample: int
    least_per_sample: int
    batch_size: int
    gradient_check: bool
    fields: tuple[str, ...]

    @property
    def activations(self) -> int:
        """Activation bytes, the batch included."""
        return self.batch_size * self.per_sample

    @property
    def total(self) -> int:
        """The bound: held + activations."""
        return self.held + self.activations

    def batch_that_fits(self, memory: int) -> int:
        """The largest ``batch_size`` whose bound stays within ``memory`` bytes (0: none)."""
        return max(0, (memory - self.held) // self.per_sample)


def estimate_peak_floor(spec: ExperimentSpec) -> PeakFloor | None:
    """A lower bound of a run's peak host memory per rank, from the spec alone: the larger
    of its two moments that keep activations.

    - The run's steps: at the loss's backward of any step after the first, the parameters
      and the optimizer state (``params × 4 B × (1 + k)``, per rank; the gradients too when
      ``grad_accum_steps`` > 1, else the engine has freed them, ``zero_grad(set_to_none=
      True)``) beside :func:`estimate_activation_bytes` under the spec's strategy.
    - The gradient check (``verify_gradients``, a strategy other than ``none``): one step of
      an un-checkpointed copy beside the checkpointed copy (``2 × params × 4 B``, the whole
      model) with every block's input kept (``ckptlab.worker.engine.gradcheck``).

    Args:
        spec: a validated experiment spec.

    Returns:
        A :class:`PeakFloor`, or None where the kind has no parameter count or no
        ``activation_floor``.
    """
    floor, params = _model_floor(spec), estimate_param_count(spec)
    if floor is None or params is None:
        return None
    rank = _rank_params(spec, params)
    state = rank * OPTIMIZER_STATES_PER_PARAM[spec.optimizer] if spec.steps + spec.timed_steps > 1 else 0
    grads = rank if spec.grad_accum_steps > 1 else 0
    least = _per_sample(floor, *_any_plan(floor.blocks))
    strategy = get_strategy(spec.checkpoint.strategy)
    run = _per_sample(floor, *_blocks_kept(strategy, spec.checkpoint, floor.blocks))
    phases = [PeakFloor((rank + state + grads) * PARAM_BYTES, run, least, spec.batch_size, False, floor.fields)]
    if spec.verify_gradients and strategy.name != BASELINE:
        keep = _per_sample(floor, *_blocks_kept(get_strategy(BASELINE), spec.checkpoint, floor.blocks))
        phases.append(PeakFloor(2 * params * PARAM_BYTES, keep, least, spec.batch_size, True, floor.fields))
    return max(phases, key=lambda p: p.total)


def limit_errors(
    spec: ExperimentSpec, settings: Settings, *, loc: tuple[str | int, ...] = ("body",), allocates: bool = True
) -> list[dict]:
    """The ways ``spec`` exceeds the configured limits, as FastAPI validation errors.

    Args:
        spec: a validated experiment spec.
        settings: supplies ``max_steps``, ``max_batch_size``, ``max_world_size``, ``max_param_count`` and
            ``worker_memory_bytes`` (the capacity the fixed memory,
            :func:`estimate_fixed_bytes`, and the peak's lower bound,
            :func:`estimate_peak_floor`, must each fit in; the latter is checked where the
            activations are host memory: device ``cpu``, sharded runs, and ``auto`` with
            ``auto_runs_on_cpu``, never ``cuda``: it is a 422 at
            ``batch_size`` naming both figures), and what the model kind's ``check``
            reads (:mod:`ckptlab.spec.model_kinds`: with ``check_model_entry_points`` an entry
            point must be installed and torchvision must import here; a python target must be
            in ``allowed_model_targets``, compared as text: nothing is imported).
        loc: prefix of each error's location (default ``("body",)``).
        allocates: False for a prediction, which runs on fake tensors and allocates no
            parameter, gradient or optimizer memory: ``max_param_count``, the fixed-memory
            and the activation checks protect a worker's memory and are skipped (a
            prediction's own bounds are ``prediction_memory_bytes`` and
            ``prediction_timeout_s``); the step, batch and model-kind checks apply as for a run.

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
            f"({fixed:,} bytes; {params:,} parameters{_per_rank(spec, params)}), over a worker's memory of "
            f"{_gib(settings.worker_memory_bytes)} (CKPTLAB_WORKER_MEMORY_BYTES); {_fixed_memory_advice(spec, params)}",
        )
    peak = estimate_peak_floor(spec) if _activations_on_host(spec, settings) else None
    if peak is not None and peak.total > settings.worker_memory_bytes:
        err(("batch_size",), spec.batch_size, _activation_message(spec, peak, settings.worker_memory_bytes))
    return errors


def _activations_on_host(spec: ExperimentSpec, settings: Settings) -> bool:
    """Whether the run's activations are host memory: device ``cpu``, a sharded run (CPU
    ranks), or ``auto`` where ``settings.auto_runs_on_cpu``; never ``cuda``."""
    if spec.device == "cuda":
        return False
    return spec.device == "cpu" or spec.distributed.kind != "none" or settings.auto_runs_on_cpu


def _per_rank(spec: ExperimentSpec, params: int) -> str:
    """``", N per rank of W"`` where FSDP2 shards the parameters, else nothing."""
    rank = _rank_params(spec, params)
    return f", {rank:,} per rank of {spec.distributed.world_size}" if rank != params else ""


def _activation_message(spec: ExperimentSpec, peak: PeakFloor, memory: int) -> str:
    """Why ``peak`` refuses ``spec``: both figures, the setting, and what would pass."""
    if peak.gradient_check:
        where, held = "in the gradient check's step without checkpointing (verify_gradients)", "two copies of the"
    else:
        where, held = f"with strategy {spec.checkpoint.strategy!r}", "the"
    state = " and optimizer state" if OPTIMIZER_STATES_PER_PARAM[spec.optimizer] and not peak.gradient_check else ""
    return (
        f"activations need at least {_gib(peak.activations)} ({peak.activations:,} bytes) for {spec.batch_size} "
        f"samples {where}; with {held} parameters{state} held beside them ({_gib(peak.held)}) a worker needs "
        f"at least {_gib(peak.total)} ({peak.total:,} bytes), over its memory of {_gib(memory)} "
        "(CKPTLAB_WORKER_MEMORY_BYTES). A lower bound counted from the shapes (the batch, what the stem, head "
        f"and loss keep, the blocks' inputs the strategy keeps), not a prediction: "
        f"{_activation_advice(spec, peak, memory)}"
    )


def _activation_advice(spec: ExperimentSpec, peak: PeakFloor, memory: int) -> str:
    """What would pass the activation check, true for this spec: the largest batch, the model
    fields to lower, and turning the gradient check off or checkpointing more where they help."""
    fits = peak.batch_that_fits(memory)
    advice = f"batch_size {fits} passes this check" if fits else "no batch_size passes this check"
    advice += ", or lower " + ", ".join(f"model.{f}" for f in peak.fields)
    if peak.gradient_check:
        return advice + ", or set verify_gradients false"
    if peak.least_per_sample < peak.per_sample:
        least = _gib(peak.batch_size * peak.least_per_sample)
        check = (
            "; and verify_gradients false: its check runs a step without checkpointing" if spec.verify_gradients else ""
        )
        advice += f", or checkpoint more (no strategy keeps less than {least} of activations here{check})"
    return advice


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
