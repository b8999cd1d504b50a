"""Plain words for a run's summary: where its peak is, and what a checkpointing setting did
(or failed to do). Pure functions over the summary and the spec; the worker stores their
output in the summary, the CLI prints it and the pages show it.
"""

from __future__ import annotations

from ckptlab.domain import MemoryCategory
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.strategies import BASELINE, Mechanism, Strategy
from ckptlab.summary import Finding, RunSummary

__all__ = [
    "format_bytes",
    "bytes_apart",
    "size_fields",
    "oom_advice",
    "peak_sentence",
    "findings",
    "FINDING_CODES",
    "SAVING_THRESHOLD",
    "SAVING_FLOOR_BYTES",
]

#: A checkpointing setting "saves" activations only when it keeps at least this fraction
#: fewer bytes than the same model without checkpointing (1%; smaller differences are
#: alignment and bookkeeping, not a saving).
SAVING_THRESHOLD = 0.01
#: ... and at least this many bytes (4 KiB): the engine's step and the reference forward
#: differ by a few scalars (the loss divided by ``grad_accum_steps``, its ``float`` copy).
SAVING_FLOOR_BYTES = 4096

#: Every finding's code and what it means.
FINDING_CODES = {
    "offload_on_cpu": "offloading on a CPU run moves nothing: activations already live in host memory",
    # The code keeps its first name (stored summaries carry it); it fires for any strategy
    # whose setting wraps no block, sequential with one segment being the usual one.
    "sequential_equals_none": "the setting checkpoints no block: it is the same as no checkpointing",
    "checkpointing_saves_nothing": "the setting keeps as many activation bytes as no checkpointing",
    "checkpointing_keeps_more": "the setting keeps more activation bytes than no checkpointing",
    "peak_not_in_activations": "the peak holds no activations: checkpointing cannot lower it",
    "memory_grows_per_step": "live memory grows at every step: something keeps each step's tensors alive",
    "over_budget": "the measured peak is above the memory budget the plan was made for",
    "reentrant_under_sharding": "reentrant checkpointing under DDP or FSDP2 recomputes outside the autograd "
    "graph their gradient hooks follow (pytorch/pytorch#24005)",
    "root_only_fsdp_unit": "the root is the only FSDP unit: every parameter is all-gathered at once",
    "fsdp_inside_block": "FSDP units sit inside the checkpointed blocks (each block's children sharded apart, "
    "huggingface/accelerate#4172): a block's recomputation all-gathers its children one by one inside backward",
    "segment_spans_fsdp_units": "a checkpointed group spans several FSDP units: its recomputation all-gathers "
    "them all at once in backward",
    "region_keeps_more_than_its_inputs": "a checkpointed region kept more than its inputs from forward to "
    "backward: a tensor it made is still held after it (returned beside its output, or kept by the model), so "
    "checkpointing it does not free that",
}

_PHASE_WORDS = {"forward": "forward", "backward": "backward", "optimizer": "optimizer.step"}
_CATEGORY_WORDS = {c.value: c.value.replace("_", " ") for c in MemoryCategory}


def format_bytes(n: float | None) -> str:
    """``1536`` -> ``'1.5 KiB'`` (binary units); None -> ``'?'``."""
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


#: What would get a run past an out-of-memory in each phase: checkpointing only helps where
#: activations are what fills the memory (forward, and backward while they are still held).
_OOM_ADVICE = {
    "setup": "the model, its optimizer or the reference copies did not fit before any activation existed: "
    "checkpointing cannot help; use a smaller model, an optimizer with less state (sgd) or a larger memory limit",
    "forward": "activations filled the memory: checkpoint more blocks (per_block, or auto with a budget) or lower "
    "batch_size",
    "backward": "the activations still held and backward's gradients and temporaries filled the memory: "
    "checkpoint more blocks (per_block, or auto with a budget) or lower batch_size",
    "optimizer": "the optimizer step's state and temporaries filled the memory after the activations were freed: "
    "checkpointing cannot help; use an optimizer with less state (sgd), fewer parameters or a larger memory limit",
}


def oom_advice(phase: str | None) -> str:
    """What to change after an out-of-memory in ``phase`` (``setup``, ``forward``,
    ``backward``, ``optimizer``; another or None: the general advice), one sentence."""
    return _OOM_ADVICE.get(phase or "", "lower batch_size, checkpoint more blocks or raise the memory limit")


