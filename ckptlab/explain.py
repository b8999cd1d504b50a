"""Plain words for a run's summary: where its peak is, and what a checkpointing setting did
(or failed to do). Pure functions over the summary and the spec; the worker stores their
output in the summary, the CLI prints it and the pages show it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckptlab.domain import MemoryCategory
from ckptlab.spec import ExperimentSpec
from ckptlab.strategies import BASELINE, Mechanism, get_strategy

__all__ = ["format_bytes", "peak_sentence", "findings", "FINDING_CODES", "SAVING_THRESHOLD", "SAVING_FLOOR_BYTES"]

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


def peak_sentence(summary: Mapping[str, Any], *, optimizer: str | None = None) -> str | None:
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
    phase, peak = summary.get("peak_phase"), summary.get("peak_allocated_bytes")
    at_peak = summary.get("memory_at_peak") or {}
    if phase is None or not peak:
        return None
    shares = sorted(((v / peak, k) for k, v in at_peak.items() if v), reverse=True)
    top = [f"{_CATEGORY_WORDS.get(k, k)} {100 * f:.0f}%" for f, k in shares[:2]]
    act = summary.get("activation_bytes_at_peak") or 0
    if MemoryCategory.ACTIVATIONS not in [k for _f, k in shares[:2]]:
        top.append(f"activations {100 * act / peak:.0f}%")
    head = f"peak {format_bytes(peak)} is in {_PHASE_WORDS.get(phase, phase)}: {', '.join(top)}"
    if act <= SAVING_THRESHOLD * peak:
        largest = _CATEGORY_WORDS.get(shares[0][1], shares[0][1]) if shares else "memory"
        opt = f" ({optimizer})" if optimizer and largest == "optimizer state" else ""
        return f"{head} — checkpointing cannot lower this peak; a smaller {largest}{opt} or batch would"
    return f"{head} — checkpointing can take at most {format_bytes(act)} off this peak"


def findings(spec: ExperimentSpec, summary: Mapping[str, Any]) -> list[dict[str, str]]:
    """Settings that do nothing or backfire, as ``{"code", "message"}`` (codes in
    :data:`FINDING_CODES`).

    Args:
        spec: the run's spec.
        summary: its summary; ``activation_bytes`` less ``rng_state_bytes`` against
            ``reference_activation_bytes`` (from the gradient check, which keeps no RNG
            state) decides the saving findings, ``device`` the offload one,
            ``memory_growth_bytes_per_step`` (bytes) the memory-growth one.
    """
    out: list[dict[str, str]] = []
    ck = spec.checkpoint

    def add(code: str, message: str) -> None:
        out.append({"code": code, "message": message})

    strategy = get_strategy(ck.strategy)
    baseline = ck.strategy == BASELINE
    if strategy.mechanism == Mechanism.SAVE_ON_CPU and str(summary.get("device", "")).startswith("cpu"):
        add("offload_on_cpu", f"{FINDING_CODES['offload_on_cpu']}; measure {ck.strategy} on a CUDA device")
    if not baseline and not strategy.groups(spec.model.depth, ck):
        advice = "; use 2 or more segments" if "segments" in strategy.fields else ""
        label = strategy.label_for(ck.model_dump())
        add("sequential_equals_none", f"{label}: {FINDING_CODES['sequential_equals_none']}{advice}")
    act, ref = summary.get("activation_bytes"), summary.get("reference_activation_bytes")
    rng = summary.get("rng_state_bytes") or 0
    if not baseline and act is not None and ref:
        # The tensors the blocks keep, against the same without checkpointing; the RNG
        # states each checkpoint adds are a cost of their own, said apart.
        act -= rng
        plus_rng = f", plus {format_bytes(rng)} of RNG states (preserve_rng_state)" if rng else ""
        margin = max(SAVING_THRESHOLD * ref, SAVING_FLOOR_BYTES)
        if act > ref + margin:
            add(
                "checkpointing_keeps_more",
                f"{FINDING_CODES['checkpointing_keeps_more']} ({format_bytes(act)}{plus_rng}, against "
                f"{format_bytes(ref)}): what it saves is larger than what the blocks would keep "
                "(e.g. save_matmuls on Linear layers); choose another policy or strategy",
            )
        elif act >= ref - margin and not out:
            add(
                "checkpointing_saves_nothing",
                f"{FINDING_CODES['checkpointing_saves_nothing']} ({format_bytes(act)}{plus_rng}, against "
                f"{format_bytes(ref)}): each checkpointed block keeps as much as its input "
                "(e.g. Linear -> ReLU); checkpoint larger segments",
            )
    peak = summary.get("peak_allocated_bytes")
    at_peak = summary.get("activation_bytes_at_peak")
    if not baseline and peak and at_peak is not None and at_peak <= SAVING_THRESHOLD * peak:
        phase = _PHASE_WORDS.get(summary.get("peak_phase") or "", "its phase")
        add("peak_not_in_activations", f"{FINDING_CODES['peak_not_in_activations']} (the peak is in {phase})")
    budget, predicted = summary.get("budget_bytes"), summary.get("predicted_peak_bytes")
    if budget and peak and peak > budget:
        add(
            "over_budget",
            f"{FINDING_CODES['over_budget']} ({format_bytes(peak)} against {format_bytes(budget)}, predicted "
            f"{format_bytes(predicted)}): the planner's memory model missed something here; lower the budget "
            "by the difference",
        )
    growth = summary.get("memory_growth_bytes_per_step")
    if growth:
        add(
            "memory_grows_per_step",
            f"{FINDING_CODES['memory_grows_per_step']} (+{format_bytes(growth)} per step over "
            f"{summary.get('memory_steps_run', '?')} steps): most likely a loss or output kept across steps "
            "as a tensor (`total_loss += loss` keeps each step's autograd graph alive; accumulate "
            "`loss.item()` or `loss.detach()`, and do not keep outputs in a list)",
        )
    return out
