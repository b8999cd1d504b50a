"""What a block checkpointed alone under a selective policy keeps and holds, measured like
the profile step measures the plain block (issue 31): with the run's own instruments (the
exact live-tensor tracker on CPU, the allocator on CUDA), each distinct block run once from
its captured inputs through ``torch.utils.checkpoint.checkpoint(use_reentrant=False,
context_fn=create_selective_checkpoint_contexts(policy))`` and its backward.

Per block and policy (bytes; :class:`ckptlab.planning.chain.SelectiveProfile` is what the
planner makes of them with the timing pass's times):

- ``kept_bytes``: alive after the checkpointed forward less before it: its output, the
  outputs of the ops the policy saves, the RNG state the checkpoint keeps (where the meter
  counts RNG states);
- ``forward_bytes``: the most its forward held above that end;
- ``backward_bytes``: the most its backward held above what was alive when the gradient of
  its output (a tensor of ones, made before) arrived: the recomputation, its parameters'
  gradients (they start at None), its input's gradient, temporaries.

A policy under which a block saves no op (no matmul, no attention) is left out for that
block: it is plain recomputation with more hooks; one that saves the same ops as a policy
already measured for the block (``save_matmuls_and_attention`` in a block without
attention) is left out too.

Offload (``save_on_cpu``) is not measured here, by decision: on CPU host and device memory
are the same, so it moves nothing, and its payoff on a GPU (PCIe traffic against
recomputation) could not be measured without one (issue 31).

Example usage::

    found = measure_selective(spec, dev, built, meter)   # after the profile step
    found[0]   # (SelectiveBytes("save_matmuls_and_attention", 8_126_464, ...), ...)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import checkpoint

from ckptlab.planning.chain import BlockProfile, SelectiveProfile
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.strategies import SelectivePolicy
from ckptlab.worker.engine.blocks.inputs import Inputs, capture_inputs, group_blocks
from ckptlab.worker.engine.strategies import first_tensor, selective_context
from ckptlab.worker.engine.training import autocast_for
from ckptlab.worker.measure.meter import Meter
from ckptlab.worker.models.base import Built

__all__ = ["SELECTIVE_POLICIES", "SelectiveBytes", "measure_selective", "with_selective"]

#: The policies ``auto`` chooses among per block, the one that saves most first.
SELECTIVE_POLICIES = (SelectivePolicy.SAVE_MATMULS_AND_ATTENTION.value, SelectivePolicy.SAVE_MATMULS.value)


@dataclass(frozen=True)
class SelectiveBytes:
    """One block checkpointed alone under ``policy``: ``kept_bytes``, ``forward_bytes`` and
    ``backward_bytes`` as the module docstring defines them (bytes)."""

    policy: str
    kept_bytes: int
    forward_bytes: int
    backward_bytes: int


def measure_selective(
    spec: ExperimentSpec, dev: torch.device, built: Built, meter: Meter, policies: tuple[str, ...] = SELECTIVE_POLICIES
) -> list[tuple[SelectiveBytes, ...]] | None:
    """Per block of ``built`` (an un-checkpointed model whose parameters have no gradients),
    its figures under each of ``policies`` worth measuring (see the module docstring),
    measured once per group of identical blocks. The blocks' inputs are those of a forward
    of the spec's first batch (outside the meter); the global RNG state is restored and
    the parameters' gradients set back to None afterwards.

    None (``auto`` then chooses between keep and recompute only) under a reentrant
    checkpoint (selective policies need ``use_reentrant=False``), or where a block cannot
    run apart from the model's forward (a ``RuntimeError``, ``TypeError`` or ``ValueError``
    there); nothing is raised.
    """
    if spec.checkpoint.use_reentrant:
        return None
    try:
        return _measure(spec, dev, built, meter, policies)
    except (RuntimeError, TypeError, ValueError):
        return None
    finally:
        for p in built.module.parameters():
            p.grad = None


def with_selective(
    profiles: Sequence[BlockProfile],
    measured: Sequence[tuple[SelectiveBytes, ...]] | None,
    policy_ms: Mapping[str, Sequence[float]],
) -> list[BlockProfile]:
    """``profiles`` with each block's :attr:`ckptlab.planning.chain.BlockProfile.policy_profiles`
    made of its ``measured`` bytes and ``policy_ms[policy][block]`` (ms: the timing pass's,
    :meth:`ckptlab.worker.engine.block_timing.ChainTimes.policy_ms`); unchanged where
    nothing was measured (None).

    Raises:
        KeyError: a measured policy without times.
    """
    if measured is None:
        return list(profiles)
    return [
        replace(
            b,
            policy_profiles=tuple(
                SelectiveProfile(m.policy, m.kept_bytes, m.forward_bytes, m.backward_bytes, policy_ms[m.policy][i])
                for m in found
            ),
        )
        for i, (b, found) in enumerate(zip(profiles, measured, strict=True))
    ]


def _measure(
    spec: ExperimentSpec, dev: torch.device, built: Built, meter: Meter, policies: tuple[str, ...]
) -> list[tuple[SelectiveBytes, ...]]:
    """:func:`measure_selective`'s work, raising what it meets."""
    x, _ = built.make_batch(spec.batch_size, torch.Generator().manual_seed(spec.seed))
    autocast = autocast_for(spec, dev)
    blocks = list(built.blocks)
    cuda = dev.type == "cuda"
    out: list[tuple[SelectiveBytes, ...]] = []
    with torch.random.fork_rng(devices=[dev] if cuda else [], device_type=dev.type):

        def forward() -> None:
            with autocast():
                built.module(x.to(dev))

        inputs = capture_inputs(blocks, forward)
        groups = group_blocks(blocks, inputs)
        found: dict[int, tuple[SelectiveBytes, ...]] = {}
        with meter.mode():
            for i, g in enumerate(groups):
                if g not in found:
                    found[g] = _block(spec, blocks[i], inputs[i], meter, autocast, policies)
                out.append(found[g])
    return out


def _block(
    spec: ExperimentSpec,
    block: torch.nn.Module,
    inputs: Inputs,
    meter: Meter,
    autocast: Callable[[], Any],
    policies: tuple[str, ...],
) -> tuple[SelectiveBytes, ...]:
    """``block``'s figures under each policy that saves ops not saved by one before."""
    probe = meter.probe
    args, kwargs = inputs
    seen: list[frozenset[str]] = []
    out = []
    for policy in policies:
        saved: set[str] = set()
        meter.sync()
        before = probe.live_bytes
        probe.reset_window()
        with torch.enable_grad(), autocast():
            output = checkpoint(
                block,
                *args,
                use_reentrant=False,
                preserve_rng_state=spec.checkpoint.preserve_rng_state,
                context_fn=selective_context(policy, saved),
                **kwargs,
            )
        meter.sync()
        after, forward_top = probe.live_bytes, probe.window_peak_bytes
        hidden = first_tensor(output)
        if not isinstance(hidden, torch.Tensor) or not hidden.requires_grad:
            return ()  # nothing to recompute: the block has no backward
        grad = torch.ones_like(hidden)
        meter.sync()
        start = probe.live_bytes
        probe.reset_window()
        hidden.backward(grad)
        meter.sync()
        backward_top = probe.window_peak_bytes
        for t in [*block.parameters(), *tree_leaves(inputs)]:
            if isinstance(t, torch.Tensor):
                t.grad = None
        del output, hidden, grad
        if saved and frozenset(saved) not in seen:
            seen.append(frozenset(saved))
            out.append(
                SelectiveBytes(policy, after - before, max(forward_top - after, 0), max(backward_top - start, 0))
            )
    return tuple(out)