def peak_sentence(summary: RunSummary, *, optimizer: str | None = None) -> str | None:
    """Where the peak is and what could shrink it, e.g. ``"peak 17.0 MiB is in
    optimizer.step: optimizer state 50%, activations 0% — checkpointing cannot lower this
    peak; a smaller optimizer state or batch would"``.

    Args:
        summary: a succeeded run's summary (``peak_phase``, ``peak_allocated_bytes``,
            ``memory_at_peak``, ``activation_bytes_at_peak``).
        optimizer: the spec's optimizer, named in the advice when given.

    Returns:
        The sentence, or None when the summary lacks the peak facts.
    """
    phase, peak = summary.peak_phase, summary.peak_allocated_bytes
    if phase is None or not peak:
        return None
    shares = sorted(((v / peak, k) for k, v in summary.memory_at_peak.items() if v), reverse=True)
    top = [f"{_CATEGORY_WORDS.get(k, k)} {100 * f:.0f}%" for f, k in shares[:2]]
    act = summary.activation_bytes_at_peak or 0
    if MemoryCategory.ACTIVATIONS not in [k for _f, k in shares[:2]]:
        top.append(f"activations {100 * act / peak:.0f}%")
    head = f"peak {format_bytes(peak)} is in {_PHASE_WORDS.get(phase, phase)}: {', '.join(top)}"
    if act <= SAVING_THRESHOLD * peak:
        largest = _CATEGORY_WORDS.get(shares[0][1], shares[0][1]) if shares else "memory"
        opt = f" ({optimizer})" if optimizer and largest == "optimizer state" else ""
        return f"{head} — checkpointing cannot lower this peak; a smaller {largest}{opt} or batch would"
    return f"{head} — checkpointing can take at most {format_bytes(act)} off this peak"


def findings(spec: ExperimentSpec, summary: RunSummary, strategy: Strategy) -> list[Finding]:
    """Settings that do nothing or backfire (codes in :data:`FINDING_CODES`), in this order:
    offload on CPU, a setting that wraps no block, the activation saving against the
    reference, a peak without activations, a measured peak over the plan's budget, memory
    that grows per step.

    Args:
        spec: the run's spec.
        summary: its summary; ``activation_bytes`` less ``rng_state_bytes`` against
            ``reference_activation_bytes`` (from the gradient check, which keeps no RNG
            state) decides the saving findings, ``device`` the offload one,
            ``memory_growth_bytes_per_step`` (bytes) the memory-growth one.
        strategy: the run's strategy, resolved once (:func:`ckptlab.strategies.get_strategy`).

    Also, from the memory timeline: a checkpointed region that kept more than its inputs
    (``region_keeps``).
    """
    baseline = strategy.name == BASELINE
    out = [*_offload_on_cpu(spec, summary, strategy), *([] if baseline else _wraps_no_block(spec, summary, strategy))]
    if not baseline:
        out += _saving(summary, already_said=bool(out))
        out += _peak_without_activations(summary)
    out += _region_keeps(summary)
    return out + _over_budget(summary) + _memory_growth(summary) + _sharding_audit(spec, summary, strategy)


