"""``sweep_rows``: which run a row's step time is compared with."""

from __future__ import annotations

import random

from ckptlab.backend.services.sweeps import sweep_rows
from ckptlab.db.models import Experiment, Sweep
from tests.factories import spec_dict


def _experiment(exp_id: int, step_ms: float, **checkpoint) -> Experiment:
    rng = random.Random(exp_id)
    times = [step_ms * (1 + rng.uniform(-0.02, 0.02)) for _ in range(20)]
    spec = spec_dict(checkpoint={"strategy": "none", **checkpoint})
    summary = {"step_time_ms": step_ms, "step_times_ms": times, "peak_allocated_bytes": 1000, "activation_bytes": 100}
    return Experiment(
        id=exp_id, spec=spec, status="succeeded", summary=summary, strategy=spec["checkpoint"]["strategy"]
    )


def _compiled_sweep(paired_01: float | None, paired_10: float | None) -> Sweep:
    """none at 100 ms, compile_budget 0.1 at 60 ms and 1.0 at 50 ms, each compiled run paired
    with its eager copy at the given ratio, or stored unpaired (None)."""
    runs = [
        _experiment(2, 60.0, strategy="compile_budget", activation_memory_budget=0.1),
        _experiment(3, 50.0, strategy="compile_budget", activation_memory_budget=1.0),
    ]
    runs = [r if ratio is None else _paired(r, ratio) for r, ratio in zip(runs, (paired_01, paired_10), strict=True)]
    axes = {"checkpoint.strategy": ["compile_budget"], "checkpoint.activation_memory_budget": [0.1, 1.0]}
    return Sweep(id=1, name="s", axes=axes, experiments=[_experiment(1, 100.0), *runs])


def test_a_compiled_run_stored_unpaired_is_timed_against_the_same_compiled_model_at_budget_1():
    """torch.compile at budget 0.1 recomputes: +20% against compile at 1.0, although both
    are faster than the eager baseline; the 1.0 run keeps its comparison with eager (runs
    stored before compiled runs were paired)."""
    rows = {
        r.experiment_id: r for r in sweep_rows(_compiled_sweep(paired_01=None, paired_10=None), noise_threshold_pct=10)
    }
    assert 15 < rows[2].metrics["overhead_pct"] < 25
    assert rows[2].overhead_text.endswith("against strategy=compile_budget budget=1.0")
    assert rows[3].metrics["overhead_pct"] < -40  # against none
    assert "against" not in rows[3].overhead_text


def _paired(exp: Experiment, ratio: float) -> Experiment:
    """``exp`` with 20 paired rounds on CPU at ``ratio`` x its un-checkpointed copy's time."""
    rng = random.Random(exp.id)
    copy_cpu = [100.0 * (1 + rng.uniform(-0.02, 0.02)) for _ in range(20)]
    exp.summary = {
        **exp.summary,
        "device": "cpu",
        "paired_with": "none",
        "paired_baseline_step_times_ms": [100.0] * 20,
        "paired_baseline_cpu_ms": copy_cpu,
        "step_cpu_ms": [t * ratio for t in copy_cpu],
    }
    return exp


def test_a_paired_compiled_run_keeps_its_overhead_against_the_eager_step():
    """A compiled run paired with the eager un-checkpointed copy (issue 31) is on the footing
    of every eager plan: its row is its paired overhead (+8%), not a comparison with the
    compiled model at 1.0 from separate runs (which would read +20%)."""
    row = {
        r.experiment_id: r for r in sweep_rows(_compiled_sweep(paired_01=1.08, paired_10=None), noise_threshold_pct=5)
    }[2]
    assert 7 < row.metrics["overhead_pct"] < 9
    assert "paired with none in one process" in row.overhead_text and "budget=1.0" not in row.overhead_text


def test_a_compiled_run_whose_copy_did_not_fit_is_compared_with_none_beside_a_paired_1_0():
    """A new compiled 1.0 run is paired; a compiled 0.1 run of the same sweep whose eager copy
    did not fit is unpaired: it is compared with the eager baseline (-40%), as any unpaired
    run, not with the paired 1.0 run's step times (+20%, another basis)."""
    row = {
        r.experiment_id: r for r in sweep_rows(_compiled_sweep(paired_01=None, paired_10=0.9), noise_threshold_pct=5)
    }[2]
    assert -45 < row.metrics["overhead_pct"] < -35
    assert "budget=1.0" not in row.overhead_text


def test_a_paired_run_is_judged_on_its_own_rounds_not_against_a_separate_run():
    """The baseline run ran during a load burst (twice as slow); the checkpointed run's own
    rounds with its un-checkpointed copy say +30%: the row reports +30%, from CPU time,
    and says it was paired; a separate-run comparison would have said -35%."""
    base = _experiment(1, 200.0)
    run = _paired(_experiment(2, 130.0, strategy="sequential", segments=2), 1.3)
    sweep = Sweep(id=1, name="s", axes={"checkpoint.segments": [2]}, experiments=[base, run])
    row = {r.experiment_id: r for r in sweep_rows(sweep, noise_threshold_pct=10)}[2]
    assert 29 < row.metrics["overhead_pct"] < 31
    assert "CPU time of rounds paired with none in one process" in row.overhead_text


def test_overhead_words_give_an_estimate_over_too_few_rounds_and_a_reason_for_no_difference():
    """An overhead over 3 rounds is an estimate, not "no measurable difference" (the plan
    page read "no measurable difference (95% CI +20% to +41%)")."""
    from ckptlab.analysis.stats import RatioInterval
    from ckptlab.backend.services.sweeps import overhead_words

    few = RatioInterval(33.0, 20.0, 41.0, rounds=3)
    assert overhead_words(few) == "+33% (95% CI +20% to +41%), not called: too few rounds (3; at least 5)"
    spans_zero = RatioInterval(4.0, -2.0, 9.0, rounds=20)
    assert overhead_words(spans_zero) == "no measurable difference (95% CI -2% to +9%; the 95% CI contains 0)"
    assert overhead_words(RatioInterval(33.0, 20.0, 41.0, rounds=20)) == "+33% (95% CI +20% to +41%)"
