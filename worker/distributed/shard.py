"""One rank of a sharded run: the model wrapped as the spec's ``distributed`` block says
(DDP, or FSDP2's ``fully_shard`` per block and then the root: torchtitan's order, each block
already inside its checkpoint wrapper), the rank's micro-batch cut from the global batch, and
the collectives' allocations tagged with their memory category.

The categories: FSDP2 all-gathers a unit's parameters into storages it later resizes to
nothing (``torch.distributed.fsdp._fully_shard._fsdp_param.free_storage``); while it
all-gathers and copies out, new storages are ``unsharded_parameters``; while it
reduce-scatters, ``communication``, and the sharded gradient it assigns is retagged
``gradients``. DDP's all-reduce buckets, made when DDP wraps the model, are
``communication``. The live-tensor tracker follows the resizes and counts a ``DTensor`` by
its local shard (:class:`ckptlab.worker.measure.memory.LiveTensorTracker`). While measured,
gloo runs FSDP2's collectives on private, untracked copies of their buffers, so FSDP2's
buffers are freed where FSDP2 drops them, not later on gloo's thread (see
:func:`_on_private_buffers`): a rank's measured figures are then the same on every run.

Known limitations:
    - The FSDP2 categories come from wrapping three functions of
      ``torch.distributed.fsdp._fully_shard._fsdp_param_group`` (``foreach_all_gather``,
      ``foreach_all_gather_copy_out``, ``foreach_reduce``), private to PyTorch: where a
      release renames them the bytes are counted as before but under the phase's category
      (a warning says so).
    - At a peak inside a reduce-scatter the new sharded gradient still counts as
      ``communication``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from ckptlab.domain import MemoryCategory
from ckptlab.spec.experiment import DistributedSpec
from ckptlab.worker.measure.meter import Meter
from ckptlab.worker.models.base import Built

__all__ = ["Rank", "collective_categories", "rank_batch"]

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
#: What runs inside each wrapped FSDP2 function, and the category of what it allocates.
_FSDP_CATEGORIES = {
    "foreach_all_gather": MemoryCategory.UNSHARDED_PARAMETERS,
    "foreach_all_gather_copy_out": MemoryCategory.UNSHARDED_PARAMETERS,
    "foreach_reduce": MemoryCategory.COMMUNICATION,
}


def rank_batch(make_batch: Callable[[int, torch.Generator], Any], rank: int, world_size: int):
    """``make_batch`` for one rank: the global batch (``n × world_size`` samples, the same
    generator: every rank draws the same) cut to this rank's ``n`` consecutive samples, each
    tensor copied so that the global batch is freed (a view would keep it alive)."""

    def make(n: int, gen: torch.Generator) -> Any:
        whole = make_batch(n * world_size, gen)
        lo, hi = rank * n, (rank + 1) * n

        def cut(t: Any) -> Any:
            return t[lo:hi].clone() if isinstance(t, torch.Tensor) and t.dim() >= 1 else t

        return tree_map(cut, whole)

    return make


@contextlib.contextmanager
def collective_categories(meter: Meter) -> Iterator[None]:
    """While inside, FSDP2's all-gathers and reduce-scatters tag what they allocate (see the
    module docstring; the category in force before each call is restored after it) and run
    on private buffers (:func:`_on_private_buffers`)."""
    try:
        from torch.distributed.fsdp._fully_shard import _fsdp_param_group as group_module
    except ImportError:  # pragma: no cover - a torch without FSDP2
        yield
        return
    missing = [name for name in _FSDP_CATEGORIES if not callable(getattr(group_module, name, None))]
    if missing:
        warnings.warn(
            f"FSDP2's {', '.join(missing)} not found in this torch: its collectives' bytes are counted "
            "under the phase's category",
            stacklevel=2,
        )
    originals = {name: getattr(group_module, name) for name in _FSDP_CATEGORIES if name not in missing}
    for name, original in originals.items():
        setattr(group_module, name, _tagging(original, meter, _FSDP_CATEGORIES[name]))
    import torch.distributed as dist

    collectives = {name: getattr(dist, name) for name in _GLOO_COLLECTIVES if callable(getattr(dist, name, None))}
    for name, original in collectives.items():
        setattr(dist, name, _on_private_buffers(original, meter))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(group_module, name, original)
        for name, original in collectives.items():
            setattr(dist, name, original)


#: The collectives FSDP2 runs (``torch.distributed.fsdp._fully_shard._fsdp_collectives``),
#: each ``(output, input, ...)``.
_GLOO_COLLECTIVES = ("all_gather_single", "reduce_scatter_single")


def _on_private_buffers(fn: Callable[..., Any], meter: Meter) -> Callable[..., Any]:
    """``fn(output, input, ...)`` run by gloo on untracked copies, waited for, and its result
    copied into ``output``: while the tracker counts.

    gloo runs a collective on its own thread, whose work object holds the tensors it was
    given until that thread lets go of it, after the work completed: a buffer FSDP2 drops
    (a unit's all-gather output, its reduce-scatter input) is then freed a moment later, on
    that thread, sometimes after the next allocations, and a measured peak changed from run
    to run by up to one unit's buffer (seen: +3% to +9% on small models). On CUDA the
    caching allocator frees at the drop (``record_stream`` aside), and the prediction's fake
    process group has no thread. With gloo given private copies, FSDP2's own buffers are
    freed where FSDP2 drops them, on every run. The collective is synchronous here (a CPU
    stand-in has no overlap to keep); ``async_op`` callers get the finished work.
    """

    @functools.wraps(fn)
    def call(output: torch.Tensor, input: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        tracker = meter.probe
        if not (meter.tracking and meter.exact) or output.device.type != "cpu":
            return fn(output, input, *args, **kwargs)
        async_op = kwargs.pop("async_op", False)
        with tracker.untracked():
            private_out, private_in = torch.empty_like(output), input.clone()
            work = fn(private_out, private_in, *args, **kwargs, async_op=True)
            work.wait()
        output.copy_(private_out)
        return work if async_op else None

    return call


def _tagging(fn: Callable[..., Any], meter: Meter, category: MemoryCategory) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        before = meter.category
        meter.set_category(category)
        try:
            return fn(*args, **kwargs)
        finally:
            meter.set_category(before)
            if fn.__name__ == "foreach_reduce" and args:
                # foreach_reduce(fsdp_params, ...) has assigned each one's sharded gradient
                meter.retag(
                    [p.sharded_param.grad for p in args[0] if p.sharded_param.grad is not None],
                    MemoryCategory.GRADIENTS,
                )

    return call


@dataclasses.dataclass
class Rank:
    """This process's place in a sharded run.

    Attributes:
        rank: 0 .. ``world_size - 1``.
        world_size: ranks in the run.
        spec: the spec's ``distributed`` block.
        device: this rank's device (``cpu``, or its own ``cuda:k``).
    """

    rank: int
    world_size: int
    spec: DistributedSpec
    device: torch.device
    _categories: contextlib.AbstractContextManager | None = dataclasses.field(default=None, repr=False)

    def close(self) -> None:
        """Undo what :meth:`wrap` installed for the measured run (FSDP2's category tags)."""
        if self._categories is not None:
            self._categories.__exit__(None, None, None)
            self._categories = None

    def explain(self, exc: BaseException, use_reentrant: bool) -> str | None:
        """What a known failure of the wrapped run means and what to change, or None.

        DDP's "Expected to mark a variable ready only once" under reentrant checkpointing with
        ``find_unused_parameters``: DDP walks the autograd graph after forward, the
        checkpointed blocks' parameters are not in it (their forward ran under ``no_grad``),
        it marks them unused (ready), and their recomputed backward marks them ready again
        (pytorch/pytorch#24005; the DDP notes on ``find_unused_parameters``).
        """
        if self.spec.kind == "ddp" and use_reentrant and "mark a variable ready only once" in str(exc):
            return (
                "DDP marked a parameter ready twice: reentrant checkpointing (use_reentrant true) with "
                "find_unused_parameters true hides the checkpointed blocks' parameters from the graph DDP "
                "walks after forward, so DDP marks them unused and their recomputed backward marks them "
                "again (pytorch/pytorch#24005); use use_reentrant false, or find_unused_parameters false"
            )
        return None

    def share(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (``torch.distributed.broadcast_object_list``)."""
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def wrap(self, built: Built, blocks: list[nn.Module], meter: Meter | None) -> Built:
        """``built`` wrapped for the run (its blocks already checkpointed): DDP around the
        whole model, or ``fully_shard`` on each of ``blocks`` (the model's blocks as built,
        before checkpoint wrappers; ``shard_unit: block``) or on each of their children
        (``block_children``), and then on the root. Every rank
        cuts its micro-batch from the same global batch (:func:`rank_batch`). What the
        wrapping allocates is tagged on ``meter`` (None: not measured)."""
        tag = meter.set_category if meter is not None else (lambda _category: None)
        make_batch = rank_batch(built.make_batch, self.rank, self.world_size)
        if self.spec.kind == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            tag(MemoryCategory.COMMUNICATION)  # its all-reduce buckets, made here
            try:
                ids = [self.device.index] if self.device.type == "cuda" else None
                module: nn.Module = DistributedDataParallel(
                    built.module, device_ids=ids, find_unused_parameters=self.spec.find_unused_parameters
                )
            finally:
                tag(MemoryCategory.OTHER)
            if meter is not None:  # and rebuilt in the first forwards, in their order of use
                module._pre_forward = _tagging(module._pre_forward, meter, MemoryCategory.COMMUNICATION)
            return dataclasses.replace(built, module=module, make_batch=make_batch)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(self.device.type, (self.world_size,))
        options: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": self.spec.reshard_after_forward}
        mp = self.spec.mixed_precision
        if mp is not None:
            options["mp_policy"] = MixedPrecisionPolicy(
                param_dtype=_DTYPES[mp.param_dtype], reduce_dtype=_DTYPES[mp.reduce_dtype]
            )
        if meter is not None and self._categories is None:
            self._categories = collective_categories(meter)
            self._categories.__enter__()
        tag(MemoryCategory.PARAMETERS)
        try:
            units = {"block": blocks, "block_children": [c for b in blocks for c in b.children()]}
            for unit in units.get(self.spec.shard_unit, []):
                if any(True for _ in unit.parameters()):
                    fully_shard(unit, **options)
            fully_shard(built.module, **options)
        finally:
            tag(MemoryCategory.OTHER)
        return dataclasses.replace(built, make_batch=make_batch)
