"""The prediction targets: ``cpu`` and a table of GPUs, declared once.

A prediction (:mod:`ckptlab.worker.predict`) runs one training step of a spec with fake
tensors on the CPU under the exact live-tensor tracker, then models what changes the bytes
on the target device: which scaled-dot-product-attention backend CUDA picks (they save very
different tensors for backward), the CUDA caching allocator's rounding and segments, the
cuBLAS workspace, and the CUDA context (an NVML-level figure, an estimate). ``GET /api/meta``
serves the table (``targets``); ``ckptlab predict --target NAME`` and ``POST
/api/predictions`` name a row.

Sources: capacities are ``nvidia-smi``'s total memory of each card (MiB), compute
capabilities NVIDIA's CUDA GPUs list; SDPA's selection rules are PyTorch's
``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`` (flash: sm80-sm90, fp16/bf16,
head dim <= 256 and a multiple of 8, no arbitrary mask; memory-efficient: sm50+, fp32, fp16
or bf16, head dim a multiple of 8 (4 for fp32); else math); the allocator's rules are
``c10/cuda/CUDACachingAllocator.cpp`` (blocks rounded up to 512 B; blocks of at most 1 MiB
from 2 MiB segments; up to 10 MiB from 20 MiB segments; larger rounded up to 2 MiB). The
cuBLAS workspace and the context are estimates, stated as such: until ``scripts/gpu-check``
has measured a card, its predictions say they are unverified (:data:`UNVERIFIED`).

Example usage::

    from ckptlab.prediction.targets import get_target

    h100 = get_target("h100-80gb")
    h100.capacity_bytes        # 85520809984
    h100.sdpa_backend("bf16", head_dim=128, has_mask=False)   # 'flash'

Known limitations:
    - One GPU per target; sharded runs are the "sharded training" issue.
    - A card's capacity differs a little between board variants (PCIe / SXM, ECC on or
      off); pass ``capacity_bytes`` for yours.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

__all__ = [
    "MAX_CAPACITY_BYTES",
    "Target",
    "TARGETS",
    "CPU_TARGET",
    "SdpaBackend",
    "UNVERIFIED",
    "get_target",
    "target_names",
    "register_target",
    "registered",
    "round_allocation",
]

MiB = 1024**2
SdpaBackend = Literal["flash", "efficient", "math", "cpu"]
#: What a prediction for a GPU target says until scripts/gpu-check has measured that card.
UNVERIFIED = "unverified on CUDA: no scripts/gpu-check run has measured this card yet (docs/benchmarks.md)"
#: Largest ``capacity_bytes`` a prediction may be given: 1 PiB, above any device (and a
#: 64-bit column); the API, the CLI and ``ckptlab.predict`` check against it.
MAX_CAPACITY_BYTES = 2**50
#: CUDA caching allocator: every block is a multiple of this many bytes.
CUDA_BLOCK_BYTES = 512


def round_allocation(nbytes: int, block: int) -> int:
    """``nbytes`` rounded up to a multiple of ``block`` (0 or 1: unchanged), as the CUDA
    caching allocator rounds each block (``round_size``: 512 B)."""
    return nbytes if block <= 1 else -(-nbytes // block) * block


@dataclass(frozen=True)
class Target:
    """A device a run can be predicted for.

    Attributes:
        name: its id (``h100-80gb``; the API's and the CLI's ``target``).
        label: how the pages show it.
        device: ``cpu`` or ``cuda``.
        capacity_bytes: the card's memory (bytes, ``nvidia-smi``'s total), or None for
            ``cpu`` (the host's: no "fits" verdict).
        compute_capability: ``(major, minor)`` for CUDA, None for CPU.
        block_bytes: the allocator's rounding of each block (512 on CUDA, 1 on CPU: the
            tracker's exact storage bytes).
        cublas_workspace_bytes: what cuBLAS(Lt) takes from the caching allocator on a
            thread's first matmul (PyTorch sizes it per architecture, 32 MiB on sm90, else
            4 MiB). PyTorch keeps one workspace per cuBLAS handle and handles are per thread
            (``aten/src/ATen/cuda/CublasHandlePool.cpp``), so a training step holds two: the
            caller's (forward) and autograd's device thread's (backward, recomputation
            included); see :attr:`cublas_workspaces_bytes`.
        context_bytes: the CUDA context and kernels' device memory outside the allocator,
            as NVML counts it (NVML used less reserved bytes; an estimate, measured cards
            excepted).
        verified: a ``scripts/gpu-check`` table in docs/benchmarks.md measured this card.
    """

    name: str
    label: str
    device: Literal["cpu", "cuda"]
    capacity_bytes: int | None
    compute_capability: tuple[int, int] | None
    block_bytes: int = CUDA_BLOCK_BYTES
    cublas_workspace_bytes: int = 0
    context_bytes: int = 0
    verified: bool = False

    @property
    def cublas_workspaces_bytes(self) -> int:
        """The cuBLAS workspaces a training step's allocator holds once forward and backward
        each ran a matmul (bytes): two, one per thread (see ``cublas_workspace_bytes``);
        measured on an H200 by ``scripts/gpu-check`` (docs/benchmarks.md, 2026-11-26: every
        measured peak was one workspace above a one-workspace prediction)."""
        return 2 * self.cublas_workspace_bytes

    def sdpa_backend(self, dtype: str, *, head_dim: int, has_mask: bool) -> SdpaBackend:
        """The backend ``torch.nn.functional.scaled_dot_product_attention`` runs on this
        target for ``dtype`` (``fp32``, ``fp16``, ``bf16``), ``head_dim`` and whether an
        arbitrary attention mask is passed (``is_causal`` is no mask). ``cpu`` on CPU."""
        if self.device == "cpu" or self.compute_capability is None:
            return "cpu"
        cc = self.compute_capability
        half = dtype in ("fp16", "bf16")
        if half and (8, 0) <= cc <= (9, 0) and head_dim <= 256 and head_dim % 8 == 0 and not has_mask:
            return "flash"
        if cc >= (5, 0) and head_dim % (8 if half else 4) == 0:
            return "efficient"
        return "math"

    def public(self) -> dict[str, Any]:
        """What ``GET /api/meta`` serves of it (JSON)."""
        cc = self.compute_capability
        return {
            "name": self.name,
            "label": self.label,
            "device": self.device,
            "capacity_bytes": self.capacity_bytes,
            "compute_capability": f"{cc[0]}.{cc[1]}" if cc else None,
            "block_bytes": self.block_bytes,
            "cublas_workspace_bytes": self.cublas_workspace_bytes,
            "context_bytes": self.context_bytes,
            "verified": self.verified,
        }


_TARGETS: dict[str, Target] = {}
#: Every target by name, read-only (a live view: a target registered later is in it).
TARGETS: Mapping[str, Target] = MappingProxyType(_TARGETS)


def register_target(target: Target) -> Target:
    """Add ``target`` to the table; returns it.

    Raises:
        ValueError: its name is taken, or a CUDA target has no capacity or capability.
    """
    if target.name in _TARGETS:
        raise ValueError(f"target {target.name!r} is already registered")
    if target.device == "cuda" and (not target.capacity_bytes or target.compute_capability is None):
        raise ValueError(f"CUDA target {target.name!r} needs capacity_bytes and compute_capability")
    _TARGETS[target.name] = target
    return target


@contextmanager
def registered(target: Target) -> Iterator[Target]:
    """``target`` in the table for the duration (for tests)."""
    register_target(target)
    try:
        yield target
    finally:
        _TARGETS.pop(target.name, None)


def get_target(name: str) -> Target:
    """The target called ``name``.

    Raises:
        ValueError: no such target, naming the known ones.
    """
    try:
        return _TARGETS[name]
    except KeyError:
        raise ValueError(f"unknown target {name!r}; expected one of {', '.join(target_names())}") from None


def target_names() -> list[str]:
    """Every target's name, ``cpu`` first, then by capacity."""
    return [t.name for t in sorted(_TARGETS.values(), key=lambda t: (t.device != "cpu", t.capacity_bytes or 0))]


