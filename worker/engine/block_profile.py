"""What each block of a chain costs, read while a step runs: forward hooks before and after
every block, and tensor hooks on each block's output and input for its backward.

Per block (bytes from the run's own instruments: the exact live-tensor tracker on CPU, the
allocator on CUDA; times from ``time.perf_counter``). A "window" is the probe's top since
the window was opened: the tracker's on CPU, the allocator's peak (reset per window,
:class:`ckptlab.worker.measure.memory.CudaProbe`) on CUDA:

- ``retained_bytes``: alive after its forward minus before (its output included);
- ``forward_bytes``: the most its forward held above that end (temporaries; its window);
- ``backward_bytes``: the most its backward held above what was alive when the gradient of
  its output arrived (its window);
- ``released_bytes``: its output's bytes when that output is already freed as the gradient
  of the output arrives (only the next block or the head saved it), else 0;
- ``recompute_bytes`` (with ``recompute``): the most its forward held above its
  start up to the last tensor it saved for backward (a saved-tensor pack hook reads the
  window there), where a non-reentrant checkpoint's recomputation stops;
- ``input_bytes``, ``output_bytes``, ``param_bytes`` (its parameters' gradients) and
  ``forward_ms``.

Example usage::

    with BlockRecorder(built.blocks, meter) as recorder:
        loss = built.loss_fn(built.module(x), y)
        recorder.stop_forward()
        loss.backward()
    profiles = recorder.profiles()

Known limitations:
    - A block whose input needs no gradient (the first block without a stem) has no end
      of backward to observe; :meth:`BlockRecorder.finish_backward` takes the window up to
      the end of ``backward()`` instead.
    - The hooks see blocks as the model's forward calls them: a block run twice, or not at
      all, is an error (:meth:`BlockRecorder.profiles`).
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from ckptlab.planning.chain import BlockProfile
from ckptlab.worker.engine.strategies import first_tensor
from ckptlab.worker.errors import RunError
from ckptlab.worker.measure.meter import Meter, storage_bytes

__all__ = ["BlockRecorder", "profile_record", "tensor_bytes"]


def _same(value: Any) -> Any:
    """The saved-tensor unpack hook of :class:`BlockRecorder`'s pack hook: the tensor as saved."""
    return value


def tensor_bytes(value: Any) -> int:
    """Storage bytes of a tensor (0 for anything else)."""
    return value.untyped_storage().nbytes() if isinstance(value, torch.Tensor) else 0


