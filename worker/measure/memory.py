"""Memory probes: exact live tensor bytes on CPU, allocator statistics on CUDA.

CPU has no allocator statistics, so :class:`LiveTensorTracker` counts every tensor storage
created while it is active and subtracts it when the storage is freed, the method of
``torch.distributed._tools.mem_tracker.MemTracker`` (a ``TorchDispatchMode`` plus a weak
reference per storage). Unlike RSS it ignores allocator caching: it is the byte count the
CUDA caching allocator would report as "allocated" (without its 512-byte rounding).

For a prediction (:mod:`ckptlab.worker.predict`, tensors without memory under
``FakeTensorMode``) the tracker can also round every allocation up as a device's allocator
does (``block_bytes``: 512 on CUDA), leave out the CPU RNG states (host memory on CUDA),
log each allocation and free in order (``events``, replayed through an allocator model),
and leave out what is made inside :meth:`LiveTensorTracker.untracked` (host copies). With
the defaults it counts exactly as described above.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

from ckptlab.domain import MemoryCategory

__all__ = ["CATEGORIES", "SimulatedOutOfMemoryError", "LiveTensorTracker", "CudaProbe", "inner_tensors"]

#: The key :meth:`LiveTensorTracker.set_untracked` counts under (no storage's: theirs are addresses).
UNTRACKED_KEY = 0


class SimulatedOutOfMemoryError(MemoryError):
    """Raised by :class:`LiveTensorTracker` when live bytes pass its ``limit_bytes``.

    Attributes:
        live_bytes: live tensor bytes at the failing allocation.
        limit_bytes: the limit that was passed.
    """

    def __init__(self, live_bytes: int, limit_bytes: int):
        super().__init__(
            f"simulated out of memory: {live_bytes} live tensor bytes exceed the limit of {limit_bytes} bytes"
        )
        self.live_bytes = live_bytes
        self.limit_bytes = limit_bytes


#: Memory categories, after ``torch.distributed._tools.mem_tracker`` (PARAM, GRAD, OPT, ACT, TEMP).
CATEGORIES = tuple(c.value for c in MemoryCategory)  # the one vocabulary, ckptlab.domain


class _Info:
    __slots__ = ("nbytes", "category", "rng_state", "block")

    def __init__(self, nbytes: int, category: str):
        self.nbytes, self.category, self.rng_state = nbytes, category, False
        self.block = -1  # its id in the step a timeline records (ckptlab.worker.measure.timeline)


def inner_tensors(t: torch.Tensor) -> list[torch.Tensor]:
    """The tensors a traceable wrapper subclass holds (``__tensor_flatten__``: a ``DTensor``'s
    local shard), as ``torch.distributed._tools.common_utils.get_untyped_storages`` reads them."""
    names, _ctx = t.__tensor_flatten__()
    return [inner for inner in (getattr(t, name) for name in names) if isinstance(inner, torch.Tensor)]


class LiveTensorTracker(TorchDispatchMode):
    """Count live tensor bytes exactly, by category, for CPU runs.

    Use as a context manager around everything that allocates (model construction included):
    every storage returned by an ATen op while the mode is active is counted once, by its
    ``nbytes()``, until it is garbage collected. New storages get the current
    :attr:`category`; :meth:`retag` moves a storage to another one (parameters, gradients,
    optimizer state are retagged by the engine as it learns what they are).

    Args:
        limit_bytes: if set, raise :class:`SimulatedOutOfMemoryError` as soon as live bytes
            exceed it (emulates a smaller device). Default: None.
        block_bytes: count each storage rounded up to a multiple of this many bytes, as
            the CUDA caching allocator rounds its blocks (512); 1: exact bytes. Default: 1.
        count_rng_states: count the RNG states ``torch.get_rng_state`` returns (see below);
            False where they are not device memory (a CUDA run's). Default: True.
        events: a list to append ``(key, bytes)`` to at each counted allocation and
            ``(key, -bytes)`` at its free, in order (bytes as counted, rounded); None: no
            log. Default: None.
        device_type: count only storages on this device type (``"cuda"``: a CUDA run's
            timeline, whose batch is made on the host); None: every device but meta.
            Default: None.

    Attributes:
        live_bytes: bytes of tracked storages alive now.
        peak_bytes: highest ``live_bytes`` since construction or :meth:`reset_peak`.
        by_category: live bytes per category now.
        peak_by_category: ``by_category`` as it was at ``peak_bytes``.
        window_peak_bytes: highest ``live_bytes`` since :meth:`reset_window`.
        high_water_bytes: highest ``live_bytes`` since construction (never reset).
        category: category given to new storages (default ``other``).
        rng_state_bytes: bytes of live RNG states among ``live_bytes`` (see below).
        recorder: told of every counted allocation and free while set (a
            :class:`ckptlab.worker.measure.timeline.TimelineRecorder` during a recorded
            step: the tracker appends to its ``blocks`` and ``events`` itself, as its
            ``alloc`` and ``free`` would); None (the default): nothing is told, nothing costs.

    RNG states: ``torch.get_rng_state()`` builds its tensor outside the dispatcher, so no
    dispatch mode sees it; yet each ``checkpoint`` with ``preserve_rng_state`` keeps one
    (5,056 B on CPU) from its forward to its backward. While the mode is active,
    ``torch.get_rng_state`` is wrapped so that the states it returns are counted too (issue
    19; ``torch/utils/checkpoint.py`` calls it through the ``torch`` module). With them,
    the live bytes equal the CPU allocator's as ``torch.profiler`` memory events record
    them (tests/worker/measure/test_allocator_probe.py); without them, PyTorch's ``MemTracker``,
    also a dispatch mode, reads 5,056 B less per live checkpoint.

    Storages resized in place (``UntypedStorage.resize_``, FSDP2's way of freeing and
    re-allocating all-gathered parameters) are counted at their new size; tensor subclasses
    that wrap others (``DTensor``) are counted by the tensors they wrap.

    Warning:
        Tensors created before the mode was entered are not counted; call :meth:`track` on
        them. What a tensor subclass allocates inside its own dispatch (a ``DTensor`` op's
        temporaries) is not seen, as by ``MemTracker``.
    """

    def __init__(
        self,
        limit_bytes: int | None = None,
        *,
        block_bytes: int = 1,
        count_rng_states: bool = True,
        events: list[tuple[int, int]] | None = None,
        device_type: str | None = None,
    ):
        super().__init__()
        self.block_bytes, self.count_rng_states, self.events = block_bytes, count_rng_states, events
        self.device_type = device_type
        self._paused = 0
        self.recorder = None
        self.live_bytes = 0
        self.rng_state_bytes = 0
        self.peak_bytes = 0
        self.window_peak_bytes = 0
        self.high_water_bytes = 0
        self.limit_bytes = limit_bytes
        self.category = MemoryCategory.OTHER.value
        self.by_category = dict.fromkeys(CATEGORIES, 0)
        self.peak_by_category = dict(self.by_category)
        # StorageImpl address -> (weak reference to the storage, its info). The weak
        # reference's callback runs when the storage is freed (PyTorch keeps one Python
        # object per live storage), before its address can be reused.
        self._live: dict[int, tuple[weakref.ref, _Info]] = {}
        self._unwrapped_get_rng_state: list = []  # torch.get_rng_state as it was, per __enter__
        self._unwrapped_resize: list = []  # torch.UntypedStorage.resize_ as it was, per __enter__

    def __enter__(self):
        inner = torch.get_rng_state
        self._unwrapped_get_rng_state.append(inner)
        resize = torch.UntypedStorage.resize_
        self._unwrapped_resize.append(resize)

        def resize_(st: torch.UntypedStorage, size: int):
            out = resize(st, size)
            self._on_resize(st)
            return out

        torch.UntypedStorage.resize_ = functools.wraps(resize)(resize_)
        if not self.count_rng_states:
            return super().__enter__()

        def get_rng_state() -> torch.Tensor:
            state = inner()
            key = state.untyped_storage()._cdata
            if self.recorder is not None:
                self.recorder.op = "torch.get_rng_state"
            try:
                self.track(state)
            finally:  # counted even when the count raised the emulated out-of-memory
                entry = self._live.get(key)
                if entry is not None and not entry[1].rng_state:
                    entry[1].rng_state = True
                    self.rng_state_bytes += entry[1].nbytes
            return state

        torch.get_rng_state = get_rng_state
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            torch.get_rng_state = self._unwrapped_get_rng_state.pop()
            torch.UntypedStorage.resize_ = self._unwrapped_resize.pop()

    def _on_resize(self, st: torch.UntypedStorage) -> None:
        """A storage resized in place (``UntypedStorage.resize_``, which no dispatch mode
        sees: FSDP2 frees and re-allocates its all-gathered parameters so, as
        ``MemTracker._track_resize`` does): its bytes become the new size's; grown from
        nothing, it is a new allocation and takes the current :attr:`category`."""
        if self._paused:
            return
        entry = self._live.get(st._cdata)
        if entry is None:  # (a fake tensor's storage is on meta: counted only through its tensor)
            device = st.device.type
            if st.nbytes() and device != "meta" and self.device_type in (None, device):
                self._count(st, self.category)
            return
        info = entry[1]
        new = self._rounded(st.nbytes())
        if self.events is not None:
            self.events.append((st._cdata, -info.nbytes))
            self.events.append((st._cdata, new))
        self.live_bytes -= info.nbytes
        self.by_category[info.category] -= info.nbytes
        if info.nbytes == 0:
            info.category = self.category
        if self.recorder is not None:  # a free of the old size, an allocation of the new
            self.recorder.free(info)
            self.recorder.op = "UntypedStorage.resize_"
            self.recorder.alloc(info, new)
        info.nbytes = 0
        self._add(info, new)

    def _on_free(self, key: int, _ref: weakref.ref) -> None:
        entry = self._live.pop(key, None)
        if entry is not None:
            info = entry[1]
            self.live_bytes -= info.nbytes
            self.by_category[info.category] -= info.nbytes
            if info.rng_state:
                self.rng_state_bytes -= info.nbytes
            if self.events is not None:
                self.events.append((key, -info.nbytes))
            if self.recorder is not None and info.block >= 0:  # (the recorder's free, inline)
                self.recorder.events.append(~info.block)

    @contextlib.contextmanager
    def untracked(self) -> Iterator[None]:
        """Storages made inside are not counted (host copies of a device's tensors: a
        prediction's ``save_on_cpu``)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def track(self, t: torch.Tensor) -> None:
        """Count ``t``'s storage if it is not counted yet; for a tensor subclass that wraps
        others (``DTensor``: its local shard), theirs.

        Raises:
            SimulatedOutOfMemoryError: live bytes passed ``limit_bytes``.
        """
        if type(t) is not torch.Tensor and is_traceable_wrapper_subclass(t):
            for inner in inner_tensors(t):
                self.track(inner)
            return
        st = t.untyped_storage()
        if st._cdata in self._live or t.device.type == "meta" or self._paused:
            return
        if self.device_type is not None and t.device.type != self.device_type:
            return
        self._count(st, self.category)

    def set_untracked(self, nbytes: int, category: str) -> None:
        """Count ``nbytes`` that no tensor holds as one block (key :data:`UNTRACKED_KEY`),
        replacing the last such count: on CUDA, the allocator's allocated bytes that are no
        tensor's (cuBLAS workspaces), so that the live bytes read the allocator's."""
        old = self._live.pop(UNTRACKED_KEY, None)
        if old is not None:
            self.live_bytes -= old[1].nbytes
            self.by_category[old[1].category] -= old[1].nbytes
        if nbytes > 0:
            info = _Info(0, category)
            self._live[UNTRACKED_KEY] = (None, info)  # type: ignore[assignment] - no storage to watch
            self._add(info, nbytes)

    def _rounded(self, nbytes: int) -> int:
        # the device allocator's rounding (0 bytes: no block at all)
        return -(-nbytes // self.block_bytes) * self.block_bytes if self.block_bytes > 1 else nbytes

    def _count(self, st: torch.UntypedStorage, category: str) -> None:
        key = st._cdata
        nbytes = self._rounded(st.nbytes())
        info = _Info(0, category)
        self._live[key] = (weakref.ref(st, functools.partial(self._on_free, key)), info)
        if self.events is not None:
            self.events.append((key, nbytes))
        rec = self.recorder
        if rec is not None:  # the recorder's alloc, inline: a Python call less per allocation
            owner, blocks = rec.owner, rec.blocks
            info.block = block = len(blocks) // 5  # (a flat list: see TimelineRecorder.blocks)
            blocks.extend((info, nbytes, owner if owner is not None else rec.node_owner(), rec.op, rec.recomputing))
            rec.events.append(block)
        self._add(info, nbytes)

    def _add(self, info: _Info, nbytes: int) -> None:
        info.nbytes = nbytes
        self.live_bytes += nbytes
        self.by_category[info.category] += nbytes
        if self.live_bytes > self.window_peak_bytes:
            self.window_peak_bytes = self.live_bytes
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes
            self.peak_by_category = self.by_category.copy()
            if self.live_bytes > self.high_water_bytes:
                self.high_water_bytes = self.live_bytes
        if self.limit_bytes is not None and self.live_bytes > self.limit_bytes:
            raise SimulatedOutOfMemoryError(self.live_bytes, self.limit_bytes)

    def retag(self, t: torch.Tensor, category: str) -> None:
        """Move ``t``'s storage (if tracked; a wrapper subclass's: its inner tensors') to ``category``."""
        if is_traceable_wrapper_subclass(t):
            for inner in inner_tensors(t):
                self.retag(inner, category)
            return
        entry = self._live.get(t.untyped_storage()._cdata)
        if entry is not None and entry[1].category != category:
            info = entry[1]
            self.by_category[info.category] -= info.nbytes
            self.by_category[category] += info.nbytes
            info.category = category
            if self.live_bytes == self.peak_bytes:  # the peak is now: it holds the new tag
                self.peak_by_category = self.by_category.copy()

    def reset_peak(self) -> None:
        """Start a new peak window at the current live bytes."""
        self.peak_bytes = self.live_bytes
        self.peak_by_category = dict(self.by_category)

    def reset_window(self) -> None:
        """Start a new inner window (for the recomputation peak) at the current live bytes."""
        self.window_peak_bytes = self.live_bytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.recorder is not None:
            self.recorder.op = func
        if type(out) is torch.Tensor:  # the common case, without pytree's overhead
            self.track(out)
        else:
            for leaf in tree_leaves(out):
                if isinstance(leaf, torch.Tensor):
                    self.track(leaf)
        return out


class CudaProbe:
    """The CUDA caching allocator's statistics for one device (``torch.cuda``).

    ``live_bytes`` is ``memory_allocated``, ``peak_bytes`` the highest ``memory_allocated``
    since :meth:`reset_peak`, ``window_peak_bytes`` the highest since :meth:`reset_window`
    (``max_memory_allocated``: the allocator keeps one peak, so a window resets it and
    the probe keeps the earlier windows' top), and ``reserved_bytes`` ``memory_reserved``;
    all in bytes. The allocator's statistics are kept on the host as it allocates, so
    reading them needs no ``torch.cuda.synchronize``.

    The window is what the planner's block profile reads a block's forward and backward
    temporaries with (:class:`ckptlab.worker.engine.block_profile.BlockRecorder`), as on
    CPU with the live-tensor tracker: without it a block's forward temporaries read as 0 on
    CUDA and its backward's as the live bytes at its end, and a plan whose
    last checkpointed segment held two blocks peaked 2,100,012 B above its prediction and
    its budget on an H200 (the built-in transformer 4x128, seq 256, batch 4;
    docs/benchmarks.md, "2026-11-27: the lent H200 again").

    Known limitations:
        Code that calls ``torch.cuda.reset_peak_memory_stats`` itself loses the open
        window's top so far, and does not start a new peak for :attr:`peak_bytes` (the
        earlier windows' top stays): go through :meth:`reset_peak` and
        :meth:`reset_window`. (The reset also restarts the allocator's reserved, active and
        requested peaks; nothing in ckptlab reads them.)
    """

    def __init__(self, device: torch.device):
        self.device = device
        self._earlier_top = 0  # the highest allocated bytes of the windows before this one

    @property
    def live_bytes(self) -> int:
        return torch.cuda.memory_allocated(self.device)

    @property
    def peak_bytes(self) -> int:
        return max(self._earlier_top, torch.cuda.max_memory_allocated(self.device))

    @property
    def window_peak_bytes(self) -> int:
        return torch.cuda.max_memory_allocated(self.device)

    @property
    def reserved_bytes(self) -> int:
        return torch.cuda.memory_reserved(self.device)

    def reset_peak(self) -> None:
        """Start a new peak (``torch.cuda.reset_peak_memory_stats``; the window too)."""
        self._earlier_top = 0
        torch.cuda.reset_peak_memory_stats(self.device)

    def reset_window(self) -> None:
        """Start a new window; :attr:`peak_bytes` keeps the top of the ones before."""
        self._earlier_top = self.peak_bytes
        torch.cuda.reset_peak_memory_stats(self.device)
