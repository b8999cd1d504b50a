"""The run summary and the step record: what a run measured, as typed models that the engine writes through
and every reader reads through (the ``experiments.summary`` JSON column in, a
:class:`RunSummary` out).

The engine (:func:`ckptlab.worker.engine.run.run_experiment`) validates its summary with
:meth:`RunSummary.dump` before it is stored; the backend's sweep rows, comparison and
exports, the CLI and ``ckptlab.profile`` read it with :meth:`RunSummary.load`, which never
raises: a summary from an older version (a key missing) takes the field's default, a key
holding something of another type (a hand-edited row) is dropped to its default, and a
key this version does not know is kept (``extra="allow"``) and shown as it is.

Units: bytes for ``*_bytes``, milliseconds for ``*_ms``, seconds for ``*_s``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_serializer

__all__ = [
    "PhaseSpread",
    "Finding",
    "PredictionInfo",
    "RankFigures",
    "ShardedGradientCheck",
    "PER_STEP_FIELDS",
    "RunSummary",
    "StepRecord",
]


class PhaseSpread(BaseModel):
    """Median and spread of one phase's step times, ms (:class:`ckptlab.analysis.stats.Spread`)."""

    model_config = ConfigDict(extra="allow")

    n: int
    median: float
    q1: float
    q3: float
    iqr: float | None = None
    ci_low: float
    ci_high: float


class Finding(BaseModel):
    """A setting that does nothing or backfires (:func:`ckptlab.analysis.explain.findings`)."""

    model_config = ConfigDict(extra="allow")

    code: str
    message: str


class PredictionInfo(BaseModel):
    """What a prediction states beside the figures it predicts (``ckptlab.worker.predict``):
    which target, how, how far it can be off, and for a GPU target whether it fits.

    Bytes throughout; ``margin_bytes`` is the capacity less the predicted device-used bytes
    (negative: short by that much).
    """

    model_config = ConfigDict(extra="allow")

    target: str = Field(description="the target's name (ckptlab.prediction.targets)")
    method: str = Field(description="how the figures were obtained, in words")
    error_bound: str = Field(description="how far they can be off, in words (unverified on CUDA until measured)")
    capacity_bytes: int | None = Field(None, description="the device's memory; None on cpu")
    peak_reserved_bytes: int | None = Field(None, description="predicted CUDA caching allocator reserved peak")
    device_used_bytes: int | None = Field(None, description="reserved + CUDA context, as NVML counts (estimate)")
    fits: bool | None = Field(None, description="device_used_bytes <= capacity_bytes (None on cpu)")
    margin_bytes: int | None = None
    fixed_bytes: int | None = Field(None, description="parameters + gradients + optimizer state at the peak")
    sdpa_backend: str | None = Field(None, description="the attention backend the target runs, when the model has one")
    notes: list[str] = Field(default_factory=list, description="what would change the verdict, and why")


class RankFigures(BaseModel):
    """One rank's memory in a sharded run (bytes), as its own tracker counted it."""

    rank: int = Field(ge=0)
    peak_allocated_bytes: int | None = None
    peak_phase: Literal["forward", "backward", "optimizer"] | None = None
    activation_bytes: int | None = None
    memory_at_peak: dict[str, int] = Field(default_factory=dict, description="bytes by memory category")
    memory_at_forward_end: dict[str, int] = Field(default_factory=dict)
    reserved_bytes: int | None = None

    @classmethod
    def of(cls, rank: int, summary: RunSummary) -> RankFigures:
        """Rank ``rank``'s figures: the same-named fields of its own run's ``summary``."""
        return cls(rank=rank, **{name: getattr(summary, name) for name in cls.model_fields if name != "rank"})


class PairedOverhead(BaseModel):
    """A paired timing pass's step-time overhead over its un-checkpointed copy, as the worker
    computed it when the run finished (:func:`ckptlab.analysis.stats.paired_ratio_ci` of
    :meth:`RunSummary.paired_rounds`): reads serve it instead of bootstrapping every timed
    step again (issue 33). Percent: ``100 * (median per-round ratio - 1)``."""

    estimate_pct: float
    low_pct: float = Field(description="95% CI, low end (%)")
    high_pct: float = Field(description="95% CI, high end (%)")
    rounds: int = Field(ge=1, description="paired rounds it was computed from")
    clock: str = Field(description="the clock of the rounds: CPU time or wall time")


