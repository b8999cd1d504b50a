"""What a prediction states beside its figures (:class:`ckptlab.summary.PredictionInfo`):
how they were obtained, how far they can be off, the reserved and device-used bytes, whether
the run fits, and the notes that say why and what would change the verdict.

``device_used_bytes`` = predicted reserved peak + the target's CUDA context (an estimate,
``ckptlab.prediction.targets``); ``fits`` = ``device_used_bytes <= capacity``;
``margin_bytes`` = capacity - device used (negative: short by that much). On ``cpu`` there
is no allocator model: ``fits`` compares the peak allocated bytes with a capacity when one
is given (``capacity_bytes`` or the spec's ``memory_limit_bytes``), else is None.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptlab.analysis.explain import format_bytes
from ckptlab.domain import MemoryCategory
from ckptlab.prediction.targets import UNVERIFIED, Target
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.spec.hf_model import HFModelSpec
from ckptlab.strategies import Mechanism, Strategy
from ckptlab.summary import PredictionInfo, RunSummary
from ckptlab.worker.predict.fake import NOMINAL_FLOPS_PER_S, FakeSession

__all__ = ["Facts", "prediction_info", "CPU_ERROR_BOUND", "CPU_METHOD"]

CPU_METHOD = (
    "the spec's training steps run to the steady peak on fake tensors (torch FakeTensorMode, CPU: no memory "
    "allocated) under the engine's exact live-tensor tracker"
)
#: What tests/worker/predict/test_cpu_equals_real.py establishes for the ``cpu`` target.
CPU_ERROR_BOUND = (
    "within 1% of a real CPU run's live-tensor figures (tests/worker/predict/test_cpu_equals_real.py: every model "
    "kind x strategy x AMP of the engine's test matrix and the hf architectures; they agreed to the byte)"
)
_FIXED = (MemoryCategory.PARAMETERS, MemoryCategory.GRADIENTS, MemoryCategory.OPTIMIZER_STATE)
#: At most this share of the peak in activations: checkpointing cannot lower that peak.
_NO_ACTIVATIONS = 0.05


@dataclass(frozen=True)
class Facts:
    """What the verdict is made from, besides the summary.

    Attributes:
        target: the predicted device.
        capacity_bytes: its memory (the caller's, else the target's), or None.
        fixed: parameters + gradients + optimizer state counted from the model's tensors
            (bytes) and the words naming the parts
            (:func:`ckptlab.worker.engine.autoplan.fixed_bytes_before_running`).
        param_count: the model's parameters.
        spec: the spec as predicted.
        strategy: its strategy.
        session: the fake run (its SDPA router, its cuBLAS watch).
        profile_peak_bytes: strategy ``auto``'s un-checkpointed profile step's peak, or None.
    """

    target: Target
    capacity_bytes: int | None
    fixed: tuple[int, str]
    param_count: int
    spec: ExperimentSpec
    strategy: Strategy
    session: FakeSession
    profile_peak_bytes: int | None = None


def prediction_info(summary: RunSummary, facts: Facts, reserved: int | None) -> PredictionInfo:
    """The ``prediction`` block of ``summary`` (its figures already adjusted for the target;
    ``reserved``: the allocator model's peak, None on ``cpu``)."""
    target, capacity = facts.target, facts.capacity_bytes
    cuda = target.device == "cuda"
    used = reserved + target.context_bytes if cuda and reserved is not None else None
    compared = used if cuda else summary.peak_allocated_bytes
    fits = compared <= capacity if capacity is not None and compared is not None else None
    margin = capacity - compared if fits is not None and compared is not None else None
    at_peak = summary.memory_at_peak
    info = PredictionInfo(
        target=target.name,
        method=_method(target) + _sharding_method(facts),
        error_bound=_error_bound(target),
        capacity_bytes=capacity,
        peak_reserved_bytes=reserved,
        device_used_bytes=used,
        fits=fits,
        margin_bytes=margin,
        fixed_bytes=sum(at_peak.get(c.value, 0) for c in _FIXED),
        sdpa_backend=_sdpa_backend(facts),
    )
    info.notes = [
        "memory only: no timing pass and no gradient check (fake tensors run no kernels and hold no values)",
        *_verdict_notes(summary, facts, info),
        *_target_notes(facts),
        *_run_notes(summary, facts),
    ]
    return info


def _method(target: Target) -> str:
    if target.device != "cuda":
        return CPU_METHOD
    return (
        f"{CPU_METHOD}, adjusted for {target.label}: each allocation rounded up to {target.block_bytes} B; "
        "scaled_dot_product_attention routed to the ATen op of the backend the target picks (flash, efficient or "
        "math), whose fake kernels give the tensors it saves for backward; the optimizer in its foreach form; "
        f"CPU RNG states left out; a cuBLAS workspace ({format_bytes(target.cublas_workspace_bytes)}) added for "
        "each thread that ran a matmul (forward's, and autograd's in backward); reserved bytes from a replay of "
        "every allocation and free through a model of the CUDA caching allocator;"
        f" device used = reserved + the CUDA context ({format_bytes(target.context_bytes)}, "
        f"{'measured by scripts/gpu-check' if target.verified else 'an estimate'})"
    )


def _sharding_method(facts: Facts) -> str:
    """How a sharded spec was traced (empty for one process)."""
    d = facts.spec.distributed
    if d.kind == "none":
        return ""
    return (
        f"; rank 0 of {d.world_size} traced alone ({d.kind}, shard unit {d.shard_unit}) over a fake process group "
        "whose collectives return at once: the figures are one rank's (FSDP2 pads every rank's shards to the "
        "same size)"
    )


def _error_bound(target: Target) -> str:
    if target.device != "cuda":
        return CPU_ERROR_BOUND
    if not target.verified:
        return UNVERIFIED
    return f"measured on {target.label} by scripts/gpu-check (docs/benchmarks.md)"


def _sdpa_backend(facts: Facts) -> str | None:
    """The attention backend(s) the target ran; ``math`` for a model that computes attention
    eagerly (Hugging Face ``attn_implementation`` eager: it keeps the probabilities, as math
    does); None without attention."""
    router = facts.session.router
    if router.backends:
        return ", ".join(sorted(router.backends))
    model = facts.spec.model
    if isinstance(model, HFModelSpec) and model.arch.attention and model.attn_implementation == "eager":
        return "math"
    return None


def _verdict_notes(summary: RunSummary, facts: Facts, info: PredictionInfo) -> list[str]:
    """Why it does not fit, and what would change that."""
    if info.fits is not False or info.capacity_bytes is None:
        return []
    fixed, words = facts.fixed
    world = facts.spec.distributed.world_size
    per = fixed * world / max(facts.param_count, 1)  # a sharded rank holds about 1/world of them
    held = f"{facts.param_count:,} parameters" + (f", this rank's 1/{world} share" if world > 1 else "")
    if fixed >= info.capacity_bytes:
        return [
            f"does not fit: parameters, gradients and optimizer state alone need {format_bytes(fixed)} ({words}; "
            f"{per:.0f} B per parameter for {held}), more than the "
            f"{format_bytes(info.capacity_bytes)} of {facts.target.name}; checkpointing only removes activations, "
            "so no strategy can make it fit: fewer bytes per parameter (bf16 parameters and gradients, an optimizer "
            "with less state such as sgd) or sharding them over ranks (distributed fsdp2: each of N "
            "ranks holds about 1/N) would"
        ]
    act, peak = summary.activation_bytes_at_peak or 0, summary.peak_allocated_bytes or 0
    head = (
        f"does not fit: {format_bytes(-(info.margin_bytes or 0))} short; the fixed memory is {format_bytes(fixed)} "
        f"({words}) and the peak, in the {summary.peak_phase} phase, holds {format_bytes(act)} of activations"
    )
    if act <= _NO_ACTIVATIONS * peak:
        return [
            f"{head}: checkpointing cannot lower it; fewer bytes per parameter, an optimizer with less state or "
            "sharding over several devices would"
        ]
    return [
        f"{head}: checkpointing more (strategy auto plans for the capacity), a smaller batch or shorter inputs would"
    ]


def _target_notes(facts: Facts) -> list[str]:
    """What the CUDA adjustments assume."""
    target, session, spec = facts.target, facts.session, facts.spec
    notes = list(sorted(session.router.fallbacks))
    if _sdpa_backend(facts) == "math" and not session.router.backends:
        notes.append("the model computes attention eagerly: it keeps the attention probabilities, as SDPA's math does")
    if spec.amp == "fp16":
        notes.append(
            "the GradScaler is assumed to find finite gradients (no step skipped): fake tensors hold no values"
        )
    if target.device != "cuda":
        return notes
    notes.append(
        "autocast casts as on CPU (its op lists differ a little from CUDA's); cuDNN workspaces, NCCL and other "
        "processes are not counted; the real allocator frees its cached segments and retries before it reports out "
        "of memory, so a reserved peak over the capacity may still run when the allocated peak fits"
    )
    if facts.strategy.mechanism == Mechanism.SAVE_ON_CPU:
        notes.append("the tensors save_on_cpu moves to (pinned) host memory are not device memory and are left out")
    return notes


def _run_notes(summary: RunSummary, facts: Facts) -> list[str]:
    """What the blocks' times are (a FLOP proxy), and strategy ``auto``'s un-checkpointed
    profile step."""
    notes = []
    if facts.session.watch.guessed_reads:
        notes.append(
            f"building the model read {facts.session.watch.guessed_reads} values of tensors that have none (a random "
            "initialisation's, such as nn.init.trunc_normal_'s rejection test): they read as 0"
        )
    if summary.block_profile or facts.strategy.planned:
        notes.append(
            "block times cannot be measured on fake tensors: the blocks' forward_ms (and strategy auto's "
            "recompute_ms, by which it weighs blocks) are their forward FLOPs (torch.utils.flop_counter) at a "
            f"nominal {NOMINAL_FLOPS_PER_S / 1e12:.0f} TFLOP/s, a proxy, not a time"
        )
    profile, capacity = facts.profile_peak_bytes, facts.capacity_bytes
    if profile is not None:
        verdict = ""
        if capacity is not None and profile + facts.target.context_bytes > capacity:
            verdict = ", more than the device holds: a real run of auto would fail in that step"
        notes.append(
            "the engine profiles the blocks in one step without checkpointing before it plans; that step's peak is "
            f"{format_bytes(profile)} allocated{verdict}"
        )
    return notes