def _sharding_audit(spec: ExperimentSpec, summary: RunSummary, strategy: Strategy) -> list[Finding]:
    """A sharded run's units against its checkpointing (torchtitan's order: checkpoint each
    block, ``fully_shard`` each block, then the root): reentrant checkpointing under DDP or
    FSDP2, the root as the only FSDP unit (with the all-gathered bytes at the peak), and a
    checkpointed group of several blocks, each its own FSDP unit."""
    kind, ck = spec.distributed.kind, spec.checkpoint
    if kind == "none":
        return []
    out = []
    if ck.use_reentrant and strategy.recomputes:
        message = f"{FINDING_CODES['reentrant_under_sharding']}; use use_reentrant false"
        out.append(_finding("reentrant_under_sharding", message))
    if kind != "fsdp2":
        return out
    unsharded = (summary.memory_at_peak or {}).get(MemoryCategory.UNSHARDED_PARAMETERS.value)
    held = f" ({format_bytes(unsharded)} of all-gathered parameters at the peak)" if unsharded else ""
    if spec.distributed.shard_unit == "model":
        message = f"{FINDING_CODES['root_only_fsdp_unit']}{held}; shard each block first (shard_unit block)"
        out.append(_finding("root_only_fsdp_unit", message))
    elif spec.distributed.shard_unit == "block_children" and strategy.recomputes:
        message = f"{FINDING_CODES['fsdp_inside_block']}{held}; shard each block whole (shard_unit block)"
        out.append(_finding("fsdp_inside_block", message))
    elif strategy.recomputes:
        groups = _checkpointed_groups(spec, summary, strategy)
        widest = max((end - start for start, end in groups), default=1)
        if widest > 1:
            message = (
                f"{FINDING_CODES['segment_spans_fsdp_units']} (up to {widest} blocks per group); "
                "checkpoint each block (per_block, every 1) to keep the units and the groups the same"
            )
            out.append(_finding("segment_spans_fsdp_units", message))
    return out


def _checkpointed_groups(spec: ExperimentSpec, summary: RunSummary, strategy: Strategy) -> list[tuple[int, int]]:
    """The ``(start, end)`` block ranges the run checkpointed: a planned strategy's from its
    plan (its checkpointed ``segments``: ``[start, end, checkpointed]``), any other's from
    the strategy table."""
    if strategy.planned:
        return [(s[0], s[1]) for s in (summary.plan or {}).get("segments") or [] if s[2]]
    return list(strategy.groups(spec.model.depth, spec.checkpoint))


def _finding(code: str, detail: str) -> Finding:
    return Finding(code=code, message=detail)


def _offload_on_cpu(spec: ExperimentSpec, summary: RunSummary, strategy: Strategy) -> list[Finding]:
    if strategy.mechanism == Mechanism.SAVE_ON_CPU and (summary.device or "").startswith("cpu"):
        message = f"{FINDING_CODES['offload_on_cpu']}; measure {strategy.name} on a CUDA device"
        return [_finding("offload_on_cpu", message)]
    return []


def _wraps_no_block(spec: ExperimentSpec, summary: RunSummary, strategy: Strategy) -> list[Finding]:
    """A setting that wraps no block. A planned strategy (``auto``) wraps what its plan
    checkpoints, known only once it ran: it is judged on the plan, not on the table's
    groups (which are empty for it)."""
    ck = spec.checkpoint
    if strategy.planned:
        if summary.plan is None or summary.plan.get("checkpointed_blocks"):
            return []
    elif strategy.groups(spec.model.depth, ck):
        return []
    advice = "; use 2 or more segments" if "segments" in strategy.fields else ""
    label = strategy.label_for(ck.model_dump())
    return [_finding("sequential_equals_none", f"{label}: {FINDING_CODES['sequential_equals_none']}{advice}")]


def _saving(summary: RunSummary, *, already_said: bool) -> list[Finding]:
    """The tensors the blocks keep against the same without checkpointing; the RNG states
    each checkpoint adds are a cost of their own, said apart. "Saves nothing" only when no
    finding above already said why."""
    act, ref = summary.activation_bytes, summary.reference_activation_bytes
    if act is None or not ref:
        return []
    rng = summary.rng_state_bytes or 0
    act -= rng
    plus_rng = f", plus {format_bytes(rng)} of RNG states (preserve_rng_state)" if rng else ""
    margin = max(SAVING_THRESHOLD * ref, SAVING_FLOOR_BYTES)
    sizes = f"({format_bytes(act)}{plus_rng}, against {format_bytes(ref)})"
    if act > ref + margin:
        return [
            _finding(
                "checkpointing_keeps_more",
                f"{FINDING_CODES['checkpointing_keeps_more']} {sizes}: what it saves is larger than what the "
                "blocks would keep (e.g. save_matmuls on Linear layers); choose another policy or strategy",
            )
        ]
    if act >= ref - margin and not already_said:
        return [
            _finding(
                "checkpointing_saves_nothing",
                f"{FINDING_CODES['checkpointing_saves_nothing']} {sizes}: each checkpointed block keeps as much "
                "as its input (e.g. Linear -> ReLU); checkpoint larger segments",
            )
        ]
    return []


