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

Selective checkpoints (issue 31): a segment with a ``policy`` (one block long) is the block
checkpointed with ``torch.utils.checkpoint``'s ``context_fn`` =
``create_selective_checkpoint_contexts(policy)``: the outputs of the ops the policy saves
(matmuls, attention) are kept, the rest recomputed. The engine measures such a block alone,
under the run's own instruments (:class:`SelectiveProfile`: what it keeps from its forward
to its backward, its output, the saved op outputs and its RNG state included, what its
forward holds on top, what its backward holds on top, its recomputation included, and what
it adds to a step), and the model counts it as an un-checkpointed block with those figures
(:meth:`BlockProfile.under`): every term of the memory model holds for it unchanged. Its
output's bytes count as alive through its backward (``released_bytes`` 0: measured so).
Offload (``save_on_cpu``) is not in the search: on CPU it moves nothing off the device
(host and device memory are the same), and no GPU was at hand to measure it (issue 31).

Pure Python, no torch: the engine measures, :mod:`ckptlab.planning.planner` decides.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

__all__ = [
    "BlockProfile",
    "SelectiveProfile",
    "resolved",
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
class SelectiveProfile:
    """One block checkpointed alone under a selective policy, as the engine measured it
    (:mod:`ckptlab.worker.engine.blocks.selective`).

    Attributes:
        policy: the policy's name (:class:`ckptlab.strategies.SelectivePolicy`:
            ``save_matmuls``, ``save_matmuls_and_attention``).
        kept_bytes: bytes alive after the checkpointed forward less before it (its input
            excluded): its output, the outputs of the ops the policy saves, the RNG state
            the checkpoint keeps where the meter counts it.
        forward_bytes: the most its forward held above that end (temporaries), bytes.
        backward_bytes: the most its backward held above what was alive when the gradient
            of its output arrived: the recomputation of what was not saved, its
            parameters' gradients, the gradient of its input, temporaries (bytes).
        ms: what the block checkpointed under the policy adds to a step (forward and
            backward through the checkpoint less the plain block's), ms.
    """

    policy: str
    kept_bytes: int
    forward_bytes: int
    backward_bytes: int
    ms: float


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
        policy_profiles: the block checkpointed alone under each selective policy measured
            (default none: the planner then offers keep and recompute only); dicts of
            :class:`SelectiveProfile`'s fields (a run summary's record) are converted.
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
    policy_profiles: tuple[SelectiveProfile, ...] = ()

    def __post_init__(self) -> None:
        # As the run summary records it (``plan.blocks``: a list of dicts): back to profiles.
        if not isinstance(self.policy_profiles, tuple) or not all(
            isinstance(s, SelectiveProfile) for s in self.policy_profiles
        ):
            made = tuple(s if isinstance(s, SelectiveProfile) else SelectiveProfile(**s) for s in self.policy_profiles)
            object.__setattr__(self, "policy_profiles", made)

    @property
    def policies(self) -> tuple[str, ...]:
        """The selective policies measured for this block, in order."""
        return tuple(s.policy for s in self.policy_profiles)

    def under(self, policy: str) -> BlockProfile:
        """The block checkpointed alone under ``policy``, as the memory model counts it: an
        un-checkpointed block that keeps ``kept_bytes`` (``retained_bytes``), holds
        ``forward_bytes`` and ``backward_bytes`` on top and never releases its output
        early; its time (``forward_ms``, ms) is what the checkpoint adds to a step.

        Raises:
            KeyError: ``policy`` was not measured for this block.
        """
        for s in self.policy_profiles:
            if s.policy == policy:
                return replace(
                    self,
                    retained_bytes=s.kept_bytes,
                    forward_bytes=s.forward_bytes,
                    backward_bytes=s.backward_bytes,
                    released_bytes=0,
                    recompute_bytes=None,
                    forward_ms=s.ms,
                    last_forward_ms=None,
                    policy_profiles=(),
                )
        raise KeyError(f"selective policy {policy!r} was not measured for this block (measured: {self.policies})")

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
    """Blocks ``start .. end - 1`` of the chain; ``checkpointed`` or run normally.

    ``policy``: None (default) recomputes a checkpointed segment whole; a selective
    policy's name checkpoints its one block under that policy (:class:`SelectiveProfile`).

    Raises:
        ValueError: a ``policy`` on a segment that is not checkpointed or not one block long.
    """

    start: int
    end: int
    checkpointed: bool
    policy: str | None = None

    def __post_init__(self) -> None:
        if self.policy is not None and (not self.checkpointed or self.end - self.start != 1):
            raise ValueError(f"a selective segment is one checkpointed block: {self}")


