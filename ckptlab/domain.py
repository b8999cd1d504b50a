"""The vocabulary of ckptlab, defined once: experiment statuses and memory categories.

Both processes (backend and worker), the CLI, the migrations' CHECK constraint and the
frontend (through ``GET /api/meta``) read these definitions; nothing else spells a status
or a category as a string. This module imports neither torch nor FastAPI.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "Status",
    "MemoryCategory",
    "Unattributed",
    "FINISHED_STATUSES",
    "ACTIVE_STATUSES",
    "STEP_FIELDS",
    "SERIES_METRICS",
    "NOISE_THRESHOLD_PCT",
]


class Status(StrEnum):
    """Lifecycle of an experiment: ``queued`` -> ``running`` -> one finished status.

    Stored as its string value in ``experiments.status`` (a CHECK constraint allows only
    these values). After procrastinate's ``jobs.Status``.
    """

    #: Submitted and waiting for a worker to claim it.
    QUEUED = "queued"
    #: Claimed by a worker; its child process is running the training steps.
    RUNNING = "running"
    #: Every step ran; the summary holds the measurements.
    SUCCEEDED = "succeeded"
    #: Any error other than the ones below, or its worker was lost ``max_attempts`` times.
    FAILED = "failed"
    #: Ran out of real or emulated (``memory_limit_bytes``) memory; the summary says where.
    OOM = "oom"
    #: Killed after ``timeout_s`` seconds (or the worker's default timeout).
    TIMED_OUT = "timed_out"
    #: Cancelled by a user, before it started or while it ran.
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        """Whether this is a final status (no worker will change it again)."""
        return self in FINISHED_STATUSES


#: The final statuses, in display order.
FINISHED_STATUSES: tuple[Status, ...] = (
    Status.SUCCEEDED,
    Status.FAILED,
    Status.OOM,
    Status.TIMED_OUT,
    Status.CANCELLED,
)
#: Statuses an experiment can still leave.
ACTIVE_STATUSES: tuple[Status, ...] = (Status.QUEUED, Status.RUNNING)


#: Numeric per-step fields a step record carries and ``steps`` stores as columns (times in
#: ms, memory in bytes).
STEP_FIELDS: tuple[str, ...] = (
    "forward_ms",
    "backward_ms",
    "optimizer_ms",
    "step_ms",
    "allocated_bytes",
    "peak_allocated_bytes",
    "reserved_bytes",
)

#: Per-step columns a series can be drawn from and the rollup summarises: the
#: :data:`STEP_FIELDS` (times in ms, memory in bytes) and the loss (unitless).
SERIES_METRICS: tuple[str, ...] = (*STEP_FIELDS, "loss")


class MemoryCategory(StrEnum):
    """What a live tensor's bytes are for, after ``torch.distributed._tools.mem_tracker``'s
    ``_MemRefType`` (PARAM, BUFFER, GRAD, OPT, ACT, TEMP).

    The engine tags each storage as it learns what it is; ``memory_at_peak`` and the
    per-step ``extra`` breakdowns are keyed by these values.
    """

    #: Model parameters and buffers (MemTracker's PARAM + BUFFER).
    PARAMETERS = "parameters"
    #: ``.grad`` tensors of the parameters (GRAD).
    GRADIENTS = "gradients"
    #: Optimizer state such as Adam's ``exp_avg`` / ``exp_avg_sq`` (OPT), tagged as created.
    OPTIMIZER_STATE = "optimizer_state"
    #: Tensors created during forward and kept alive for backward (ACT).
    ACTIVATIONS = "activations"
    #: Everything else: the input batch, temporaries of backward and the optimizer step (TEMP).
    OTHER = "other"
    #: FSDP2's all-gathered parameters and their all-gather buffer, alive from a unit's
    #: all-gather to its reshard (``parameters`` then holds this rank's shards).
    UNSHARDED_PARAMETERS = "unsharded_parameters"
    #: Buffers of the gradient collectives: FSDP2's reduce-scatter input (a unit's
    #: unsharded gradients; this rank's sharded gradient is retagged ``gradients`` once
    #: assigned) and DDP's all-reduce buckets.
    COMMUNICATION = "communication"


class Unattributed(StrEnum):
    """The module a memory timeline (issue 34) names a block after when no module's forward
    made it: its place in the step, or ``unknown``. Every other block is named by a module's
    fully-qualified name (``blocks.0.attn``; the root model is ``""``)."""

    #: The input batch and its labels.
    BATCH = "<batch>"
    #: The loss after the model returned, and its backward before any module's.
    LOSS = "<loss>"
    #: The optimizer step's temporaries (its state is named after each parameter's module).
    OPTIMIZER = "<optimizer>"
    #: On CUDA, the allocator's bytes that are no tensor's (cuBLAS workspaces, ...): its
    #: allocated bytes less the tensors' as a recorded step begins.
    NOT_A_TENSOR = "<not a tensor>"
    #: Nothing named it.
    UNKNOWN = "unknown"


#: Step-time differences estimated below 10% are noise by default: the same work timed in
#: separate runs through a worker on a shared 2-core host differs by up to 6-13% (95th
#: percentile of |estimate| over 36-64 pairs of identical runs; ``bench/bench_noise.py``,
#: docs/benchmarks.md "Run-to-run noise"), far beyond the bootstrap interval of one run's
#: steps. A server sets its own (``CKPTLAB_NOISE_THRESHOLD_PCT``).
NOISE_THRESHOLD_PCT = 10.0