def _peak_without_activations(summary: RunSummary) -> list[Finding]:
    peak, at_peak = summary.peak_allocated_bytes, summary.activation_bytes_at_peak
    if peak and at_peak is not None and at_peak <= SAVING_THRESHOLD * peak:
        phase = _PHASE_WORDS.get(summary.peak_phase or "", "its phase")
        return [
            _finding("peak_not_in_activations", f"{FINDING_CODES['peak_not_in_activations']} (the peak is in {phase})")
        ]
    return []


def _over_budget(summary: RunSummary) -> list[Finding]:
    budget, peak = summary.budget_bytes, summary.peak_allocated_bytes
    if not (budget and peak and peak > budget):
        return []
    return [
        _finding(
            "over_budget",
            f"{FINDING_CODES['over_budget']} ({format_bytes(peak)} against {format_bytes(budget)}, predicted "
            f"{format_bytes(summary.predicted_peak_bytes)}): the planner's memory model missed something here; "
            "lower the budget by the difference",
        )
    ]


def _region_keeps(summary: RunSummary) -> list[Finding]:
    """The regions whose checkpoint kept more than it meant to (the memory timeline's
    ``region_keeps``, issue 34): one finding naming each with its largest kept block."""
    over = [k for k in summary.region_keeps or [] if k.get("excess_bytes", 0) > 0]
    if not over:
        return []
    parts = []
    for keep in over:
        what = ", ".join(
            f"{e['op']} in {e['module'] or 'the model'} ({format_bytes(e['bytes'])})" for e in keep["excess"]
        )
        parts.append(
            f"{keep['region']} kept {format_bytes(keep['kept_bytes'])} where its inputs, RNG state and policy's "
            f"outputs are {format_bytes(keep['intended_bytes'])}: {what}"
        )
    message = (
        f"{FINDING_CODES['region_keeps_more_than_its_inputs']}; " + "; ".join(parts) + "; return only the hidden "
        "states from a checkpointed block, or checkpoint the block that keeps the tensor too"
    )
    return [_finding("region_keeps_more_than_its_inputs", message)]


def _memory_growth(summary: RunSummary) -> list[Finding]:
    growth = summary.memory_growth_bytes_per_step
    if not growth:
        return []
    steps = summary.memory_steps_run if summary.memory_steps_run is not None else "?"
    return [
        _finding(
            "memory_grows_per_step",
            f"{FINDING_CODES['memory_grows_per_step']} (+{format_bytes(growth)} per step over {steps} steps): "
            "most likely a tensor kept across steps, such as each step's output appended to a list; keep "
            "`out.detach()` or numbers (`loss.item()`) instead (a running `total_loss += loss` is not it: "
            "backward frees what its graph saved, so live bytes stay flat, docs/guide.md)",
        )
    ]


def bytes_apart(a: int, b: int) -> tuple[str, str]:
    """``a`` and ``b`` (bytes) as :func:`format_bytes` writes them,
    or both in bytes (``48,845,980 B``) where those would read the same: a refusal must not
    say "a budget of 12.3 MiB ... the smallest reachable peak is 12.3 MiB" (issue 31)."""
    words = format_bytes(a), format_bytes(b)
    return (f"{a:,} B", f"{b:,} B") if words[0] == words[1] else words


def size_fields(spec: ExperimentSpec) -> str:
    """What of ``spec`` sizes its activations, in words naming the fields: the batch size
    and, where the model has them, its sequence length (language models), image size (image
    models), or width and depth (MLPs), e.g. ``"the batch size (batch_size) or the
    sequence length (model.seq_len)"``."""
    model = spec.model
    names = ["the batch size (batch_size)"]
    family = getattr(getattr(model, "arch", None), "family", None)  # a Hugging Face model's
    if family is not None:
        field = "seq_len" if family == "causal_lm" else "image_size"
        words = "the sequence length" if field == "seq_len" else "the image size"
        names.append(f"{words} (model.{field})")
    else:
        for field, words in (("seq_len", "the sequence length"), ("image_size", "the image size")):
            if getattr(model, field, None) is not None:
                names.append(f"{words} (model.{field})")
        if getattr(model, "width", None) is not None:  # an MLP: its blocks keep batch x width each
            names += ["the width (model.width)", "the depth (model.depth)"]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
