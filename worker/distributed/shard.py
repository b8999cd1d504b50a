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
its local shard (:class:`ckptlab.worker.measure.memory.LiveTensorTracker`).

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
    module docstring); the category in force before each call is restored after it."""
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
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(group_module, name, original)


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
                module: nn.Module = DistributedDataParallel(built.module, device_ids=ids)
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
