"""What a plan is predicted to cost in time, for ``auto``'s plan and for any other plan of
the same model (issue 31): the uniform strategies' settings as plans of the chain, a plan
as the run summary records it (segments, predicted peak, predicted overhead), and
:func:`predict_overheads` for plans named by their segments (what a benchmark compares with
the runs' own paired overheads).

The predicted overhead of a plan is :meth:`ckptlab.worker.engine.block_timing.ChainTimes.overhead`:
what its checkpointed segments add over the un-checkpointed step, as a fraction of that
step with a 95% interval, timed as the paired timing pass times steps.

Example usage::

    got = predict_overheads(spec, {"half": sequential_segments(8, 2)})
    got["half"].estimate   # 0.21: +21% of an un-checkpointed step
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ckptlab.planning.front import predicted_plans, segments_from_ranges
from ckptlab.planning.planner import BlockProfile, ChainPlan, Segment
from ckptlab.spec.experiment import CheckpointSpec, ExperimentSpec
from ckptlab.strategies import BASELINE, STRATEGIES, Mechanism
from ckptlab.worker.engine.block_timing import TIMING_ROUNDS, ChainTimes, Overhead, time_chain
from ckptlab.worker.engine.training import build_checkpointed, make_optimizer, resolve_device
from ckptlab.worker.models.base import Built

__all__ = ["uniform_settings", "selective_settings", "alternatives", "plan_record", "predict_overheads"]

#: The strategy whose groups are selective checkpoints (``every``, ``policy``).
_SELECTIVE = next(
    name
    for name, s in STRATEGIES.items()
    if s.mechanism == Mechanism.CHECKPOINT_WITH_POLICY and {"every", "policy"} <= set(s.fields)
)


def _counts(n: int) -> list[int]:
    """Segment counts worth comparing on ``n`` blocks: every one from 2 up to 16 blocks,
    powers of two and ``n`` beyond."""
    return list(range(2, n + 1)) if n <= 16 else sorted({2**j for j in range(1, n.bit_length())} | {n})


def uniform_settings(n: int, checkpoint: CheckpointSpec) -> list[tuple[dict[str, Any], tuple[Segment, ...]]]:
    """The settings of the strategy table's plain-checkpoint strategies (mechanism
    ``checkpoint``, not planned) as plans of a chain of ``n`` blocks: a strategy with
    ``segments`` at each count of :func:`_counts`, one with ``every`` at ``every=1``
    (every block its own checkpoint). Each as ``(setting, segments)``, the setting a dict
    ``{"name": its label, "strategy": ..., "segments" or "every": ...}``; settings that
    checkpoint nothing are left out."""
    out = []
    for name, strategy in STRATEGIES.items():
        if strategy.mechanism != Mechanism.CHECKPOINT or strategy.planned:
            continue
        if "segments" in strategy.fields:
            options = [{"segments": k} for k in _counts(n)]
        elif "every" in strategy.fields:
            options = [{"every": 1}]
        else:
            continue
        for option in options:
            ranges = strategy.groups(n, checkpoint.model_copy(update=option))
            if ranges:
                label = strategy.label_for({**checkpoint.model_dump(), **option})
                out.append(({"name": label, "strategy": name, **option}, segments_from_ranges(n, ranges)))
    return out


def selective_settings(
    blocks: Sequence[BlockProfile], checkpoint: CheckpointSpec
) -> list[tuple[dict[str, Any], tuple[Segment, ...]]]:
    """The ``selective`` strategy at ``every=1`` under each selective policy measured for
    every block (:attr:`ckptlab.planning.chain.BlockProfile.policy_profiles`) as a plan of the
    chain (every block a selective checkpoint of its own), as :func:`uniform_settings`
    writes its settings (``{"name", "strategy", "every", "policy"}``)."""
    strategy = STRATEGIES[_SELECTIVE]
    common = [p for p in blocks[0].policies if all(p in b.policies for b in blocks)] if blocks else []
    out = []
    for policy in common:
        option = {"every": 1, "policy": policy}
        label = strategy.label_for({**checkpoint.model_dump(), **option})
        segments = tuple(Segment(i, i + 1, True, policy) for i in range(len(blocks)))
        out.append(({"name": label, "strategy": _SELECTIVE, **option}, segments))
    return out


def alternatives(
    checkpoint: CheckpointSpec, blocks: Sequence[BlockProfile], model: Mapping[str, int], floor: int
) -> list[tuple[dict[str, Any], ChainPlan]]:
    """The uniform strategies' settings (:func:`uniform_settings`) and the selective ones
    (:func:`selective_settings`) as plans of the chain, predicted under the memory model
    (``model``: :func:`ckptlab.planning.planner.plan_chain`'s byte terms; peaks at least
    ``floor`` bytes): what ``auto``'s plan is compared with."""
    settings = uniform_settings(len(blocks), checkpoint) + selective_settings(blocks, checkpoint)
    plans = predicted_plans(blocks, {s["name"]: segs for s, segs in settings}, floor_bytes=floor, **model)
    return [(s, plans[s["name"]]) for s, _ in settings]


def plan_record(plan: ChainPlan, timing: ChainTimes | None) -> dict[str, Any]:
    """A plan as the run summary's ``plan`` records it: ``segments`` (``[start, end,
    checkpointed]``, and the policy as a fourth item where the segment is a selective
    checkpoint), ``checkpointed_blocks``, ``selective_blocks`` (block index as a string ->
    policy; empty without), ``predicted_peak_bytes``, ``recompute_ms`` (ms) and
    ``predicted_overhead`` (:meth:`ckptlab.worker.engine.block_timing.Overhead.as_dict`:
    fractions of the un-checkpointed step; None without ``timing``)."""
    return {
        "segments": [[s.start, s.end, s.checkpointed, *([s.policy] if s.policy else [])] for s in plan.segments],
        "checkpointed_blocks": list(plan.checkpointed_blocks),
        "selective_blocks": {str(s.start): s.policy for s in plan.segments if s.policy},
        "predicted_peak_bytes": plan.predicted_peak_bytes,
        "recompute_ms": plan.recompute_ms,
        "predicted_overhead": timing.overhead(plan.segments).as_dict() if timing is not None else None,
    }


def predict_overheads(
    spec: ExperimentSpec,
    plans: Mapping[str, Sequence[Segment]],
    *,
    device: str | None = None,
    build: Callable[[], Built] | None = None,
    rounds: int = TIMING_ROUNDS,
) -> dict[str, Overhead]:
    """The predicted overhead of each plan (name -> the chain's segments, e.g.
    :func:`ckptlab.planning.chain.sequential_segments`) for ``spec``'s model, from one
    :func:`ckptlab.worker.engine.block_timing.time_chain` of an un-checkpointed copy
    (``build()``'s, or the spec's; on ``device``, default ``spec.device``): what ``auto``'s
    plan states for itself (``plan.predicted_overhead``, ``plan.alternatives``), for any
    plan; selective segments' policies are timed too.

    Raises:
        ValueError: a block did not run in the model's forward.
        RunError: CUDA asked for where there is none.
    """
    dev = resolve_device(device or spec.device)
    baseline = spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(update={"strategy": BASELINE})})
    built = build_checkpointed(baseline, dev, build=build)
    policies = sorted({s.policy for segments in plans.values() for s in segments if s.policy is not None})
    opt = make_optimizer(baseline, list(built.module.parameters()))
    times = time_chain(baseline, dev, built, opt, rounds=rounds, policies=policies)
    return {name: times.overhead(segments) for name, segments in plans.items()}
