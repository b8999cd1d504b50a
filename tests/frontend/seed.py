"""Rows written straight into a running app's database (no worker runs them), for pages that
need finished runs with given figures: a profile-like run with a long model name, a wide
sweep (many runs with long labels) and a finished plan for a budget."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

MIB = 2**20


def _strategy_fields() -> dict[str, tuple[str, ...]]:
    from ckptlab.strategies import STRATEGIES

    return {name: tuple(s.fields) for name, s in STRATEGIES.items()}


#: Each strategy's checkpoint fields (which ones read ``segments``).
STRATEGY_FIELDS = _strategy_fields()

#: A model name as long as ``ckptlab.profile`` stores for a class deep in a package.
LONG_TARGET = (
    "transformers.models.llama.modeling_llama_with_a_much_longer_module_name_than_usual:"
    "LlamaForCausalLMWithAnExceptionallyLongClassNameThatNoLayoutExpects"
)


@contextmanager
def app_session(app_dir: Path) -> Iterator[Any]:
    """A SQLAlchemy session on the database of the app whose data dir is ``app_dir``."""
    from ckptlab.db.database import make_engine, make_sessionmaker
    from ckptlab.settings import Settings

    engine = make_engine(Settings(data_dir=app_dir).resolved_database_url)
    try:
        with make_sessionmaker(engine)() as session:
            yield session
    finally:
        engine.dispose()


def _summary(spec: Any, peak: int, act: int, ms: float, rng: random.Random, **extra: Any) -> dict[str, Any]:
    baseline = spec.checkpoint.strategy == "none"
    return {
        "peak_allocated_bytes": peak,
        "activation_bytes": act,
        "step_time_ms": ms,
        "step_times_ms": [ms * (1 + rng.uniform(-0.05, 0.05)) for _ in range(20)],
        "gradients_match": None if baseline else True,
        "grad_max_abs_diff": None if baseline else 0.0,
        **extra,
    }


def _add_steps(session: Any, exp_ids: list[int], n: int = 6) -> None:
    from ckptlab.db import store
    from tests.factories import step_record

    for exp_id in exp_ids:
        store.add_steps(session, experiment_id=exp_id, attempt=1, records=[step_record(s) for s in range(1, n + 1)])


def insert_profile_run(app_dir: Path, target: str = LONG_TARGET) -> int:
    """A succeeded run as ``ckptlab.profile`` stores one (model kind ``python`` named by its
    class's import path, ``target``), with a few steps; returns its id."""
    from ckptlab.db import store
    from ckptlab.spec.experiment import ExperimentSpec
    from tests.factories import spec_dict

    spec = ExperimentSpec.model_validate(
        spec_dict(model={"kind": "python", "target": target, "depth": 4}, **{"checkpoint.strategy": "per_block"})
    )
    with app_session(app_dir) as session:
        exp = store.create_experiment(session, spec=spec, status="succeeded", worker_id="profile:1")
        exp.attempt = 1
        exp.summary = _summary(spec, 40 * MIB, 12 * MIB, 412.5, random.Random(0), model=target.rsplit(":", 1)[1])
        session.commit()
        _add_steps(session, [exp.id])
        return exp.id


def insert_finished_sweep(
    app_dir: Path,
    name: str,
    base: Mapping[str, Any],
    axes: Mapping[str, list[Any]],
    figures: Callable[[Any], tuple[int, int, float, dict[str, Any]]],
) -> tuple[int, dict[str, int]]:
    """A sweep of ``base`` over ``axes`` whose runs all succeeded, each with the figures
    ``figures(spec)`` gives: (peak bytes, activation bytes, step ms, other summary fields),
    and a few steps. Returns the sweep's id and its experiment ids by run label (a
    baseline's prefixed "base ")."""
    from ckptlab.db.models import Experiment, Sweep
    from ckptlab.spec.sweeps import axis_label, plan_sweep

    plan = plan_sweep(dict(base), dict(axes))
    runs = [r for r in plan.runs if not r.repeat]
    with app_session(app_dir) as session:
        sweep = Sweep(name=name, base=dict(base), axes=dict(axes), invalid=plan.invalid, cancelled=False)
        for i, run in enumerate(runs):
            peak, act, ms, extra = figures(run.spec)
            sweep.experiments.append(
                Experiment(
                    spec=run.spec.model_dump(mode="json"),
                    model_kind=run.spec.model.kind,
                    strategy=run.spec.checkpoint.strategy,
                    status="succeeded",
                    attempt=1,
                    worker_id="test",
                    summary=_summary(run.spec, peak, act, ms, random.Random(i), **extra),
                )
            )
        session.add(sweep)
        session.commit()
        pairs = zip(runs, sweep.experiments, strict=True)
        ids = {("base " if r.baseline else "") + axis_label(r.values): e.id for r, e in pairs}
        _add_steps(session, list(ids.values()), n=3)
        return sweep.id, ids


def insert_wide_sweep(app_dir: Path) -> tuple[int, dict[str, int]]:
    """A finished sweep like the issue's (a transformer, segments 1, 2, 3, 6 x RNG x AMP):
    sixteen runs with long labels, so a wide table and a tall gradient chart."""
    from tests.factories import spec_dict

    base = spec_dict(
        model={"kind": "transformer", "depth": 6, "d_model": 128, "heads": 4, "seq_len": 128, "vocab_size": 1000},
        **{"checkpoint.strategy": "sequential"},
    )
    axes = {"checkpoint.segments": [1, 2, 3, 6], "checkpoint.preserve_rng_state": [True, False], "amp": ["off", "bf16"]}

    def figures(spec: Any) -> tuple[int, int, float, dict[str, Any]]:
        c = spec.checkpoint
        act = (60 if c.strategy == "none" else 60 // c.segments + 8) * MIB
        return 40 * MIB + act, act, 330.0 + 60 * (c.segments or 1), {"grad_max_abs_diff": 1.2e-7}

    return insert_finished_sweep(app_dir, "gpt 6x128 segments x rng x amp", base, axes, figures)


#: The plan's paired overheads (estimate, 95% CI low and high, %) by setting: the front of
#: none, auto, sequential 2 and 4 and per_block; sequential 8 beaten by per_block.
PLAN_OVERHEADS = {
    "auto": (9.0, 5.0, 13.0),
    "per_block": (31.0, 27.0, 35.0),
    "sequential 2": (12.0, 8.0, 16.0),
    "sequential 4": (22.0, 18.0, 26.0),
    "sequential 8": (38.0, 33.0, 43.0),
}
#: What the plan's planner predicted (issue 31 item 1), overheads as fractions of the
#: un-checkpointed step (estimate, 95% interval low and high): the auto plan's own, and its
#: front as (budget MiB, predicted peak MiB, overhead), lowest budget first.
PLAN_PREDICTED: dict[str, Any] = {
    "auto": (0.105, 0.085, 0.125),
    "front": [
        (61, 60, (0.28, 0.25, 0.31)),
        (80, 78, (0.19, 0.17, 0.21)),
        (106, 103, (0.105, 0.085, 0.125)),
        (136, 136, (0.0, 0.0, 0.0)),
    ],
}


def predicted_overhead(estimate: float, low: float, high: float) -> dict[str, Any]:
    """A plan's ``predicted_overhead`` as the worker stores it
    (``ckptlab.worker.engine.block_timing.Overhead.as_dict``): fractions of the
    un-checkpointed step, 6 timing rounds of CPU time."""
    return {"estimate": estimate, "low": low, "high": high, "q1": low, "q3": high, "rounds": 6, "clock": "CPU time"}


#: Raw median step times (ms) of the plan's separate runs on a busy host: sequential 2 drew
#: faster than none (issue 32), though it paid +12% over its paired copy.
PLAN_RAW_MS = {"none": 390.4, "auto": 352.4, "per_block": 460.0, "sequential 2": 283.9, "sequential 4": 460.0}


def paired_summary(estimate: float, low: float, high: float, rounds: int = 20) -> dict[str, Any]:
    """A CPU run's paired timing pass: its stored overhead over its un-checkpointed copy (%,
    with its 95% CI) and the CPU times of its rounds."""
    return {
        "paired_overhead": {
            "estimate_pct": estimate,
            "low_pct": low,
            "high_pct": high,
            "rounds": rounds,
            "clock": "CPU time",
        },
        "paired_with": "none",
        "paired_baseline_step_times_ms": [100.0] * rounds,
        "paired_baseline_cpu_ms": [100.0] * rounds,
        "step_cpu_ms": [100.0 + estimate] * rounds,
    }


def insert_plan(
    app_dir: Path, budget: int = 110 * MIB, compiled: dict[str, Any] | None = None
) -> tuple[int, dict[str, int]]:
    """A finished plan for ``budget`` of an MLP of 8 blocks: the auto run (its plan:
    blocks 0-3 checkpointed, a predicted peak 3 MiB under its measured one), none,
    per_block and sequential at 2, 4 and 8 segments; some fit the budget, some not. Each
    run but none was timed paired (:data:`PLAN_OVERHEADS`); their raw step times
    (:data:`PLAN_RAW_MS`) disagree with those, as separate runs on a busy host do.
    ``compiled``: the plan's ``compiled`` record (``checkpoint.search_compile``), if any."""
    from ckptlab.backend.services.plans import plan_request
    from tests.factories import spec_dict

    base, axes = plan_request(spec_dict(), budget)
    blocks = [{"retained_bytes": 9 * MIB, "forward_ms": 1.5} for _ in range(8)]
    plan = {
        "segments": [[0, 4, True], [4, 8, False]],
        "checkpointed_blocks": [0, 1, 2, 3],
        "recompute_ms": 6.0,
        "predicted_overhead": predicted_overhead(*PLAN_PREDICTED["auto"]),
        "front": [
            {
                "budget_bytes": budget * MIB,
                "predicted_peak_bytes": peak * MIB,
                "predicted_overhead": predicted_overhead(*o),
            }
            for budget, peak, o in PLAN_PREDICTED["front"]
        ],
    }
    if compiled is not None:
        plan.update(compiled=compiled, chosen="compile_budget" if compiled["chosen"] else "checkpoints")

    def figures(spec: Any) -> tuple[int, int, float, dict[str, Any]]:
        c = spec.checkpoint
        key = f"{c.strategy} {c.segments}" if "segments" in STRATEGY_FIELDS[c.strategy] else c.strategy
        paired = paired_summary(*PLAN_OVERHEADS[key]) if key in PLAN_OVERHEADS else {}
        ms = PLAN_RAW_MS.get(key, 620.0)
        if c.strategy == "auto":
            peak = budget - 4 * MIB
            extra = {"plan": {**plan, "blocks": blocks}, "predicted_peak_bytes": peak - 3 * MIB}
            return peak, peak - 40 * MIB, ms, {**extra, **paired}
        act = {"none": 96, "per_block": 20}.get(c.strategy, 96 // (c.segments or 1) + 9) * MIB
        return 40 * MIB + act, act, ms, paired

    return insert_finished_sweep(app_dir, f"plan: mlp under {budget // MIB} MiB", base, axes, figures)