CPU_TARGET = register_target(Target("cpu", "this machine's CPU", "cpu", None, None, block_bytes=1))
_CONTEXT = 600 * MiB  # CUDA 12 context + kernels, NVML-level: an estimate (not measured here)
#: NVML used less reserved bytes on an H200 (driver 580.159, torch 2.11.0+cu130), the same in
#: 16 of 18 runs of ``scripts/gpu-check`` on 2026-11-26 (an hf llama read 18 MiB more).
_H200_CONTEXT = 1366 * MiB
for _name, _label, _mib, _cc, _context, _verified in (
    ("h100-80gb", "NVIDIA H100 80GB", 81559, (9, 0), _CONTEXT, False),
    ("h200-141gb", "NVIDIA H200 141GB", 143771, (9, 0), _H200_CONTEXT, True),
    ("a100-40gb", "NVIDIA A100 40GB", 40960, (8, 0), _CONTEXT, False),
    ("a100-80gb", "NVIDIA A100 80GB", 81920, (8, 0), _CONTEXT, False),
    ("l4-24gb", "NVIDIA L4 24GB", 23034, (8, 9), _CONTEXT, False),
    ("rtx4090-24gb", "NVIDIA GeForce RTX 4090 24GB", 24564, (8, 9), _CONTEXT, False),
):
    register_target(
        Target(
            _name,
            _label,
            "cuda",
            _mib * MiB,
            _cc,
            cublas_workspace_bytes=(32 if _cc >= (9, 0) else 4) * MiB,
            context_bytes=_context,
            verified=_verified,
        )
    )
