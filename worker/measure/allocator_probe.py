"""CPU allocator bytes from ``torch.profiler``'s memory events, for code the live-tensor
tracker cannot watch.

:class:`ckptlab.worker.measure.memory.LiveTensorTracker` is a ``TorchDispatchMode``: ``torch.compile``
does not run its compiled graph under an active dispatch mode (it retraces, and the saved
tensors are those of the default partition: measured on an MLP, 524,288 saved bytes under
the mode against 65,536 without it at ``activation_memory_budget=0``). So a compiled run
on CPU is measured from the CPU allocator instead: with ``profile_memory=True`` PyTorch
reports every allocation and free of ``c10``'s CPU allocator to the profiler, compiled
kernels' buffers included (``ProfiledCPUMemoryReporter``; torch.profiler docs,
"profile_memory"). This probe keeps a profiling session open while it is entered and, at
each reading, closes it, adds its memory events to a running count and opens the next
(about 1-2 ms per reading).

Example usage::

    probe = CpuAllocatorProbe()
    with probe:
        model = build()            # counted: allocated while the probe is entered
        probe.reset_peak()
        loss = model(x).sum()
        print(probe.live_bytes, probe.peak_bytes)

Known limitations:
    - Bytes allocated before the probe was entered, or between two of its sessions, are
      not counted, and neither are their frees: the probe counts a free only for an
      address it saw allocated (PyTorch's reporter also reports frees of blocks allocated
      under an earlier profiling session, which would read as negative bytes).
    - No memory categories: the engine estimates them from the tensors it knows, as on
      CUDA (:meth:`ckptlab.worker.measure.meter.Meter.breakdown`).
    - ``limit_bytes`` is checked at each reading, not at each allocation: a run can pass
      the limit inside a phase and fail at its end.
    - Kineto prints two lines per session on standard error; the probe silences file
      descriptor 2 while it opens and closes one.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from torch._C._profiler import _ExtraFields_Allocation as _Allocation
from torch.profiler import ProfilerActivity, profile

from ckptlab.worker.measure.memory import SimulatedOutOfMemoryError

__all__ = ["CpuAllocatorProbe"]


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 to /dev/null for the ``with`` block (kineto logs session starts
    and stops there, twice per reading)."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _allocations(session: profile) -> list[tuple[int, int]]:
    """(address, bytes) of every allocator event of a finished profiling session, in order;
    a free has negative bytes.

    From the session's event tree (``_ExtraFields_Allocation``: ``ptr``, ``alloc_size``),
    not the flat event list, because only the tree gives the address: PyTorch's CPU memory
    reporter remembers sizes across sessions, so a session also reports frees of blocks
    allocated in an earlier one, before this probe was entered (measured: a reading of 0 B
    for 64 KiB of live checkpoint outputs after an earlier model was freed mid-window).
    """
    found: list[tuple[int, int, int, int]] = []
    stack = list(session.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        fields = event.extra_fields
        if isinstance(fields, _Allocation):
            found.append((event.start_time_ns, fields.id, fields.ptr, fields.alloc_size))
    found.sort()
    return [(ptr, nbytes) for _, _, ptr, nbytes in found]


class CpuAllocatorProbe:
    """Live and peak bytes of the CPU allocator while entered, from profiler memory events.

    Args:
        limit_bytes: if set, a reading above it raises
            :class:`ckptlab.worker.measure.memory.SimulatedOutOfMemoryError`. Default: None.

    Attributes (bytes, counted from the moment the probe was entered):
        live_bytes: allocated and not yet freed.
        peak_bytes: the highest ``live_bytes`` since :meth:`reset_peak`.
        window_peak_bytes: the highest since :meth:`reset_window`.
    """

    def __init__(self, limit_bytes: int | None = None):
        self.limit_bytes = limit_bytes
        self._live = 0
        self._peak = 0
        self._window = 0
        self._mine: set[int] = set()  # addresses of the blocks allocated while entered, not freed
        self._session: profile | None = None

    def __enter__(self) -> CpuAllocatorProbe:
        self._open()
        return self

    def __exit__(self, *exc) -> None:
        self._close()

    def _open(self) -> None:
        session = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        with _quiet_stderr():
            session.__enter__()
        self._session = session

    def _close(self) -> None:
        session, self._session = self._session, None
        if session is None:
            return
        with _quiet_stderr():
            session.__exit__(None, None, None)
        for ptr, nbytes in _allocations(session):
            if nbytes > 0:
                self._mine.add(ptr)
            elif ptr in self._mine:
                self._mine.remove(ptr)
            else:
                continue  # a free of a block allocated before the probe was entered
            self._live += nbytes
            self._peak = max(self._peak, self._live)
            self._window = max(self._window, self._live)

    def _read(self) -> None:
        if self._session is not None:
            self._close()
            self._open()
        if self.limit_bytes is not None and self._live > self.limit_bytes:
            raise SimulatedOutOfMemoryError(self._live, self.limit_bytes)

    @property
    def live_bytes(self) -> int:
        """Bytes allocated and not freed since the probe was entered."""
        self._read()
        return self._live

    @property
    def peak_bytes(self) -> int:
        """The highest live bytes since :meth:`reset_peak`."""
        self._read()
        return self._peak

    @property
    def window_peak_bytes(self) -> int:
        """The highest live bytes since :meth:`reset_window`."""
        self._read()
        return self._window

    def reset_peak(self) -> None:
        """Start a new peak window at the current live bytes."""
        self._read()
        self._peak = self._live

    def reset_window(self) -> None:
        """Start a new inner window at the current live bytes."""
        self._read()
        self._window = self._live
