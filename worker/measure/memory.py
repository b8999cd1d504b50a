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
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ckptlab.domain import MemoryCategory

__all__ = ["CATEGORIES", "SimulatedOutOfMemoryError", "LiveTensorTracker", "CudaProbe"]


class SimulatedOutOfMemoryError(MemoryError):
    """Raised by :class:`LiveTensorTracker` when live bytes pass its ``limit_bytes``.

    Attributes:
        live_bytes: live tensor bytes at the failing allocation.
        limit_bytes: the limit that was passed.
    """

    def __init__(self, live_bytes: int, limit_bytes: int):
        super().__init__(
            f"simulated out of memory: {live_bytes} live tensor bytes exceed the limit of "
            f"{limit_bytes} bytes; lower batch_size or checkpoint more segments"
        )
        self.live_bytes = live_bytes
        self.limit_bytes = limit_bytes


#: Memory categories, after ``torch.distributed._tools.mem_tracker`` (PARAM, GRAD, OPT, ACT, TEMP).
CATEGORIES = tuple(c.value for c in MemoryCategory)  # the one vocabulary, ckptlab.domain


class _Info:
    __slots__ = ("nbytes", "category", "rng_state")

    def __init__(self, nbytes: int, category: str):
        self.nbytes, self.category, self.rng_state = nbytes, category, False


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

    Attributes:
        live_bytes: bytes of tracked storages alive now.
        peak_bytes: highest ``live_bytes`` since construction or :meth:`reset_peak`.
        by_category: live bytes per category now.
        peak_by_category: ``by_category`` as it was at ``peak_bytes``.
        window_peak_bytes: highest ``live_bytes`` since :meth:`reset_window`.
        high_water_bytes: highest ``live_bytes`` since construction (never reset).
        category: category given to new storages (default ``other``).
        rng_state_bytes: bytes of live RNG states among ``live_bytes`` (see below).

    RNG states: ``torch.get_rng_state()`` builds its tensor outside the dispatcher, so no
    dispatch mode sees it; yet each ``checkpoint`` with ``preserve_rng_state`` keeps one
    (5,056 B on CPU) from its forward to its backward. While the mode is active,
    ``torch.get_rng_state`` is wrapped so that the states it returns are counted too (issue
    19; ``torch/utils/checkpoint.py`` calls it through the ``torch`` module). With them,
    the live bytes equal the CPU allocator's as ``torch.profiler`` memory events record
    them (tests/worker/measure/test_allocator_probe.py); without them, PyTorch's ``MemTracker``,
    also a dispatch mode, reads 5,056 B less per live checkpoint.

    Warning:
        Tensors created before the mode was entered are not counted; call :meth:`track` on
        them. Storages resized in place after creation keep their creation size.
    """

    def __init__(
        self,
        limit_bytes: int | None = None,
        *,
        block_bytes: int = 1,
        count_rng_states: bool = True,
        events: list[tuple[int, int]] | None = None,
    ):
        super().__init__()
        self.block_bytes, self.count_rng_states, self.events = block_bytes, count_rng_states, events
        self._paused = 0
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

    def __enter__(self):
        inner = torch.get_rng_state
        self._unwrapped_get_rng_state.append(inner)
        if not self.count_rng_states:
            return super().__enter__()

        def get_rng_state() -> torch.Tensor:
            state = inner()
            key = state.untyped_storage()._cdata
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
        """Count ``t``'s storage if it is not counted yet.

        Raises:
            SimulatedOutOfMemoryError: live bytes passed ``limit_bytes``.
        """
        st = t.untyped_storage()
        key = st._cdata
        if key in self._live or t.device.type == "meta" or self._paused:
            return
        nbytes = st.nbytes()
        if self.block_bytes > 1:  # the device allocator's rounding (0 bytes: no block at all)
            nbytes = -(-nbytes // self.block_bytes) * self.block_bytes
        info = _Info(nbytes, self.category)
        self._live[key] = (weakref.ref(st, functools.partial(self._on_free, key)), info)
        if self.events is not None:
            self.events.append((key, nbytes))
        self.live_bytes += info.nbytes
        self.by_category[info.category] += info.nbytes
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
        """Move ``t``'s storage (if tracked) to ``category``."""
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
        if type(out) is torch.Tensor:  # the common case, without pytree's overhead
            self.track(out)
        else:
            for leaf in tree_leaves(out):
                if isinstance(leaf, torch.Tensor):
                    self.track(leaf)
        return out


class CudaProbe:
    """The CUDA caching allocator's statistics for one device (``torch.cuda``).

    ``live_bytes`` is ``memory_allocated``, ``peak_bytes`` ``max_memory_allocated`` since
    :meth:`reset_peak` and ``reserved_bytes`` ``memory_reserved``; all in bytes.
    """

    def __init__(self, device: torch.device):
        self.device = device

    @property
    def live_bytes(self) -> int:
        return torch.cuda.memory_allocated(self.device)

    @property
    def peak_bytes(self) -> int:
        return torch.cuda.max_memory_allocated(self.device)

    @property
    def reserved_bytes(self) -> int:
        return torch.cuda.memory_reserved(self.device)

    def reset_peak(self) -> None:
        """Start a new peak window (``torch.cuda.reset_peak_memory_stats``)."""
        torch.cuda.reset_peak_memory_stats(self.device)
