"""The experiment spec: the one definition of what a checkpointing experiment is.

Both processes import this module: the backend validates requests with it and the worker
builds the run from it. It never imports torch.

Example: :data:`ckptlab.spec.presets.EXAMPLE_SPEC` (the API's example request).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, StrictBool, model_validator

from ckptlab.spec import model_kinds as _builtin_kinds  # noqa: F401  (registers the built-in kinds)
from ckptlab.spec.base import SpecInt, _field_error, _Strict, spec_int
from ckptlab.spec.hf_model import HFModelSpec
from ckptlab.spec.kinds import default_model, model_spec_type
from ckptlab.spec.models import (
    MODEL_ENTRY_POINT_GROUP,
    CustomModelSpec,
    DenseNetSpec,
    MLPSpec,
    PythonModelSpec,
    ResNetSpec,
    TransformerSpec,
    installed_model_names,
)
from ckptlab.spec.torchvision_model import TorchvisionModelSpec
from ckptlab.strategies import BASELINE, CompileScope, SelectivePolicy, get_strategy, strategy_names

__all__ = [
    "MLPSpec",
    "ResNetSpec",
    "TransformerSpec",
    "DenseNetSpec",
    "CustomModelSpec",
    "PythonModelSpec",
    "HFModelSpec",
    "TorchvisionModelSpec",
    "ModelSpec",
    "CheckpointSpec",
    "DistributedSpec",
    "MixedPrecisionSpec",
    "ExperimentSpec",
    "StrategyName",
    "MODEL_ENTRY_POINT_GROUP",
    "installed_model_names",
    "find_unstorable",
]

#: Largest ``memory_limit_bytes`` a spec may give: 1 PiB, above any device or host.
MAX_MEMORY_LIMIT_BYTES = 2**50
#: Bytes of memory a spec may name (a limit, a budget): 1 byte to 1 PiB.
MemoryBytes = spec_int(ge=1, le=MAX_MEMORY_LIMIT_BYTES)
#: ``ExperimentSpec.model``: a model of any kind in the model-kind table (:mod:`ckptlab.spec.kinds`).
ModelSpec = model_spec_type()


def _known_strategy(name: str) -> str:
    get_strategy(name)  # ValueError naming the known ones
    return name


def _strategy_enum(schema: dict[str, Any]) -> None:
    # Read at schema time, so a strategy registered after import is in the schema too.
    schema["enum"] = strategy_names()


#: ``checkpoint.strategy``: a name in the strategy table (:mod:`ckptlab.strategies`), checked
#: against the table as it is when a spec is validated.
StrategyName = Annotated[str, AfterValidator(_known_strategy), Field(json_schema_extra=_strategy_enum)]


class CheckpointSpec(_Strict):
    """How the block list is checkpointed.

    Args:
        strategy: a name in :data:`ckptlab.strategies.STRATEGIES`. The built-ins: ``none``
            keeps every activation; ``sequential`` splits the blocks as
            ``torch.utils.checkpoint.checkpoint_sequential`` does (``len // segments``
            blocks per segment, the last segment not checkpointed); ``per_block``
            checkpoints every group of ``every`` blocks (Megatron's "uniform");
            ``selective`` checkpoints every group of ``every`` blocks with
            ``create_selective_checkpoint_contexts(policy)``; ``offload`` keeps every
            activation but moves it to host memory (``torch.autograd.graph.save_on_cpu``).
        segments: segments for ``sequential`` (1 to ``model.depth``; default 1). PyTorch
            never checkpoints the last segment, so ``segments=1`` saves nothing.
        every: blocks per checkpointed group for ``per_block`` and ``selective`` (default 1).
        policy: for ``selective``: ``save_matmuls`` (save matmul outputs, recompute the
            rest, Korthikanti et al. 2022), ``save_matmuls_and_attention`` (also save the
            attention output), ``recompute_all``.
        use_reentrant: passed to PyTorch (default False). ``True`` is the legacy variant:
            no gradients when no input requires grad; cannot run ``selective``.
        preserve_rng_state: restore the RNG state before recomputation so dropout masks
            match the first forward. Default: True.
        budget_bytes: for ``auto``: the memory budget (peak allocated bytes) to plan for;
            the engine profiles the blocks and checkpoints the least it can
            (``ckptlab.worker.engine.autoplan``). Required by ``auto``.
        activation_memory_budget: for ``compile_budget``: the fraction (0 to 1) of the
            activation memory ``torch.compile``'s min-cut partitioner may save
            (``torch._functorch.config.activation_memory_budget``; 1.0: save what the
            default partitioner saves, 0.0: recompute everything it can). Default 0.5.
        compile_scope: for ``compile_budget``: what ``torch.compile`` compiles: ``blocks``
            (the block list as one function; the stem, the head and the loss stay eager) or
            ``step`` (the whole forward and the loss as one function, so the partitioner
            also decides what the head and the loss save: on the built-in transformer 4x128,
            seq 256, batch 4 (CPU), 2.4-4.3 MiB lower than ``blocks`` at 1.0, 0.8 and 0.5 for
            no measured time, 0.8 MiB higher at 0.1; docs/benchmarks.md, "The whole step
            compiled"). Default ``blocks``.
        search_compile: for ``auto``: also consider ``torch.compile`` under its own
            activation memory budget, each fraction tried measured in the run's process
            (``ckptlab.worker.engine.blocks.compiled``; each costs a compile); the run then
            compiles when that is measurably cheaper than the eager plan. Default False.
    """

    strategy: StrategyName = BASELINE
    segments: SpecInt = Field(1, ge=1, description="segments for strategy 'sequential'")
    every: SpecInt = Field(1, ge=1, description="blocks per checkpointed group for 'per_block' and 'selective'")
    policy: Annotated[SelectivePolicy, Field(strict=False)] = SelectivePolicy.SAVE_MATMULS
    use_reentrant: StrictBool = False
    preserve_rng_state: StrictBool = True
    budget_bytes: MemoryBytes | None = Field(None, description="memory budget (bytes) of strategy 'auto'")
    activation_memory_budget: float = Field(
        0.5, ge=0.0, le=1.0, description="fraction of activation memory torch.compile may save ('compile_budget')"
    )
    compile_scope: Annotated[CompileScope, Field(strict=False)] = Field(
        CompileScope.BLOCKS,
        description="what strategy 'compile_budget' compiles: the blocks, or the whole forward and loss",
    )
    search_compile: StrictBool = Field(
        False, description="strategy 'auto' also tries torch.compile's own budget, measured (each try compiles)"
    )


#: Largest ``distributed.world_size`` a spec may name: real runs are further bounded by the
#: devices a worker can place, predictions by their time limit.
MAX_WORLD_SIZE = 4096
Precision = Literal["fp32", "bf16", "fp16"]


class MixedPrecisionSpec(_Strict):
    """FSDP2's ``MixedPrecisionPolicy`` (``torch.distributed.fsdp``): the dtype the
    all-gathered parameters are computed in and the dtype gradients are reduced in; the
    sharded parameters and the optimizer stay fp32."""

    param_dtype: Precision = "bf16"
    reduce_dtype: Precision = "fp32"


class DistributedSpec(_Strict):
    """How the run is spread over ranks (one process per rank).

    Args:
        kind: ``none`` (one process), ``ddp`` (``DistributedDataParallel``: every rank holds
            the whole model, gradients all-reduced) or ``fsdp2`` (``fully_shard``: parameters,
            gradients and optimizer state sharded over the ranks, all-gathered per unit for
            its forward and backward, gradients reduce-scattered).
        world_size: ranks (processes), 1 to :data:`MAX_WORLD_SIZE`; 1 with ``none``.
            ``batch_size`` is per rank (torchtitan's "local batch size"): the global batch is
            ``batch_size × world_size`` (the summary's ``global_batch_size``).
        reshard_after_forward: FSDP2: free each unit's all-gathered parameters after its
            forward and all-gather them again for its backward (True, the default: less
            memory, one more all-gather per unit); False keeps them from forward to backward.
        mixed_precision: FSDP2 only: a :class:`MixedPrecisionSpec`, or None (fp32).
        shard_unit: FSDP2's units: ``block`` (each block is ``fully_shard``-ed after its
            checkpoint wrapper is applied, then the root: torchtitan's order), ``model``
            (the root only: every parameter all-gathered at once) or ``block_children``
            (each child module of every block, then the root: units inside the checkpointed
            blocks, the shape of huggingface/accelerate#4172, which the unit audit flags).
        find_unused_parameters: DDP only: ``DistributedDataParallel(find_unused_parameters=
            True)``, which walks the autograd graph after each forward and marks parameters
            outside it ready at once. With reentrant checkpointing the checkpointed blocks'
            parameters are outside that graph (their forward ran under ``no_grad``), so their
            recomputed backward marks them ready a second time and DDP fails
            (pytorch/pytorch#24005; "Expected to mark a variable ready only once"): the run
            fails and its error says what to change.

    Real runs on CPU use the gloo backend (``init_device_mesh("cpu", ...)``; gloo has no
    ``PREMUL_SUM``, so FSDP2 keeps its default gradient division); on CUDA, NCCL with one GPU
    per rank.
    """

    kind: Literal["none", "ddp", "fsdp2"] = "none"
    world_size: SpecInt = Field(1, ge=1, le=MAX_WORLD_SIZE)
    reshard_after_forward: StrictBool = True
    mixed_precision: MixedPrecisionSpec | None = None
    shard_unit: Literal["block", "model", "block_children"] = "block"
    find_unused_parameters: StrictBool = False

    @model_validator(mode="after")
    def _consistent(self) -> DistributedSpec:
        if self.find_unused_parameters and self.kind != "ddp":
            raise _field_error(
                ("find_unused_parameters",),
                True,
                f"find_unused_parameters is DDP's option; kind {self.kind!r} has none",
            )
        if self.kind == "none" and self.world_size != 1:
            raise _field_error(
                ("world_size",), self.world_size, f"world_size {self.world_size} needs kind 'ddp' or 'fsdp2'"
            )
        if self.kind != "fsdp2" and self.mixed_precision is not None:
            raise _field_error(
                ("mixed_precision",), "set", f"mixed_precision is FSDP2's policy; kind {self.kind!r} has none"
            )
        return self


class ExperimentSpec(_Strict):
    """One checkpointing experiment: a model, a checkpointing setting, and a short training run.

    Args:
        model: the model to train: ``kind`` names an entry of the model-kind table
            (:mod:`ckptlab.spec.kinds`; the built-ins in :mod:`ckptlab.spec.model_kinds`), the
            default kind when left out; the other fields are that kind's spec class's.
        batch_size: samples per micro-batch (default 64).
        steps: optimizer steps of the memory pass, warm-up included (default 5); with
            ``memory_early_stop`` fewer run when memory is flat.
        warmup_steps: first steps left out of the memory medians (default 1; must be < steps).
        timed_steps: optimizer steps of the timing pass that follows the ``steps`` memory
            steps (default 20; 0: take the timings from the memory steps). On CPU the
            timing pass runs with the live-tensor tracker off, so the tracker's per-op cost
            is not in the step times; on CUDA the allocator statistics cost nothing and the
            timed steps keep their memory readings. The step times' median, interquartile
            range and bootstrap 95% interval come from these steps.
        paired_timing: time each step of the timing pass in a round with an
            un-checkpointed copy of the model in the same process (same weights, its own
            optimizer), alternating which goes first, and judge the overhead on the
            per-round ratios: a load burst on a shared host hits both sides of a round
            alike (issue 19). Doubles the timing pass; ignored by ``none`` and compiled
            runs; skipped, saying why, when the copy does not fit in memory. Default True.
        memory_early_stop: end the memory pass after two consecutive steps past the
            warm-up whose memory readings are byte-identical (live, peak, per phase and
            per category): once the optimizer state exists every further step reads the
            same (default True). A memory that grows per step runs all ``steps`` and is
            reported (finding ``memory_grows_per_step``). The timing pass always runs its
            full ``timed_steps``. False: run every memory step.
        grad_accum_steps: micro-batches per optimizer step; the loss is divided by it
            (default 1). Memory is that of one micro-batch.
        checkpoint: the checkpointing setting (see :class:`CheckpointSpec`).
        amp: ``off``, ``fp16`` (autocast + ``torch.amp.GradScaler``) or ``bf16`` (autocast).
        optimizer: ``sgd``, ``adam`` or ``adamw`` (default adam).
        device: ``auto`` (CUDA when available, else CPU), ``cpu`` or ``cuda``.
        seed: seeds the weights, the synthetic data and dropout.
        memory_limit_bytes: cap on allocated bytes (CUDA: ``set_per_process_memory_fraction``;
            CPU: the tracker raises out-of-memory past it). Default: no cap; at most
            :data:`MAX_MEMORY_LIMIT_BYTES` (1 PiB).
        verify_gradients: also run the first step without checkpointing from the same
            weights, data and RNG seed and record the gradient difference (default True).
        memory_snapshot: on CUDA, record ``torch.cuda.memory._record_memory_history`` and
            keep a snapshot for pytorch.org/memory_viz: of the memory timeline's peak step,
            or of the whole run where no timeline is recorded (default False).
        timeout_s: kill the run after this many seconds (default: the worker's setting).
        distributed: ranks and sharding (see :class:`DistributedSpec`; default one process).

    Raises:
        pydantic.ValidationError: on unknown fields, values out of range, or combinations
            that cannot run (located at the field to fix).
    """

    model: ModelSpec = Field(default_factory=default_model)
    batch_size: SpecInt = Field(64, ge=1, le=65536)
    steps: SpecInt = Field(5, ge=1, le=100_000)
    warmup_steps: SpecInt = Field(1, ge=0)
    timed_steps: SpecInt = Field(20, ge=0, le=100_000)
    memory_early_stop: bool = True
    paired_timing: StrictBool = True
    grad_accum_steps: SpecInt = Field(1, ge=1, le=1024)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    amp: Literal["off", "fp16", "bf16"] = "off"
    optimizer: Literal["sgd", "adam", "adamw"] = "adam"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    seed: SpecInt = Field(0, ge=0, le=2**53 - 1)
    memory_limit_bytes: MemoryBytes | None = None
    verify_gradients: StrictBool = True
    memory_snapshot: StrictBool = False
    timeout_s: float | None = Field(None, gt=0, le=7 * 24 * 3600)
    distributed: DistributedSpec = Field(default_factory=DistributedSpec)

    @model_validator(mode="before")
    @classmethod
    def _text_and_numbers(cls, data: Any) -> Any:
        # Every string must be encodable as UTF-8 (a lone surrogate such as "\ud800" is not:
        # stored, it would break every read) and every number finite (JSON has no NaN).
        bad = find_unstorable(data)
        if bad is not None:
            loc, value, message = bad
            raise _field_error(loc, repr(value), message)
        return data

    def _distributed_checks(self, strategy: Any) -> None:
        """A sharded run: CPU ranks only (gloo) for now, and no compiling strategy (compiled
        graphs and FSDP2's hooks are not composed here)."""
        kind = self.distributed.kind
        if kind == "none":
            return
        if self.device == "cuda":
            raise _field_error(
                ("device",), self.device, f"a {kind} run runs on CPU ranks (gloo) for now; use device 'cpu' or 'auto'"
            )
        if self.checkpoint.search_compile and strategy.planned:
            raise _field_error(
                ("checkpoint", "search_compile"),
                True,
                f"a {kind} run does not compile the model yet: search_compile false",
            )
        if strategy.compiles:
            raise _field_error(
                ("checkpoint", "strategy"),
                self.checkpoint.strategy,
                f"strategy {self.checkpoint.strategy!r} compiles the model, which a {kind} run does not support yet",
            )

    @model_validator(mode="after")
    def _cross_field_checks(self) -> ExperimentSpec:
        if self.warmup_steps >= self.steps:
            raise _field_error(
                ("warmup_steps",),
                self.warmup_steps,
                f"warmup_steps ({self.warmup_steps}) must be less than steps ({self.steps})",
            )
        ck = self.checkpoint
        strategy = get_strategy(ck.strategy)
        for name in ("segments", "every"):
            value = getattr(ck, name)
            if name in strategy.fields and value > self.model.depth:
                raise _field_error(
                    ("checkpoint", name),
                    value,
                    f"{name} ({value}) must not exceed model.depth ({self.model.depth})",
                )
        model = self.model
        if isinstance(model, HFModelSpec) and model.arch.attention and ck.use_reentrant and strategy.recomputes:
            raise _field_error(
                ("checkpoint", "use_reentrant"),
                ck.use_reentrant,
                f"hf {model.architecture} layers take keyword tensor arguments (attention masks, position "
                "embeddings), which reentrant checkpoint cannot take (torch.utils.checkpoint); use use_reentrant false",
            )
        batch_problem = model.batch_problem(self.batch_size) if isinstance(model, HFModelSpec) else None
        if batch_problem:
            raise _field_error(("batch_size",), self.batch_size, batch_problem)
        if strategy.planned and ck.budget_bytes is None:
            raise _field_error(
                ("checkpoint", "budget_bytes"), None, f"strategy {ck.strategy!r} needs budget_bytes (the memory budget)"
            )
        self._distributed_checks(strategy)
        if strategy.needs_non_reentrant and ck.use_reentrant:
            raise _field_error(
                ("checkpoint", "use_reentrant"),
                ck.use_reentrant,
                f"strategy {ck.strategy!r} needs use_reentrant false "
                "(PyTorch: context_fn requires use_reentrant=False)",
            )
        return self


def find_unstorable(value: Any, loc: tuple[str | int, ...] = ()) -> tuple[tuple, Any, str] | None:
    """The first string that is not encodable as UTF-8 (a lone surrogate) or number that is
    not finite in a JSON-like ``value``, as ``(loc, value, message)``; None when all is
    storable. Keys are checked too. (OWASP input validation: reject, do not repair.)"""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return loc, value, "text must be valid UTF-8 (it holds a lone surrogate)"
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return loc, value, "numbers must be finite (NaN and Infinity are not JSON)"
    if isinstance(value, dict):
        for k, v in value.items():
            found = find_unstorable(k, (*loc, "[key]")) if isinstance(k, str) else None
            found = found or find_unstorable(v, (*loc, k))
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found = find_unstorable(v, (*loc, i))
            if found:
                return found
    return None