def resolved(blocks: Sequence[BlockProfile], segments: Sequence[Segment]) -> tuple[list[BlockProfile], list[Segment]]:
    """``blocks`` and ``segments`` with every selective segment's block as the memory model
    counts it (:meth:`BlockProfile.under`) and the segment as an un-checkpointed one; the
    rest unchanged.

    Raises:
        KeyError: a segment's policy was not measured for its block.
    """
    if all(s.policy is None for s in segments):
        return list(blocks), list(segments)
    out_blocks, out_segments = list(blocks), []
    for s in segments:
        if s.policy is None:
            out_segments.append(s)
        else:
            out_blocks[s.start] = blocks[s.start].under(s.policy)
            out_segments.append(Segment(s.start, s.end, False))
    return out_blocks, out_segments


def activation_peak(
    blocks: Sequence[BlockProfile], segments: Sequence[Segment], head: int = 0, backward: int = 0, ckpt: int = 0
) -> int:
    """The plan's peak above ``F + c``: the bytes kept after forward plus ``head`` (what the
    part after the blocks holds then), or the most that one block's backward holds (see the
    module's memory model), plus ``backward`` (gradients outside the blocks) while the
    blocks run backward. A selective segment counts as its block under its policy
    (:func:`resolved`)."""
    blocks, segments = resolved(blocks, segments)
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
    ``checkpoint_bytes``, each selective block's ``kept_bytes`` (see the module's memory
    model)."""
    blocks, segments = resolved(blocks, segments)
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
    ``plan.predicted_overhead.recompute_ms`` counts it); a selective segment adds its
    policy's ``ms``.

    Raises:
        KeyError: a segment's policy was not measured for its block.
    """
    return sum(
        blocks[s.start].under(s.policy).forward_ms
        if s.policy is not None
        else sum(b.forward_ms for b in blocks[s.start : s.end - 1]) + blocks[s.end - 1].end_ms
        for s in segments
        if s.checkpointed
    )


def pooled_forward_times(blocks: Sequence[BlockProfile]) -> list[BlockProfile]:
    """``blocks`` with each group of identical blocks (every field but the times equal) given
    the medians of the group's ``forward_ms`` and ``last_forward_ms`` (None where a member
    has none) and of each selective policy's ``ms``, ms; other blocks unchanged. Identical
    blocks differ in time by noise only (see the module docstring)."""
    timed = ("forward_ms", "last_forward_ms", "policy_profiles")
    key_fields = [f.name for f in fields(BlockProfile) if f.name not in timed]
    groups: dict[tuple, list[BlockProfile]] = {}

    def key(b: BlockProfile) -> tuple:
        measured = tuple((s.policy, s.kept_bytes, s.forward_bytes, s.backward_bytes) for s in b.policy_profiles)
        return (*(getattr(b, k) for k in key_fields), measured)

    for b in blocks:
        groups.setdefault(key(b), []).append(b)

    def pooled(b: BlockProfile) -> BlockProfile:
        group = groups[key(b)]
        last = [g.last_forward_ms for g in group]
        selective = tuple(
            replace(s, ms=statistics.median(g.policy_profiles[k].ms for g in group))
            for k, s in enumerate(b.policy_profiles)
        )
        return replace(
            b,
            forward_ms=statistics.median(g.forward_ms for g in group),
            last_forward_ms=None if None in last else statistics.median(last),
            policy_profiles=selective,
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
