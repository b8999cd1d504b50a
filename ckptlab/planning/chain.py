"""A chain of blocks as the budget planner sees it: each block's measured profile, a split
into segments (checkpointed or not), and what a split costs in memory and time.

The memory model (bytes; ``F`` = what is alive throughout: parameters, optimizer state,
the batch, the stem's activations; Rotor's model, each block's temporaries measured):

- After forward, an un-checkpointed block ``i`` keeps ``retained_bytes[i]`` (the bytes it
  created that are still alive right after its forward, its output included). A
  checkpointed segment ``[s, e)`` keeps its input (already counted: the output of what came
  before) and its output, ``output_bytes[e - 1]``, which the next block saves or the next
  checkpoint keeps, plus ``checkpoint_bytes`` (the RNG state ``preserve_rng_state`` keeps
  until the segment's backward is over; its recomputation holds a second one, the state
  ``torch.random.fork_rng`` saves around it). (The first version of this
  model forgot that output when an un-checkpointed block followed, and under-predicted by
  up to 30%: issue 21.)
- A block's forward (and its recomputation) holds ``forward_bytes`` of temporaries on top
  of what it keeps. The recomputation of a segment's last block stops after the last
  tensor the segment saves (PyTorch's non-reentrant checkpoint stops early by default):
  there it holds ``recompute_bytes`` (what the block's forward held up to that tensor) when
  measured; 786,432 B counted whole for 524,288 B held by an MLP block with dropout put its
  per-block plan 5,056 B (an RNG state) above per_block's measured peak (issue 31).
- Backward runs the segments in reverse. Segment ``k`` is recomputed whole when its
  backward starts (non-reentrant checkpoint), with the gradient of its output waiting; then
  block ``j``'s backward holds everything the earlier segments keep, the retained bytes of
  its own segment up to ``j`` less ``released_bytes``, the gradients of the later blocks'
  parameters (``param_bytes``), the gradient of its output and ``backward_bytes``; and all
  along, what the part after the blocks leaves alive (``backward``:
  :func:`ckptlab.planning.planner.plan_chain`'s ``backward_bytes``).
- At the end of forward the part after the blocks holds ``head_bytes``, calibrated on the
  un-checkpointed profile step so that the model predicts that step's peak.
- Predicted peak = ``max(F + max(every term above), floor)``; the floor (the optimizer
  step's own peak, the stem's backward) is the same under every plan.

Time (ms): a checkpointed segment ``[s, e)`` adds to a step the recomputation of its
blocks: ``forward_ms`` of blocks ``s .. e - 2`` and ``last_forward_ms`` of block ``e - 1``,
whose recomputation stops after the last tensor the segment saves (non-reentrant
checkpoint's early stop, PyTorch ``torch.utils.checkpoint`` docs: on the built-in
transformer the last 20% of a block's forward, its output projection and residual add,
is never recomputed; issue 31). Blocks that are the same computation (every measured byte
count equal, as the layers of a transformer or the blocks of a ResNet stage) take the
median of their measured times (:func:`pooled_forward_times`): identical blocks differ by
noise alone, and the program would otherwise trade recomputing one block for another on
that noise. Among plans of equal recomputation time the one with the fewest checkpointed segments
wins: each ``checkpoint`` call costs a little beyond its recomputation (measured on the
bench's ResNet generator, 4 blocks recomputed as 3 checkpoints: +24% step time against +20%
as one; docs/benchmarks.md), a cost this model does not count.

Pure Python, no torch: the engine measures, :mod:`ckptlab.planning.planner` decides.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

__all__ = [
    "BlockProfile",
    "Segment",
    "activation_peak",
    "backward_extra",
    "predict_peak",
    "kept_after_forward",
    "recompute_ms",
    "pooled_forward_times",
    "sequential_segments",
]


@dataclass(frozen=True)
class BlockProfile:
    """What one block of the chain costs, as measured by the engine.

    Attributes:
        retained_bytes: bytes the block keeps for backward when it is not checkpointed
            (live bytes after its forward minus before, the input excluded).
        input_bytes: bytes of the block's input tensor.
        forward_ms: what recomputing the block inside a checkpointed segment adds to a
            step (its forward; the engine measures it with the checkpoint's own costs,
            :mod:`ckptlab.worker.engine.block_timing`), ms.
        output_bytes: bytes of the block's output (what a checkpointed segment ending here
            keeps); None: the same as ``input_bytes`` (a shape-preserving block).
        param_bytes: bytes of the gradients of the block's parameters (default 0).
        backward_bytes: the most bytes the block's backward adds above what is alive when
            the gradient of its output arrives: its parameters' gradients, the gradient it
            passes on, temporaries (default 0).
        forward_bytes: the most bytes the block's forward holds above what it keeps at
            its end: temporaries it frees before returning (default 0). A recomputation
            holds them again, on top of everything alive in backward.
        released_bytes: bytes of ``retained_bytes`` already freed when the gradient of the
            block's output arrives (default 0): its output, when only what comes after
            (the next block, the head) saved it, and that backward ran first.
        recompute_bytes: the most bytes the block's forward holds above its start up to
            the last tensor it saves for backward, where a non-reentrant checkpoint's
            recomputation of a segment ending with this block stops; None (default): not
            measured, ``retained_bytes + forward_bytes`` (the whole forward's top).
        last_forward_ms: what the block adds when it ends a checkpointed segment (its
            recomputation up to its last saved tensor under non-reentrant checkpoint's
            early stop; the whole forward under a reentrant one), ms; None (default):
            ``forward_ms``.
    """

    retained_bytes: int
    input_bytes: int
    forward_ms: float
    output_bytes: int | None = None
    param_bytes: int = 0
    backward_bytes: int = 0
    forward_bytes: int = 0
    released_bytes: int = 0
    recompute_bytes: int | None = None
    last_forward_ms: float | None = None

    @property
    def end_ms(self) -> float:
        """What recomputing the block costs as the last block of a checkpointed segment, ms:
        ``last_forward_ms``, or ``forward_ms`` when not measured."""
        return self.forward_ms if self.last_forward_ms is None else self.last_forward_ms

    @property
    def out_bytes(self) -> int:
        """``output_bytes``, or ``input_bytes`` when not given."""
        return self.input_bytes if self.output_bytes is None else self.output_bytes

    @property
    def last_recompute_bytes(self) -> int:
        """What the block's recomputation holds at its top (bytes) as the last block of a
        checkpointed segment: ``recompute_bytes``, or the whole forward's top
        (``retained_bytes + forward_bytes``) when not measured; never above the latter."""
        whole = self.retained_bytes + self.forward_bytes
        return whole if self.recompute_bytes is None else min(self.recompute_bytes, whole)


@dataclass(frozen=True)
class Segment:
    """Blocks ``start .. end - 1`` of the chain; ``checkpointed`` or run normally."""

    start: int
    end: int
    checkpointed: bool


def activation_peak(
    blocks: Sequence[BlockProfile], segments: Sequence[Segment], head: int = 0, backward: int = 0, ckpt: int = 0
) -> int:
    """The plan's peak above ``F + c``: the bytes kept after forward plus ``head`` (what the
    part after the blocks holds then), or the most that one block's backward holds (see the
    module's memory model), plus ``backward`` (gradients outside the blocks) while the
    blocks run backward."""
    n = len(blocks)
    grads_after = [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        grads_after[i] = grads_after[i + 1] + blocks[i].param_bytes
    kept_before, peak = 0, 0
    for seg in segments:
        alive = kept_before
        incoming = grads_after[seg.end] + blocks[seg.end - 1].out_bytes + backward
        if seg.checkpointed:  # its own RNG state lives until its backward is over
            alive += ckpt
        for i in range(seg.start, seg.end):  # recomputed (or kept) up to block i
            b = blocks[i]
            peak = max(peak, alive + b.retained_bytes + b.forward_bytes)  # its forward
            if seg.checkpointed:
                # its recomputation (the last block's stops early), the gradient of the
                # segment's output waiting, and the RNG state torch.random.fork_rng saves around it
                top = b.last_recompute_bytes if i == seg.end - 1 else b.retained_bytes + b.forward_bytes
                peak = max(peak, alive + top + incoming + ckpt)
            alive += b.retained_bytes
            peak = max(peak, alive + backward_extra(blocks, i, grads_after) + backward)
        kept_before = kept_before + blocks[seg.end - 1].out_bytes + ckpt if seg.checkpointed else alive
    return max(peak, kept_before + head)


def backward_extra(blocks: Sequence[BlockProfile], i: int, grads_after: Sequence[int]) -> int:
    """What block ``i``'s backward holds besides the kept bytes: the gradients of later
    blocks, the gradient of its output, and what its backward adds, less what of its kept
    bytes is already freed (``released_bytes``; at most its output, so never negative)."""
    b = blocks[i]
    return grads_after[i + 1] + b.out_bytes + b.backward_bytes - b.released_bytes


def kept_after_forward(
    blocks: Sequence[BlockProfile], segments: Sequence[Segment], *, checkpoint_bytes: int = 0
) -> int:
    """The bytes the blocks keep at the end of forward under ``segments``: every
    un-checkpointed block's ``retained_bytes``, each checkpointed segment's output and
    ``checkpoint_bytes`` (see the module's memory model)."""
    kept = 0
    for seg in segments:
        if seg.checkpointed:
            kept += blocks[seg.end - 1].out_bytes + checkpoint_bytes
        else:
            kept += sum(b.retained_bytes for b in blocks[seg.start : seg.end])
    return kept


def predict_peak(
    blocks: Sequence[BlockProfile],
    segments: Sequence[Segment],
    *,
    fixed_bytes: int = 0,
    calibration_bytes: int = 0,
    head_bytes: int = 0,
    backward_bytes: int = 0,
    checkpoint_bytes: int = 0,
) -> int:
    """The predicted peak allocated bytes of ``segments`` (see the module's memory model;
    ``head_bytes`` counts at the end of forward only, ``backward_bytes`` while the blocks
    run backward)."""
    return (
        fixed_bytes
        + calibration_bytes
        + activation_peak(blocks, segments, head_bytes, backward_bytes, checkpoint_bytes)
    )


def recompute_ms(blocks: Sequence[BlockProfile], segments: Sequence[Segment]) -> float:
    """The recomputation of the checkpointed segments, ms: what the plan adds to one
    micro-batch (each segment's blocks' ``forward_ms``, its last block's ``end_ms``: see the
    module's time model); a step of ``k`` micro-batches pays it ``k`` times (as
    ``plan.predicted_overhead.recompute_ms`` counts it)."""
    return sum(
        sum(b.forward_ms for b in blocks[s.start : s.end - 1]) + blocks[s.end - 1].end_ms
        for s in segments
        if s.checkpointed
    )


def pooled_forward_times(blocks: Sequence[BlockProfile]) -> list[BlockProfile]:
    """``blocks`` with each group of identical blocks (every field but the times equal) given
    the medians of the group's ``forward_ms`` and ``last_forward_ms`` (None where a member
    has none), ms; other blocks unchanged. Identical blocks differ in time by noise only
    (see the module docstring)."""
    timed = ("forward_ms", "last_forward_ms")
    key_fields = [f.name for f in fields(BlockProfile) if f.name not in timed]
    groups: dict[tuple, list[BlockProfile]] = {}
    for b in blocks:
        groups.setdefault(tuple(getattr(b, k) for k in key_fields), []).append(b)

    def pooled(b: BlockProfile) -> BlockProfile:
        group = groups[tuple(getattr(b, k) for k in key_fields)]
        last = [g.last_forward_ms for g in group]
        return replace(
            b,
            forward_ms=statistics.median(g.forward_ms for g in group),
            last_forward_ms=None if None in last else statistics.median(last),
        )

    return [pooled(b) for b in blocks]


def sequential_segments(n: int, segments: int) -> tuple[Segment, ...]:
    """The split of ``torch.utils.checkpoint.checkpoint_sequential(functions, segments)``:
    ``n // segments`` blocks per segment, the first ``segments - 1`` checkpointed, the rest
    (the last segment) run normally.

    Raises:
        ValueError: ``segments`` outside ``1..n``.
    """
    if not 1 <= segments <= n:
        raise ValueError(f"segments must be in 1..{n}, got {segments}")
    size = n // segments
    out = [Segment(i * size, (i + 1) * size, True) for i in range(segments - 1)]
    out.append(Segment((segments - 1) * size, n, False))
    return tuple(out)
