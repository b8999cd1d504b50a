"""Memory readings for the engine: the CPU live-tensor tracker or the CUDA allocator,
behind one :class:`Meter`."""

from __future__ import annotations

import contextlib
import statistics
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import is_fake
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ckptlab.domain import MemoryCategory
from ckptlab.worker.measure.allocator_probe import CpuAllocatorProbe
from ckptlab.worker.measure.memory import CudaProbe, LiveTensorTracker, inner_tensors

__all__ = [
    "Meter",
    "storage_bytes",
    "optimizer_tensors",
    "tag_optimizer_state",
    "READING_EXTRA_KEYS",
    "memory_reading",
    "memory_is_flat",
    "growth_per_step",
]

#: The memory readings in a step record's ``extra`` that two steps must share to be "the
#: same" (besides ``allocated_bytes`` and ``peak_allocated_bytes``); NVML's device-wide
#: bytes and CUDA's reserved bytes are left out: other processes and the caching allocator
#: move them, not the model.
READING_EXTRA_KEYS = (
    "activation_bytes",
    "forward_peak_bytes",
    "backward_peak_bytes",
    "optimizer_peak_bytes",
    "recompute_peak_bytes",
    "memory_at_forward_end",
    "memory_at_peak",
    "params_without_grad",
)


def _plain(tensors: Iterator[torch.Tensor]) -> Iterator[torch.Tensor]:
    """``tensors`` with each wrapper subclass (a ``DTensor``) replaced by the tensors it wraps."""
    for t in tensors:
        if type(t) is not torch.Tensor and is_traceable_wrapper_subclass(t):
            yield from _plain(iter(inner_tensors(t)))
        else:
            yield t