class HostLoad(BaseModel):
    """The host's load when a run's timing pass ended (``os.getloadavg``): how busy the
    machine was while its step times were taken (a comparison of separate runs reads it)."""

    load_1m: float = Field(ge=0, description="1-minute load average")
    cpus: int = Field(ge=1, description="the host's logical CPUs")
    threads: int = Field(ge=1, description="threads of the run's own timing pass (its share of the load)")
    cpu_share: float | None = Field(
        None,
        ge=0,
        description="CPU time of the timed steps over their wall time and threads (CPU runs): 1 on a quiet host",
    )
    heap_kept: bool | None = Field(
        None,
        description="CPU runs: the process's heap kept freed memory, so steps did not fault pages in "
        "(ckptlab.worker.measure.heap); None: a CUDA run, or one stored before this was recorded",
    )


class ShardedGradientCheck(BaseModel):
    """A sharded run's gradients against one process's on the same global batch and weights:
    every parameter's full gradient (FSDP2: its shards all-gathered; DDP: the all-reduced
    mean) compared with the single process's, both in eval mode (dropout off, batch-norm on
    running statistics: the ranks' batch statistics differ from the global batch's by
    design). ``match`` when the worst relative difference, max|a - b| / max|b| per
    parameter, is at most ``tolerance``."""

    match: bool
    params_compared: int
    worst_param: str | None = None
    worst_rel_error: float
    tolerance: float
    loss_diff: float | None = None


#: The summary's per-step lists: their length is the run's timed steps (up to 100,000), so a
#: run of 1,000 timed steps carries about 76 KB of them against ~3.5 KB for everything else
#: (measured on a tiny transformer's summary). ``GET /api/experiments?per_step=false`` and
#: ``GET /api/sweeps/{id}?per_step=false`` serve runs without them; one run's
#: ``GET /api/experiments/{id}`` always has them.
PER_STEP_FIELDS: tuple[str, ...] = (
    "step_times_ms",
    "step_cpu_ms",
    "paired_baseline_step_times_ms",
    "paired_baseline_cpu_ms",
)


