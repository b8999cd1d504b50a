"""Which devices a worker runs on: its slots, and the device a slot hands the engine."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence

__all__ = [
    "default_worker_id",
    "detect_devices",
    "slot_devices",
    "engine_device",
    "default_cpu_slots",
    "cpu_threads_per_slot",
]


def default_worker_id() -> str:
    """``host:pid``, unique among live workers."""
    return f"{socket.gethostname()}:{os.getpid()}"


def detect_devices() -> list[str]:
    """The devices a worker uses by default: every visible CUDA device, else ``["cpu"]``.

    Counts GPUs with NVML (``nvidia-ml-py``) without importing torch, and honours
    ``CUDA_VISIBLE_DEVICES``.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        n = len([d for d in visible.split(",") if d.strip() and not d.strip().startswith("-")])
    else:
        try:
            import pynvml

            pynvml.nvmlInit()
            try:
                n = pynvml.nvmlDeviceGetCount()
            finally:
                pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - no driver, no library: no GPU
            n = 0
    return [f"cuda:{i}" for i in range(n)] or ["cpu"]


def slot_devices(devices: Sequence[str] | None = None, *, cpu_slots: int = 1) -> list[str]:
    """One entry per slot: each device once, except ``cpu`` which gets ``cpu_slots`` slots.

    Args:
        devices: e.g. ``["cuda:0", "cuda:1"]`` or ``["cpu"]``. Default: :func:`detect_devices`.
        cpu_slots: concurrent experiments on ``cpu`` (default 1).

    Raises:
        ValueError: ``cpu_slots`` < 1, no device, or a device other than ``cpu``,
            ``cuda`` or ``cuda:N``.
    """
    if cpu_slots < 1:
        raise ValueError(f"cpu_slots must be at least 1, got {cpu_slots}")
    names = [d.strip() for d in (detect_devices() if devices is None else devices) if d.strip()]
    if not names:
        raise ValueError("no device given")
    slots: list[str] = []
    for name in dict.fromkeys(names):
        kind, _, index = name.partition(":")
        if kind not in ("cpu", "cuda") or (index and (kind == "cpu" or not index.isdigit())):
            raise ValueError(f"unknown device {name!r}; expected cpu, cuda or cuda:N")
        slots.extend([name] * (cpu_slots if name == "cpu" else 1))
    return slots


def engine_device(spec_device: str, slot_device: str | None) -> str | None:
    """The ``device`` a slot hands the engine for a spec (None: the spec's own).

    A CUDA slot runs ``auto`` and ``cuda`` specs on its GPU and ``cpu`` specs on the CPU; a
    CPU slot runs ``auto`` and ``cpu`` specs on the CPU and leaves a ``cuda`` spec to the
    engine, which fails it when CUDA is missing rather than measure it on the wrong device.
    """
    if slot_device is None or spec_device == "cpu":
        return None
    if slot_device == "cpu":
        return "cpu" if spec_device == "auto" else None
    return slot_device


def default_cpu_slots() -> int:
    """Concurrent CPU experiments a worker runs by default: one per 4 cores,
    ``max(1, os.cpu_count() // 4)`` (a small model's step is too short to keep more than a
    few threads busy, so a few slots of 4 threads finish a sweep sooner than one of all)."""
    return max(1, (os.cpu_count() or 1) // 4)


def cpu_threads_per_slot(cpu_slots: int) -> int:
    """Torch threads for each of ``cpu_slots`` CPU slots, so that they share the host's cores
    instead of oversubscribing them: ``max(1, os.cpu_count() // cpu_slots)``."""
    return max(1, (os.cpu_count() or 1) // max(1, cpu_slots))
