"""A sharded run's gradients against one process's: the same weights (``spec.seed``), the
same global batch (every rank's micro-batch cut from it), one forward and backward, every
parameter's full gradient compared (:class:`ckptlab.summary.ShardedGradientCheck`).

Both sides run in eval mode: dropout draws different masks on each rank than in one
process, and batch normalisation over a rank's micro-batch is not the global batch's by
design (DDP's documented behaviour; SyncBatchNorm is the fix), so neither is a sharding
error. Checkpointing is applied as the run applies it (strategy ``auto``: every block, the
plan being the run's own business), so recomputation under sharding is checked too.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.strategies import PER_BLOCK, get_strategy
from ckptlab.summary import ShardedGradientCheck
from ckptlab.worker.distributed.shard import Rank
from ckptlab.worker.engine.training import autocast_for, build_checkpointed
from ckptlab.worker.models.build import build_model

__all__ = ["check_sharded_gradients", "TOLERANCE"]

#: Largest relative difference (max|a - b| / max|b| per parameter) that matches: fp32 runs
#: differ only in the order of the reduction's sums; autocast's half-precision matmuls
#: differ by their rounding on different batch shapes.
TOLERANCE = {"off": 1e-4, "bf16": 5e-2, "fp16": 1e-2}


def _full(grad: torch.Tensor | None) -> torch.Tensor | None:
    """A gradient as one full tensor (a ``DTensor``'s shards all-gathered), float32."""
    if grad is None:
        return None
    full = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
    return full.detach().float()


def check_sharded_gradients(spec: ExperimentSpec, rank: Rank) -> ShardedGradientCheck | None:
    """Run the check (a collective: every rank calls it); rank 0 returns the verdict, the
    others None.

    Raises:
        RuntimeError: a collective failed (another rank died).
    """
    dev = rank.device
    if get_strategy(spec.checkpoint.strategy).planned:  # its plan is the run's: check every block checkpointed
        spec = spec.model_copy(
            update={"checkpoint": spec.checkpoint.model_copy(update={"strategy": PER_BLOCK, "every": 1})}
        )
    blocks: list[torch.nn.Module] = []
    built = build_checkpointed(spec, dev, blocks_as_built=blocks)
    built = rank.wrap(built, blocks, meter=None)
    built.module.eval()
    autocast = autocast_for(spec, dev)
    x, y = built.make_batch(spec.batch_size, torch.Generator().manual_seed(spec.seed + 1))
    with autocast():
        out = built.module(x.to(dev))
    loss = built.loss_fn(out, y.to(dev))
    loss.backward()
    grads = [_full(p.grad) for p in built.module.parameters()]
    mean_loss = loss.detach().float().clone()
    dist.all_reduce(mean_loss)
    mean_loss /= rank.world_size
    if rank.rank != 0:
        return None
    torch.manual_seed(spec.seed)
    ref = build_model(spec.model)
    ref.module.to(dev).eval()
    gx, gy = ref.make_batch(spec.batch_size * rank.world_size, torch.Generator().manual_seed(spec.seed + 1))
    with autocast():
        ref_out = ref.module(gx.to(dev))
    ref_loss = ref.loss_fn(ref_out, gy.to(dev))
    ref_loss.backward()
    worst, worst_rel, compared = None, 0.0, 0
    for (name, p), g in zip(ref.module.named_parameters(), grads, strict=True):
        if p.grad is None and g is None:
            continue
        a = g if g is not None else torch.zeros_like(p, dtype=torch.float32)
        b = p.grad.float() if p.grad is not None else torch.zeros_like(a)
        scale = float(b.abs().max())
        diff = float((a - b).abs().max())
        rel = diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf"))
        compared += 1
        if worst is None or rel > worst_rel:
            worst, worst_rel = name, rel
    tolerance = TOLERANCE[spec.amp]
    return ShardedGradientCheck(
        match=worst_rel <= tolerance,
        params_compared=compared,
        worst_param=worst,
        worst_rel_error=worst_rel,
        tolerance=tolerance,
        loss_diff=abs(float(mean_loss) - float(ref_loss.detach().float())),
    )