class RunSummary(BaseModel):
    """What one run measured (:func:`ckptlab.worker.engine.run.run_experiment` documents each field's
    source). Every field is optional: a failed run stores only ``oom`` or ``failure``
    details, a CPU run no ``reserved_bytes``.

    Example usage::

        summary = RunSummary.load(experiment.summary)
        if summary.gradients_match is False:
            print(summary.grad_worst_param)
    """

    model_config = ConfigDict(extra="allow", allow_inf_nan=False, strict=True, validate_assignment=True)

    # Where it ran.
    device: str | None = None
    device_name: str | None = None
    environment: dict[str, Any] = Field(default_factory=dict)
    torch_version: str | None = None
    # Memory (bytes).
    activation_bytes: int | None = Field(None, description="live bytes a forward leaves (median over steps)")
    rng_state_bytes: int | None = Field(
        None,
        description="of activation_bytes, the RNG states the checkpoints keep with preserve_rng_state "
        "(CPU: 5,056 B each; 0 on CUDA, where they are host memory outside the allocator's figures)",
    )
    peak_allocated_bytes: int | None = None
    recompute_peak_bytes: int | None = None
    reserved_bytes: int | None = Field(None, description="CUDA caching allocator's reserved bytes (max)")
    nvml_used_bytes: int | None = None
    memory_at_peak: dict[str, int] = Field(default_factory=dict, description="bytes by memory category")
    memory_at_forward_end: dict[str, int] = Field(default_factory=dict)
    peak_phase: Literal["forward", "backward", "optimizer"] | None = None
    activation_bytes_at_peak: int | None = None
    peak_explanation: str | None = None
    memory_steps_run: int | None = None
    memory_steps_requested: int | None = None
    memory_growth_bytes_per_step: int | None = None
    snapshot_path: str | None = None
    memory_source: str | None = Field(
        None, description="where the bytes come from: live tensors (CPU tracker), cpu allocator or cuda allocator"
    )
    # Time (ms).
    timing_pass: Literal["timed", "memory"] | None = None
    timing: dict[str, PhaseSpread | None] = Field(default_factory=dict)
    step_time_ms: float | None = None
    forward_ms: float | None = None
    backward_ms: float | None = None
    optimizer_ms: float | None = None
    step_times_ms: list[float] = Field(default_factory=list, description="every timed step, ms")
    claim_to_first_step_s: float | None = None
    step_cpu_ms: list[float] = Field(default_factory=list, description="process CPU time of every timed step, ms")
    paired_with: str | None = Field(None, description="the strategy whose copy each timed step was paired with")
    paired_baseline_step_times_ms: list[float] = Field(
        default_factory=list, description="the paired copy's step times, ms, round by round with step_times_ms"
    )
    paired_baseline_cpu_ms: list[float] = Field(default_factory=list, description="its CPU times, ms")
    pairing_skipped: str | None = Field(None, description="why the timing pass was not paired")
    paired_overhead: PairedOverhead | None = Field(None, description="the paired rounds' overhead, computed once")
    host_load: HostLoad | None = Field(None, description="the host's load when the timing pass ended")
    timing_threads: int | None = Field(
        None, description="torch threads the CPU timing pass ran on (setting timing_cpu_threads, default 1)"
    )
    compile_ms: float | None = Field(None, description="torch.compile's warm-up step, apart from the step times")
    # The model and its gradients.
    param_count: int | None = None
    params_without_grad: int | None = None
    final_loss: float | None = None
    gradients_match: bool | None = None
    gradient_verdict: Literal["match", "differ", "undetermined: vanishing gradients"] | None = None
    grad_mismatch_count: int | None = None
    grad_worst_param: str | None = None
    grad_worst_rel_error: float | None = None
    params_missing_grad: list[str] = Field(default_factory=list)
    grad_max_abs_diff: float | None = None
    grad_max_abs: float | None = None
    loss_diff: float | None = None
    reference_activation_bytes: int | None = None
    recompute_verdict: Literal["match", "differ"] | None = Field(
        None, description="each checkpointed group's recomputed output against its first forward's (None: no group)"
    )
    recompute_first_differing_group: dict[str, Any] | None = Field(
        None, description="the first group (blocks start..end-1) whose recomputation differs, and by how much"
    )
    # The baseline's blocks (ckptlab.worker.engine.block_profile), recorded in its first memory step.
    block_profile: list[dict[str, Any]] | None = Field(
        None, description="per block: retained, input, output, param, forward and backward bytes, forward ms"
    )
    # The memory timeline (ckptlab.analysis.timeline, issue 34): per checkpointed region of the peak step.
    region_keeps: list[dict[str, Any]] | None = Field(
        None,
        description="per checkpointed region: the bytes its checkpoint meant to keep from forward to backward "
        "(inputs_bytes, rng_state_bytes, policy_bytes: intended_bytes) against what it kept (kept_bytes), "
        "excess_bytes the difference and excess its largest blocks (module, op, bytes)",
    )
    # Strategy auto (ckptlab.worker.engine.autoplan): the budget, the plan and its predicted peak (bytes).
    budget_bytes: int | None = None
    predicted_peak_bytes: int | None = None
    plan: dict[str, Any] | None = Field(
        None,
        description=(
            "segments [start, end, checkpointed] (a fourth item: the selective policy of a one-block selective "
            "checkpoint), checkpointed_blocks, selective_blocks (block -> policy), predicted_peak_bytes, "
            "predicted_overhead "
            "(fractions of the un-checkpointed step: estimate, low, high), front (budget_bytes, predicted_peak_bytes, "
            "predicted_overhead per point), alternatives (each: its setting, e.g. name, strategy, segments or every, "
            "and its plan: plan_segments, checkpointed_blocks, predicted_peak_bytes, predicted_overhead ...), timing, "
            "block profiles, selective_policies (what the search could choose beside keep and recompute); "
            "recompute_ms (ms) for programs. With checkpoint.search_compile: compiled (the torch.compile "
            "candidate: activation_memory_budget, compile_scope ('step': the whole forward and loss compiled, "
            "'blocks': the blocks alone), peak_bytes, predicted_overhead measured paired in the search, "
            "eager_overhead, chosen, why_not, probes: each fraction tried with its compile_scope, its peak_bytes, "
            "null when out_of_memory, and compile_ms; candidates: each scope's largest fitting fraction as timed, "
            "with its peak_bytes and predicted_overhead; errors: per scope whose search failed, why) and chosen "
            "('compile_budget' or 'checkpoints'); when "
            "compiled, predicted_peak_bytes and predicted_overhead are the candidate's, eager_prediction keeps the "
            "eager plan's, and segments, front and alternatives stay the eager plan's"
        ),
    )
    # Words.
    findings: list[Finding] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    # ckptlab.profile: what was profiled.
    model: str | None = Field(None, description="class and parameter count of a profiled model")
    blocks: str | None = Field(None, description="the blocks a profiled run checkpointed, and why those")
    # A prediction (no real step ran): its target, method and bounds.
    prediction: PredictionInfo | None = None
    # a sharded run (spec.distributed): its figures above are the worst rank's
    world_size: int | None = Field(None, description="ranks of a sharded run")
    global_batch_size: int | None = Field(None, description="batch_size x world_size")
    worst_rank: int | None = Field(None, description="the rank whose figures the run reports (highest peak)")
    ranks: list[RankFigures] | None = Field(None, description="every rank's memory, in rank order")
    sharded_gradients: ShardedGradientCheck | None = None
    # A run that did not succeed.
    oom: dict[str, Any] | None = Field(None, description="where an out-of-memory run stopped")
    failure: dict[str, Any] | None = None

    @classmethod
    def load(cls, data: Any) -> RunSummary:
        """The summary stored in a JSON column; never raises.

        Args:
            data: the column's value (a mapping, or None for a run without one).

        Returns:
            A :class:`RunSummary`; fields missing or holding the wrong type take their
            defaults (None, empty).
        """
        if not isinstance(data, dict):
            return cls()
        values = dict(data)
        for _ in range(len(values) + 1):
            try:
                return cls.model_validate(values)
            except ValidationError as exc:
                bad = {e["loc"][0] for e in exc.errors() if e["loc"]}
                if not bad & values.keys():
                    break
                for key in bad:
                    values.pop(key, None)
        return cls()

    def compared_load(self) -> HostLoad | None:
        """``host_load`` as a comparison of separate runs reads it
        (:func:`ckptlab.analysis.stats.separate_runs_not_comparable`): on CPU, a ``heap_kept``
        left unset is taken from ``environment["cpu_heap_kept"]``, where runs stored from
        commit 49f2d4a to aaa0451 recorded it; None where neither says (an older run, or
        CUDA)."""
        load = self.host_load
        if load is None or load.heap_kept is not None or (self.device or "").startswith("cuda"):
            return load
        kept = self.environment.get("cpu_heap_kept")
        return load.model_copy(update={"heap_kept": kept}) if isinstance(kept, bool) else load

    def paired_rounds(self) -> tuple[list[float], list[float], str] | None:
        """The per-round times of a paired timing pass, ``(baseline, run, what)`` in ms with
        ``what`` naming the clock (``"CPU time"``, ``"wall time"``), or None
        when its steps were not paired: process CPU time on CPU (steadier than wall time
        on a busy host: measured, one thread, two spinning processes on 2 cores, per-block
        recomputation +29% to +32% by CPU time against +34% to +44% by wall time;
        docs/benchmarks.md), wall time on CUDA (where the host's CPU time says nothing of
        the device's work)."""
        cpu = not (self.device or "").startswith("cuda")
        if cpu and self.paired_baseline_cpu_ms and len(self.step_cpu_ms) == len(self.paired_baseline_cpu_ms):
            return self.paired_baseline_cpu_ms, self.step_cpu_ms, "CPU time"
        if self.paired_baseline_step_times_ms:
            return self.paired_baseline_step_times_ms, self.step_times_ms, "wall time"
        return None

    @model_serializer(mode="wrap")
    def _only_what_was_measured(self, handler):  # unannotated: the schema stays the model's
        # A summary carries what its run measured: fields never set (a CPU run's
        # reserved_bytes, a failed run's figures) are left out of every dump, the stored
        # JSON and the API's answer alike, so both hold the same keys.
        data = handler(self)
        keep = self.model_fields_set | set(self.__pydantic_extra__ or {})
        return {k: v for k, v in data.items() if k in keep}

    def dump(self) -> dict[str, Any]:
        """JSON-ready, with only the fields that were set (what the engine stores)."""
        return self.model_dump(mode="json")


class StepRecord(BaseModel):
    """One optimizer step as the engine reports it (``on_step``) and ``steps`` stores it:
    the :data:`ckptlab.domain.STEP_FIELDS` columns, the loss and ``extra`` (the memory
    pass's breakdowns: ``activation_bytes``, per-phase peaks, ``memory_at_peak`` and
    ``memory_at_forward_end`` by category, ``pass``: ``memory`` or ``timed``).

    Memory fields are None for a timed step on CPU (the tracker is off). ``loss`` may be
    non-finite (a diverged run): the store keeps it as NULL plus ``loss_nonfinite``.
    """

    model_config = ConfigDict(strict=True)

    step: int = Field(ge=1)
    forward_ms: float
    backward_ms: float
    optimizer_ms: float
    step_ms: float
    allocated_bytes: int | None = None
    peak_allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    loss: float | None = None
    extra: dict[str, Any] = Field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """The plain dict ``on_step`` callbacks and the store take."""
        return self.model_dump()
