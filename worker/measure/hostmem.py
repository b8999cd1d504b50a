"""Host memory of an experiment's child process: its cap, and telling exhaustion apart.

**The cap.** A worker's child runs under ``RLIMIT_DATA`` (set by :func:`apply_cap` when its
job arrives, before the run), so an allocation past it fails inside the child, which
records ``oom``, instead of the kernel's OOM killer picking a process (maybe the worker,
the database, or the backend). The cap is the child's own data size when the job arrives
(interpreter, torch, engine, database drivers) plus the run's memory limit
(:func:`run_memory_limit`: ``worker_memory_bytes``, or a CPU run's ``memory_limit_bytes``
when lower) plus :func:`runtime_headroom_bytes` for what the runtime adds during a run.

**Why RLIMIT_DATA, not RLIMIT_AS.** ``RLIMIT_AS`` counts address space that is reserved,
not used, and torch reserves a lot of it. Measured with torch 2.11 (CUDA build, 16 cores,
a 8-block MLP trained for 5 steps on CPU): 3.7 GiB of address space after ``import
torch``, 17.3 GiB after the run (each of its 16 intra-op threads reserves a glibc malloc
arena and a stack), 20.7 GiB once CUDA is initialised; CUDA initialisation fails under an
8 GiB ``RLIMIT_AS``, and the process aborts ("cannot allocate memory for thread-local
data") under 4 GiB. The data size (``VmData``: heap and private writable mappings, not
reserved-only ranges) of the same process was 1.29 GiB after import, 1.63 GiB after the
CPU run and 1.88 GiB with CUDA (its device memory is not counted), and CUDA ran under a
2 GiB ``RLIMIT_DATA``. With the CPU-only build on 2 cores: 0.22 GiB after importing the
engine, 0.30 GiB after a small run.

**The headroom.** 512 MiB plus 16 MiB per CPU: the growth during a run measured above was
0.35 GiB for 17 new threads (8 MiB stacks) and 0.25 GiB for a CUDA context.

**Exhaustion.** :func:`is_out_of_memory` recognises a failed allocation in the child (a
Python ``MemoryError``, torch's ``DefaultCPUAllocator`` error); :func:`killed_for_memory`
a child the kernel killed (SIGKILL) with its peak RSS near its limit.
"""

from __future__ import annotations

import os
import re
import resource
import signal
from dataclasses import dataclass
from typing import Any

from ckptlab.spec.experiment import ExperimentSpec

__all__ = [
    "HostCap",
    "RUNTIME_HEADROOM_BYTES",
    "PER_CPU_HEADROOM_BYTES",
    "OOM_KILL_FRACTION",
    "run_memory_limit",
    "runtime_headroom_bytes",
    "apply_cap",
    "applied_cap",
    "proc_status_bytes",
    "peak_rss_bytes",
    "is_out_of_memory",
    "oom_details",
    "killed_for_memory",
]

#: Fixed part of the headroom above the run's memory limit, bytes.
RUNTIME_HEADROOM_BYTES = 512 * 2**20
#: Headroom per CPU (a torch intra-op thread's stack and arena pages), bytes.
PER_CPU_HEADROOM_BYTES = 16 * 2**20
#: A child killed by SIGKILL whose peak RSS reached this fraction of its memory limit ran
#: out of memory (the kernel's OOM killer, or a container's).
OOM_KILL_FRACTION = 0.8

#: What a failed host allocation says (torch's CPU allocator, glibc, the C++ runtime).
_OOM_TEXT = ("can't allocate memory", "not enough memory", "cannot allocate memory", "std::bad_alloc")
_REQUESTED = re.compile(r"tried to allocate (\d+) bytes")


@dataclass(frozen=True)
class HostCap:
    """The cap a child runs under.

    Attributes:
        limit_bytes: the run's memory limit (see :func:`run_memory_limit`).
        cap_bytes: the ``RLIMIT_DATA`` soft limit set: the child's data size at the job,
            plus ``limit_bytes``, plus the runtime headroom.
    """

    limit_bytes: int
    cap_bytes: int


_applied: HostCap | None = None


def run_memory_limit(spec: ExperimentSpec | None, device: str | None, worker_memory_bytes: int) -> int:
    """Host bytes one run may use: ``worker_memory_bytes``, or the spec's
    ``memory_limit_bytes`` when lower and the run is on CPU (on CUDA it caps device memory)."""
    on_cpu = device == "cpu" or (device is None and spec is not None and spec.device == "cpu")
    if spec is not None and spec.memory_limit_bytes is not None and on_cpu:
        return min(worker_memory_bytes, spec.memory_limit_bytes)
    return worker_memory_bytes


def runtime_headroom_bytes() -> int:
    """Bytes the cap allows above the run's limit for the runtime's own growth during a run."""
    return RUNTIME_HEADROOM_BYTES + PER_CPU_HEADROOM_BYTES * (os.cpu_count() or 1)


def proc_status_bytes(field: str, pid: int | str = "self") -> int | None:
    """A ``kB`` field of ``/proc/<pid>/status`` (``VmData``, ``VmHWM``, ...) in bytes; None
    where there is no such process or no ``/proc``."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def peak_rss_bytes() -> int:
    """This process's peak resident set size, bytes (``ru_maxrss`` is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def apply_cap(limit_bytes: int) -> HostCap | None:
    """Cap this process's data size at its current size + ``limit_bytes`` + the headroom.

    Call it in a worker's child only (the cap stays for the process's life). Returns the
    cap, or None where ``/proc`` is missing (no cap is set then). A lower hard limit set by
    the administrator is kept.
    """
    global _applied
    baseline = proc_status_bytes("VmData")
    if baseline is None:
        return None
    cap = baseline + limit_bytes + runtime_headroom_bytes()
    _soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))
    _applied = HostCap(limit_bytes=limit_bytes, cap_bytes=cap)
    return _applied


def applied_cap() -> HostCap | None:
    """The cap :func:`apply_cap` set in this process, or None."""
    return _applied


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is a failed host allocation: a ``MemoryError``, or a ``RuntimeError``
    saying "can't allocate memory" / "DefaultCPUAllocator: not enough memory"."""
    if isinstance(exc, MemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(t in str(exc).lower() for t in _OOM_TEXT)


def oom_details(where: dict[str, Any], exc: BaseException, live_bytes: int | None) -> dict[str, Any]:
    """The summary's ``oom`` of a run whose host allocation failed: ``phase``, ``step``,
    ``live_bytes`` (tensor bytes the tracker saw, or None), ``rss_bytes`` (peak RSS),
    ``requested_bytes`` (the failed allocation, when torch says), ``limit_bytes`` and
    ``cap_bytes`` (see :class:`HostCap`; None when no cap was set)."""
    requested = _REQUESTED.search(str(exc))
    cap = _applied
    return {
        **where,
        "live_bytes": live_bytes,
        "rss_bytes": peak_rss_bytes(),
        "requested_bytes": int(requested.group(1)) if requested else None,
        "limit_bytes": cap.limit_bytes if cap else None,
        "cap_bytes": cap.cap_bytes if cap else None,
    }


def killed_for_memory(exitcode: int | None, rss_bytes: int | None, limit_bytes: int | None) -> bool:
    """Whether a child that exited with ``exitcode`` (``-9``: SIGKILL) ran out of memory:
    killed by SIGKILL with its peak RSS at least :data:`OOM_KILL_FRACTION` of its limit."""
    if exitcode != -signal.SIGKILL or rss_bytes is None or not limit_bytes:
        return False
    return rss_bytes >= OOM_KILL_FRACTION * limit_bytes
