"""Checkpointing strategies, applied by regrouping a model's block container in place.

Each checkpointed group of consecutive blocks becomes one :class:`CheckpointedGroup` at the
group's first position and ``nn.Identity`` at the others, so the model's own forward (which
applies the blocks in order) runs the group through ``torch.utils.checkpoint.checkpoint``.

- ``sequential``: exactly the segmenting of ``torch.utils.checkpoint.checkpoint_sequential``:
  ``len(blocks) // segments`` blocks per segment, the first ``segments - 1`` segments
  checkpointed, the rest (the last segment) run normally. ``segments=1`` checkpoints nothing.
- ``per_block``: every group of ``every`` blocks is checkpointed, the last included
  (Megatron-LM's "uniform" recompute method).
- ``selective``: like ``per_block`` with ``context_fn`` =
  ``create_selective_checkpoint_contexts(policy)`` (PyTorch >= 2.4): ops the policy marks
  ``MUST_SAVE`` are kept, the rest recomputed.
- ``offload``: no recomputation; tensors saved for backward inside the blocks go to host
  memory via ``torch.autograd.graph.save_on_cpu`` (pinned on CUDA).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from ckptlab.spec import CheckpointSpec

__all__ = ["CheckpointedGroup", "OffloadedGroup", "apply_strategy", "selective_policy", "RecomputeHook"]

#: Called with True when a group's recomputation starts during backward, False when it ends.
RecomputeHook = Callable[[bool], None]

_aten = torch.ops.aten
_MATMULS = {_aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default, _aten.convolution.default}
_ATTENTION = {
    getattr(_aten, name).default
    for name in (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
    )
    if hasattr(_aten, name)
}


def selective_policy(name: str) -> Callable:
    """The policy function for a named selective-checkpointing policy.

    ``save_matmuls``: save outputs of mm/addmm/bmm/convolution, recompute everything else
    (cheap elementwise ops, softmax; Korthikanti et al. 2022, arXiv 2205.05198).
    ``save_matmuls_and_attention``: also save the fused attention outputs.
    ``recompute_all``: save nothing extra (same as plain checkpointing).

    Raises:
        ValueError: unknown name.
    """
    saved = {"save_matmuls": _MATMULS, "save_matmuls_and_attention": _MATMULS | _ATTENTION, "recompute_all": set()}
    if name not in saved:
        raise ValueError(f"unknown selective policy {name!r}")
    keep = saved[name]

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in keep else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


class CheckpointedGroup(nn.Module):
    """Runs ``blocks`` in order under ``torch.utils.checkpoint.checkpoint``.

    Args:
        blocks: the group's blocks, each one tensor in, one tensor out.
        use_reentrant: passed to ``checkpoint``.
        preserve_rng_state: passed to ``checkpoint``.
        context_fn: passed to ``checkpoint`` (non-reentrant only). Default: None.
        on_recompute: called with True/False around a run of the group during backward
            (that is, its recomputation). Default: None.
    """

    def __init__(
        self,
        blocks: list[nn.Module],
        *,
        use_reentrant: bool,
        preserve_rng_state: bool,
        context_fn: Callable | None = None,
        on_recompute: RecomputeHook | None = None,
    ):
        super().__init__()
        self.group = nn.ModuleList(blocks)
        self.use_reentrant = use_reentrant
        self.preserve_rng_state = preserve_rng_state
        self.context_fn = context_fn
        self.on_recompute = on_recompute
        self.in_forward = False

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        recomputing = not self.in_forward and self.on_recompute is not None
        if recomputing:
            self.on_recompute(True)
        try:
            for block in self.group:
                x = block(x)
            return x
        finally:
            if recomputing:
                self.on_recompute(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Run the group on ``x`` (the first block's input shape) keeping only ``x`` for
        backward; returns the last block's output."""
        kwargs = {"context_fn": self.context_fn} if self.context_fn is not None else {}
        self.in_forward = True
        try:
            return checkpoint(
                self._run,
                x,
                use_reentrant=self.use_reentrant,
                preserve_rng_state=self.preserve_rng_state,
                **kwargs,
            )
        finally:
            self.in_forward = False


class OffloadedGroup(nn.Module):
    """Runs ``blocks`` in order inside ``torch.autograd.graph.save_on_cpu(pin_memory)``."""

    def __init__(self, blocks: list[nn.Module], *, pin_memory: bool):
        super().__init__()
        self.group = nn.ModuleList(blocks)
        self.pin_memory = pin_memory

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Run the group on ``x``; tensors saved for backward are packed to host memory."""
        with torch.autograd.graph.save_on_cpu(pin_memory=self.pin_memory):
            for block in self.group:
                x = block(x)
        return x


def _groups(n: int, ck: CheckpointSpec) -> list[tuple[int, int]]:
    """Half-open index ranges of the block groups to wrap."""
    if ck.strategy == "sequential":
        size = n // ck.segments
        return [(start, start + size) for start in range(0, size * (ck.segments - 1), size)]
    if ck.strategy in ("per_block", "selective"):
        return [(start, min(start + ck.every, n)) for start in range(0, n, ck.every)]
    if ck.strategy == "offload":
        return [(0, n)]
    return []


def apply_strategy(
    blocks: nn.Sequential | nn.ModuleList,
    ck: CheckpointSpec,
    *,
    device: torch.device,
    on_recompute: RecomputeHook | None = None,
) -> int:
    """Regroup ``blocks`` in place for ``ck.strategy``; returns the number of wrapped groups.

    Parameters keep their identity (the optimizer may be built before or after).

    Raises:
        ValueError: ``selective`` with ``use_reentrant=True`` (PyTorch requires
            ``use_reentrant=False`` for ``context_fn``).
    """
    if ck.strategy == "selective" and ck.use_reentrant:
        raise ValueError("strategy 'selective' needs use_reentrant=False")
    context_fn = (
        functools.partial(create_selective_checkpoint_contexts, selective_policy(ck.policy))
        if ck.strategy == "selective"
        else None
    )
    ranges = _groups(len(blocks), ck)
    for start, end in ranges:
        members = [blocks[i] for i in range(start, end)]
        if ck.strategy == "offload":
            wrapped: nn.Module = OffloadedGroup(members, pin_memory=device.type == "cuda")
        else:
            wrapped = CheckpointedGroup(
                members,
                use_reentrant=ck.use_reentrant,
                preserve_rng_state=ck.preserve_rng_state,
                context_fn=context_fn,
                on_recompute=on_recompute,
            )
        blocks[start] = wrapped
        for i in range(start + 1, end):
            blocks[i] = nn.Identity()
    return len(ranges)