def storage_bytes(tensors: Iterator[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a view counts its storage once, by
    its ``StorageImpl``; a fake tensor's storage by its identity; a storage resized to
    nothing, as FSDP2 frees its all-gathered parameters, is 0 B)."""
    seen: dict[int, int] = {}
    for t in _plain(tensors):
        st = t.untyped_storage()
        seen[id(st) if is_fake(t) else st._cdata] = st.nbytes()
    return sum(seen.values())


def optimizer_tensors(opt: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    """Every tensor in the optimizer's per-parameter state (Adam's ``exp_avg`` ...)."""
    for state in opt.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor):
                yield v


class Meter:
    """Reads memory for the engine from the CPU tracker or the CUDA allocator.

    Args:
        dev: the run's device; CUDA reads ``torch.cuda`` allocator statistics (and NVML when
            present), CPU counts live tensors with :class:`ckptlab.worker.measure.memory.LiveTensorTracker`.
        limit_bytes: the CPU tracker's emulated memory limit (bytes), or None.
        allocator_events: on CPU, read the allocator through profiler memory events
            (:class:`ckptlab.worker.measure.allocator_probe.CpuAllocatorProbe`) instead of tracking tensors:
            for compiled code, which does not run under the tracker's dispatch mode.
            Memory categories are then estimated as on CUDA. Default: False.
        tracker: on CPU, the live-tensor tracker to read (a prediction's, configured for
            its target: :mod:`ckptlab.worker.predict`) instead of a new default one.
            Default: None.

    Attributes:
        exact: the readings are the CPU tracker's exact per-tensor counts (with categories).
        source: where the bytes come from, in words (the summary's ``memory_source``).
    """

    def __init__(
        self,
        dev: torch.device,
        limit_bytes: int | None,
        *,
        allocator_events: bool = False,
        tracker: LiveTensorTracker | None = None,
    ):
        self.dev = dev
        self.cuda = dev.type == "cuda"
        self.exact = not self.cuda and not allocator_events
        self.probe: CudaProbe | LiveTensorTracker | CpuAllocatorProbe
        if self.cuda:
            self.probe, self.source = CudaProbe(dev), "cuda allocator"
        elif allocator_events:
            self.probe, self.source = CpuAllocatorProbe(limit_bytes), "cpu allocator (profiler memory events)"
        else:
            self.probe = tracker if tracker is not None else LiveTensorTracker(limit_bytes=limit_bytes)
            self.source = "live tensors"
        #: False during the CPU timing pass: hooks then leave the tracker alone.
        self.tracking = True
        #: The timeline recorder of the step being recorded (told of recomputations), or None.
        self.timeline: Any = None
        #: On CUDA, the live-tensor tracker a recorded step's timeline is read from (its
        #: categories kept as the CPU tracker's are), or None.
        self.shadow: LiveTensorTracker | None = None
        self.recompute_peak = 0
        self.optimizer_states_tagged = 0
        self._recompute_start = 0
        self._saved_category = MemoryCategory.OTHER
        self._nvml = None
        if self.cuda:
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml.nvmlDeviceGetHandleByIndex(dev.index or 0)
            except Exception:  # noqa: BLE001 - NVML is optional (no driver library, containers)
                self._nvml = None

    def mode(self) -> contextlib.AbstractContextManager:
        """The context a measured step runs in (the tracker's dispatch mode on CPU)."""
        return contextlib.nullcontext() if self.cuda else self.probe  # type: ignore[return-value]

    @property
    def rng_state_bytes(self) -> int:
        """Bytes of live RNG states among the readings: the CPU tracker's count of the states
        ``checkpoint(preserve_rng_state=True)`` keeps (issue 19); 0 where the readings do not
        hold them (CUDA: host memory) or cannot tell them apart (the CPU allocator probe)."""
        return self.probe.rng_state_bytes if self.exact else 0

    @property
    def counts_rng_states(self) -> bool:
        """Whether the readings hold the RNG states checkpoints keep (the CPU tracker's,
        unless it was made without them: a prediction for a CUDA device)."""
        return self.exact and self.probe.count_rng_states

    def sync(self) -> None:
        """Wait for the device (``torch.cuda.synchronize`` on CUDA)."""
        if self.cuda:
            torch.cuda.synchronize(self.dev)

    @property
    def category(self) -> str:
        """The category new tensors get now (CPU tracker; ``other`` elsewhere)."""
        return self.probe.category if self.exact else MemoryCategory.OTHER.value

    def set_category(self, category: str) -> None:
        """Tag tensors created from now on with ``category`` (CPU; on CUDA, a recorded
        step's :attr:`shadow`)."""
        if self.tracking and self.exact:
            self.probe.category = category
        if self.shadow is not None:
            self.shadow.category = category

    def retag(self, tensors, category: str) -> None:
        """Move ``tensors``' bytes to ``category`` (CPU; on CUDA, a recorded step's :attr:`shadow`)."""
        if self.tracking and self.exact:
            for t in tensors:
                self.probe.retag(t, category)
        if self.shadow is not None:
            for t in tensors:
                self.shadow.retag(t, category)

    def on_recompute(self, starting: bool) -> None:
        """Hook for :class:`ckptlab.worker.engine.strategies.CheckpointedGroup` around a recomputation."""
        if not self.tracking:
            return
        if self.timeline is not None:
            self.timeline.recompute(starting)
        if starting:
            self._recompute_start = self.probe.live_bytes
            if not self.cuda:
                self.probe.reset_window()
            if self.exact:
                self._saved_category = self.probe.category
                self.probe.category = MemoryCategory.ACTIVATIONS
            elif self.shadow is not None:
                self._saved_category = self.shadow.category
                self.shadow.category = MemoryCategory.ACTIVATIONS
            return
        top = self.probe.live_bytes if self.cuda else self.probe.window_peak_bytes
        self.recompute_peak = max(self.recompute_peak, top - self._recompute_start)
        if self.exact:
            self.probe.category = self._saved_category
        elif self.shadow is not None:
            self.shadow.category = self._saved_category

    def nvml_used(self) -> int | None:
        """Device-wide used bytes from NVML (like nvidia-smi), or None off CUDA / without NVML."""
        if self._nvml is None:
            return None
        import pynvml

        return int(pynvml.nvmlDeviceGetMemoryInfo(self._nvml).used)

    def breakdown(self, params, opt, live: int, activations: int, peak: bool) -> dict[str, int]:
        """Bytes per category now (the CPU tracker) or estimated from known tensors (CUDA, the
        CPU allocator probe)."""
        if self.exact:
            return dict(self.probe.peak_by_category if peak else self.probe.by_category)
        p = storage_bytes(iter(params))
        g = storage_bytes(q.grad for q in params if q.grad is not None)
        o = storage_bytes(optimizer_tensors(opt))
        act = max(min(activations, live - p - g - o), 0)
        return {
            MemoryCategory.PARAMETERS.value: p,
            MemoryCategory.GRADIENTS.value: g,
            MemoryCategory.OPTIMIZER_STATE.value: o,
            MemoryCategory.ACTIVATIONS.value: act,
            MemoryCategory.OTHER.value: max(live - p - g - o - act, 0),
        }


class _TaggingState(dict):
    """One parameter's optimizer state that tags each tensor put into it as
    ``optimizer_state`` the moment the optimizer stores it."""

    def __init__(self, meter: Meter):
        super().__init__()
        self._meter = meter

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        if isinstance(value, torch.Tensor):
            self._meter.retag([value], MemoryCategory.OPTIMIZER_STATE)


def tag_optimizer_state(opt: torch.optim.Optimizer, meter: Meter) -> None:
    """Make ``opt`` tag its state as it creates it (Adam's ``exp_avg`` / ``exp_avg_sq`` in
    its first ``step()``), so that a peak inside that first step counts the state as
    ``optimizer_state``, not ``other`` (``torch.optim.Optimizer.state`` is a
    ``defaultdict(dict)``; its per-parameter dicts are replaced by tagging ones). Call it
    before the first step."""
    if len(opt.state) == 0:
        opt.state = defaultdict(lambda: _TaggingState(meter))


def memory_reading(record: dict[str, Any]) -> tuple:
    """A step record's memory readings (bytes, and bytes by category), comparable with ``==``."""
    extra = record["extra"]
    return (record["allocated_bytes"], record["peak_allocated_bytes"], *(extra[k] for k in READING_EXTRA_KEYS))


def memory_is_flat(records: Sequence[dict[str, Any]], warmup_steps: int) -> bool:
    """Whether the last two memory-pass steps after the ``warmup_steps`` first ones read
    byte-identical memory (:func:`memory_reading`).

    Once the optimizer state exists a step's memory is deterministic, so every further step
    would read the same: the engine's memory pass stops there (``spec.memory_early_stop``).
    A memory that grows per step never stops it.
    """
    if len(records) < warmup_steps + 2:
        return False
    return memory_reading(records[-1]) == memory_reading(records[-2])


def growth_per_step(records: Sequence[dict[str, Any]]) -> int:
    """Median growth of ``allocated_bytes`` (live bytes at the end of forward) from one step
    to the next, when it grows at every one of at least 3 ``records``; else 0.

    Three steps at least: one increase alone is often the optimizer creating its state
    (Adam's first ``step()`` without warm-up), not a leak.
    """
    live = [r["allocated_bytes"] for r in records]
    steps = [b - a for a, b in zip(live, live[1:], strict=False)]
    if len(live) < 3 or any(d <= 0 for d in steps):
        return 0
    return int(statistics.median(steps))