class BlockRecorder:
    """Records a :class:`ckptlab.planning.chain.BlockProfile` per block of ``blocks`` over one step.

    Args:
        blocks: the chain's blocks.
        meter: the run's instruments; its probe has windows (``reset_window``,
            ``window_peak_bytes``), as every probe of the engine does.
        tail: read the tail (:attr:`tail_live`, :attr:`tail_top`; default False).
        clock: what ``forward_ms`` is read with, in seconds (default ``time.perf_counter``;
            a prediction's proxy on fake tensors, :class:`ckptlab.worker.engine.training.FakeRun`).
        recompute: read each block's ``recompute_bytes`` (default False): a saved-tensor pack
            hook is active through the forward, so only for a step that checkpoints nothing
            (a checkpoint's own hooks would hide the packs). Where a block saved nothing
            through the hook, the field stays None.

    Attributes:
        first_live: live bytes when the first block started (the stem's end), or None.
        blocks_backward_live: live bytes when the gradient of the last block's output
            arrived (the blocks' backward starts), or None.
        tail_live: live bytes when the gradient of the first block's input was ready (the
            blocks' backward is over; the rest of backward, the stem's, is the "tail"), or
            None when that input needs no gradient (no tail) or ``tail`` is False.
        tail_top: the most live bytes in the tail, or None (see :meth:`finish_backward`).
        side_freed_bytes: bytes of the blocks' other tensor arguments (masks, position
            embeddings: what the model passes every layer besides the hidden states) that
            are freed by the end of forward (:meth:`stop_forward`): a checkpoint keeps its
            arguments until its backward, an un-checkpointed block only what it saved.
    """

    def __init__(
        self,
        blocks: nn.Sequential | nn.ModuleList,
        meter: Meter,
        tail: bool = False,
        clock: Callable[[], float] = time.perf_counter,
        recompute: bool = False,
    ):
        self.blocks, self.meter, self.probe, self.tail, self.clock = blocks, meter, meter.probe, tail, clock
        # The block whose forward is running, and the window's top at its last saved tensor.
        self._running: int | None = None
        self._last_pack: dict[int, int] = {}
        self._packing = torch.autograd.graph.saved_tensors_hooks(self._pack, _same) if recompute else None
        self.first_live: int | None = None
        self.blocks_backward_live: int | None = None
        self.tail_live: int | None = None
        self.tail_top: int | None = None
        self._seen: dict[int, tuple[int, float, int]] = {}
        self._profiles: list[BlockProfile | None] = [None] * len(blocks)
        self._backward_start: dict[int, int] = {}
        self._backward_extra: dict[int, int] = {}
        self._hooks: list[Any] = []
        # The previous block's output (weakly: the recorder must not keep it alive), and the
        # blocks whose input is that very tensor: their backward ends where the previous
        # block's begins, in the one hook the tensor already has (see _output_grad).
        self._last_output: tuple[int, weakref.ref] | None = None
        self._chained: set[int] = set()
        # Each block's output storage (weakly), to see whether it is freed when the gradient
        # of the output arrives (the storage's Python object lives as long as the storage).
        self._out_storage: dict[int, weakref.ref] = {}
        self._released: dict[int, int] = {}
        self._in_storage: set[int] = set()  # the running block's input storage
        self._side: dict[int, tuple[weakref.ref, int]] = {}  # the blocks' other tensor arguments
        self.side_freed_bytes = 0

    def __enter__(self) -> BlockRecorder:
        for i, block in enumerate(self.blocks):
            self._hooks.append(block.register_forward_pre_hook(self._pre(i), with_kwargs=True))
            self._hooks.append(block.register_forward_hook(self._post(i)))
        if self._packing is not None:
            self._packing.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_forward()

    def stop_forward(self) -> None:
        """Remove the forward hooks (the tensor hooks of backward stay on their tensors);
        the first call reads :attr:`side_freed_bytes`."""
        if self._hooks:
            self.side_freed_bytes = sum(n for ref, n in self._side.values() if ref() is None)
            self._side.clear()
        if self._packing is not None:
            packing, self._packing = self._packing, None
            packing.__exit__(None, None, None)
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        """A tensor saved for backward: in a block's forward, the window's top so far. Saved
        as a detached alias (the same storage): the tensor itself, an op's output, would tie
        the output to its own graph node in a cycle that outlives the step."""
        if self._running is not None:
            self._last_pack[self._running] = self.probe.window_peak_bytes
        return tensor.detach()

    def _pre(self, i: int):
        def hook(module, args, kwargs):
            self.meter.sync()
            hidden = args[0] if args else next(iter(kwargs.values()), None)
            if i == 0:
                self.first_live = self.probe.live_bytes
            self._seen[i] = (self.probe.live_bytes, self.clock(), tensor_bytes(hidden))
            self._in_storage = {hidden.untyped_storage()._cdata} if isinstance(hidden, torch.Tensor) else set()
            self.probe.reset_window()
            if isinstance(hidden, torch.Tensor) and hidden.requires_grad:
                last = self._last_output
                if last is not None and last[0] == i - 1 and last[1]() is hidden:
                    self._chained.add(i)
                else:
                    hidden.register_hook(self._input_grad(i))
            self._last_output = None
            self._running = i
            for leaf in tree_leaves((args, kwargs)):
                if isinstance(leaf, torch.Tensor) and leaf is not hidden:
                    storage = leaf.untyped_storage()
                    self._side.setdefault(storage._cdata, (weakref.ref(storage), storage.nbytes()))

        return hook

    def _post(self, i: int):
        def hook(module, args, output):
            self.meter.sync()
            self._running = None
            live, start, in_bytes = self._seen[i]
            after = self.probe.live_bytes
            top = self.probe.window_peak_bytes
            hidden = first_tensor(output)
            if isinstance(hidden, torch.Tensor) and hidden.requires_grad:
                hidden.register_hook(self._output_grad(i))
                self._last_output = (i, weakref.ref(hidden))
                storage = hidden.untyped_storage()
                if storage._cdata not in self._in_storage:  # made by the block, so in its retained bytes
                    self._out_storage[i] = weakref.ref(storage)
            self._profiles[i] = BlockProfile(
                retained_bytes=after - live,
                forward_bytes=max(top - after, 0),
                input_bytes=in_bytes,
                forward_ms=(self.clock() - start) * 1e3,
                output_bytes=tensor_bytes(hidden),
                param_bytes=storage_bytes(p for p in module.parameters() if p.requires_grad),
            )

        return hook

    def _output_grad(self, i: int):
        # Block i's output is block i + 1's input: the gradient arriving here also ends
        # block i + 1's backward. Tensor hooks run in the order they were registered, so a
        # second hook for that would read the window after this one has reset it (block
        # i + 1's backward then read as 0 bytes).
        def hook(grad):
            self.meter.sync()
            if i + 1 in self._chained:
                self._end_backward(i + 1)
            self._backward_start[i] = self.probe.live_bytes
            storage = self._out_storage.pop(i, None)
            if storage is not None and storage() is None:  # only what came after saved it
                self._released[i] = self._profiles[i].out_bytes if self._profiles[i] is not None else 0
            if i == len(self.blocks) - 1:
                self.blocks_backward_live = self.probe.live_bytes
            self.probe.reset_window()

        return hook

    def _input_grad(self, i: int):
        def hook(grad):
            self.meter.sync()
            self._end_backward(i)

        return hook

    def _end_backward(self, i: int) -> None:
        """The gradient of block ``i``'s input is ready: its backward held the window's top."""
        top = self.probe.window_peak_bytes
        self._backward_extra[i] = max(top - self._backward_start.get(i, top), 0)
        if i == 0 and self.tail:  # the tail starts: a window of its own
            self.tail_live = self.probe.live_bytes
            self.probe.reset_window()

    def finish_backward(self) -> None:
        """After ``backward()``: a block whose input needed no gradient ends with backward
        (its window up to now); the tail's top is read."""
        for i in self._backward_start.keys() - self._backward_extra.keys():
            self._backward_extra[i] = max(self.probe.window_peak_bytes - self._backward_start[i], 0)
        if self.tail_live is not None:
            self.tail_top = max(self.probe.window_peak_bytes, self.tail_live)

    def profiles(self) -> list[BlockProfile]:
        """One profile per block, in order.

        Raises:
            RunError: a block did not run in the model's forward.
        """
        missing = [i for i, p in enumerate(self._profiles) if p is None]
        if missing:
            raise RunError(f"blocks {missing} did not run in the model's forward: the blocks must form a chain")
        return [
            replace(
                p,
                backward_bytes=self._backward_extra.get(i, 0),
                released_bytes=self._released.get(i, 0),
                recompute_bytes=self._last_pack[i] - self._seen[i][0] if i in self._last_pack else None,
            )
            for i, p in enumerate(self._profiles)
        ]

    def public(self) -> list[dict[str, Any]]:
        """The profiles as the run summary stores them (``block_profile``)."""
        return [profile_record(b) for b in self.profiles()]


def profile_record(b: BlockProfile) -> dict[str, Any]:
    """One block profile as JSON (the run summary's ``block_profile`` and ``plan.blocks``;
    ``policy_profiles``: the block under each selective policy measured, bytes and ms, issue 31)."""
    return {
        "retained_bytes": b.retained_bytes,
        "input_bytes": b.input_bytes,
        "output_bytes": b.out_bytes,
        "param_bytes": b.param_bytes,
        "forward_ms": b.forward_ms,
        "backward_bytes": b.backward_bytes,
        "forward_bytes": b.forward_bytes,
        "released_bytes": b.released_bytes,
        "recompute_bytes": b.recompute_bytes,
        "last_forward_ms": b.last_forward_ms,
        "policy_profiles": [dataclasses.asdict(s) for s in b.policy_profiles],
    }
