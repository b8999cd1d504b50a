"""The sweep recommendation never acts on noise: a saving must be real, a time difference
measurable, and ties go to the simpler setting."""

from __future__ import annotations

import pytest

from ckptlab.backend.services.recommend import recommend
from tests.factories import sweep_row

MIB = 2**20


def test_a_setting_that_saves_nothing_never_wins_on_a_noisy_faster_time():
    base = sweep_row(1, peak=17 * MIB, activations=1 * MIB, step_ms=60.0, jitter=0.5)
    seg1 = sweep_row(2, segments=1, peak=17 * MIB, activations=1 * MIB, step_ms=24.0, jitter=0.5)  # "-60%"
    rec = recommend([base, seg1])
    assert rec.experiment_id == 1 and rec.reason.startswith("nothing beats the baseline")
    assert {"experiment_id": 2, "label": "segments=1"}.items() <= rec.excluded[0].items()


def test_when_the_peak_is_adams_step_the_reason_says_so():
    why = "peak 17.0 MiB is in optimizer.step: optimizer state 50%, activations 0% — checkpointing cannot lower it"
    base = sweep_row(1, peak=17 * MIB, activations=1.2 * MIB, peak_explanation=why)
    rows = [base] + [
        sweep_row(i + 2, segments=s, peak=17 * MIB, activations=a * MIB)
        for i, (s, a) in enumerate([(1, 1.2), (2, 0.6), (4, 0.3)])
    ]
    rec = recommend(rows)
    assert rec.experiment_id == 1 and "optimizer.step" in rec.reason


def test_the_lowest_real_peak_wins_and_a_tie_in_peak_goes_to_the_simpler_setting():
    rows = [
        sweep_row(1, peak=40 * MIB, activations=30 * MIB),
        sweep_row(2, segments=2, peak=25 * MIB, activations=15 * MIB, step_ms=12),
        sweep_row(3, segments=4, peak=18 * MIB, activations=8 * MIB, step_ms=13),
        sweep_row(4, segments=8, peak=18.05 * MIB, activations=7.9 * MIB, step_ms=13),  # same peak within 1%
    ]
    rec = recommend(rows)
    assert rec.experiment_id == 3 and "lowest peak with a real saving" in rec.reason


def test_with_a_budget_the_baseline_wins_when_it_fits_else_the_fastest_fitting_setting():
    rows = [
        sweep_row(1, peak=40 * MIB, activations=30 * MIB, step_ms=10),
        sweep_row(2, segments=2, peak=25 * MIB, activations=15 * MIB, step_ms=12),
        sweep_row(3, segments=4, peak=18 * MIB, activations=8 * MIB, step_ms=14),
    ]
    assert recommend(rows, budget_bytes=64 * MIB).experiment_id == 1
    assert recommend(rows, budget_bytes=30 * MIB).experiment_id == 2
    assert recommend(rows, budget_bytes=20 * MIB).experiment_id == 3
    none = recommend(rows, budget_bytes=10 * MIB)
    assert none.experiment_id is None and none.reason.startswith("nothing fits")


def test_a_noisy_run_that_looks_faster_never_beats_a_steady_one():
    # segments=4's median is the lower, but its steps are so noisy that its overhead's CI
    # reaches far above segments=2's: the order goes by the high end, noise never wins.
    rows = [
        sweep_row(1, peak=40 * MIB, activations=30 * MIB, step_ms=10, jitter=0.01),
        sweep_row(2, segments=2, peak=25 * MIB, activations=15 * MIB, step_ms=12.0, jitter=0.02),
        sweep_row(3, segments=4, peak=18 * MIB, activations=8 * MIB, step_ms=11.5, jitter=0.9),
    ]
    assert recommend(rows, budget_bytes=30 * MIB).experiment_id == 2


def test_wrong_gradients_and_failed_runs_are_excluded_with_a_reason():
    rows = [
        sweep_row(1, peak=40 * MIB, activations=30 * MIB),
        sweep_row(2, segments=2, peak=25 * MIB, activations=15 * MIB, gradients_match=False),
        sweep_row(3, segments=4, peak=18 * MIB, activations=8 * MIB, status="oom"),
    ]
    rec = recommend(rows)
    whys = {e["experiment_id"]: e["why"] for e in rec.excluded}
    assert whys == {2: "its gradients differ", 3: "status oom"} and rec.experiment_id == 1


def test_the_recommendation_lists_what_fits_and_the_smallest_within_an_overhead_of_the_baseline():
    rows = [
        sweep_row(1, peak=40 * MIB, activations=30 * MIB, step_ms=10),
        sweep_row(2, segments=2, peak=25 * MIB, activations=15 * MIB, step_ms=11),  # +10%
        sweep_row(3, segments=4, peak=18 * MIB, activations=8 * MIB, step_ms=13),  # +30%
        sweep_row(4, segments=8, peak=16 * MIB, activations=6 * MIB, step_ms=20),  # +100%
    ]
    rec = recommend(rows, budget_bytes=30 * MIB, within_pct=35)
    assert rec.experiment_id == 2 and rec.fitting == [2, 3, 4]
    within = rec.smallest_within
    assert {"experiment_id": 3, "label": "segments=4", "within_pct": 35}.items() <= within.items()  # 4 is +100%
    assert within["overhead_pct"] == pytest.approx(30, abs=3) and "95% CI" in within["overhead_text"]
    # Against the baseline, not the fastest: nothing that fits is within 5% of its baseline.
    assert recommend(rows, budget_bytes=30 * MIB, within_pct=5).smallest_within is None
    assert recommend(rows).fitting is None and recommend(rows).smallest_within is None
    # Without a budget every candidate that is a choice counts: the baseline is the fastest.
    assert recommend(rows, within_pct=12).smallest_within["experiment_id"] == 2


def test_a_run_whose_estimate_is_above_the_limit_is_never_within_however_wide_its_ci():
    # Issue 32, item 2: segments=8 is +40% by its estimate; its steps are so noisy that its
    # CI reaches below 20%, which named it "within +20%". The estimate decides: the baseline
    # (0%) is the smallest within 20%.
    rows = [
        sweep_row(1, peak=40 * MIB, activations=30 * MIB, step_ms=10, jitter=0.01),
        sweep_row(2, segments=8, peak=16 * MIB, activations=6 * MIB, step_ms=14, jitter=0.9),
    ]
    within = recommend(rows, within_pct=20).smallest_within
    assert within["experiment_id"] == 1 and within["overhead_pct"] == 0


# ----------------------------------------------------------------- paired rows (issue 32)


def paired_row(experiment_id, segments, *, peak_mib, overhead_pct, spread_pct=1.0, raw_ms=100.0, **fields):
    """A row as :func:`ckptlab.backend.services.sweeps.sweep_rows` builds it for a run timed in
    20 rounds paired with an un-checkpointed copy: per-round CPU times whose ratio is
    ``overhead_pct`` +-``spread_pct``, its overhead and words from them; ``raw_ms``: its
    own step times, from a separate run (a busy host moves them, not the pairing)."""
    import random

    from ckptlab.analysis.stats import paired_ratio_ci
    from ckptlab.backend.services.sweeps import overhead_words

    rng = random.Random(experiment_id)
    base = [50.0 * (1 + rng.uniform(-0.3, 0.3)) for _ in range(20)]  # the host's load moves both alike
    run = [b * (1 + overhead_pct / 100) * (1 + rng.uniform(-spread_pct, spread_pct) / 100) for b in base]
    interval = paired_ratio_ci(base, run)
    row = sweep_row(
        experiment_id, segments=segments, peak=peak_mib * MIB, activations=peak_mib * MIB / 2, step_ms=raw_ms, **fields
    )
    row.paired = (base, run, "CPU time")
    row.overhead, row.overhead_text = interval.as_dict(), overhead_words(interval, paired="CPU time")
    row.metrics.update(overhead_pct=interval.estimate_pct, overhead_low_pct=interval.low_pct)
    row.metrics["overhead_high_pct"] = interval.high_pct
    return row


def measurably_faster(a, b) -> bool:
    """``a``'s overhead CI lies wholly below ``b``'s (the issue's "measurably faster"); a
    baseline's is 0 to 0."""

    def ci(r):
        return (0.0, 0.0) if r.role == "baseline" else (r.overhead["low_pct"], r.overhead["high_pct"])

    return ci(a)[1] < ci(b)[0]


def _issue_sweep():
    """The issue's sweep, in miniature: a baseline over every budget; segments 2, 3, 6 by
    paired overhead +30%, +27.5% and +45% (tight); raw step times from separate runs on a busy
    host that say the opposite (segments=3's the slowest, 933 ms)."""
    return [
        sweep_row(1, peak=200 * MIB, activations=150 * MIB, step_ms=964.5),
        paired_row(2, 2, peak_mib=110, overhead_pct=30.0, spread_pct=0.5, raw_ms=389.5),
        paired_row(3, 3, peak_mib=100, overhead_pct=27.5, spread_pct=0.5, raw_ms=933.5),
        paired_row(4, 6, peak_mib=70, overhead_pct=45.0, spread_pct=0.5, raw_ms=535.0),
        sweep_row(5, peak=200 * MIB, activations=150 * MIB, step_ms=330.9, repeat_of=1),  # drift -66%
    ]


def test_the_fastest_fitting_pick_has_no_fitting_setting_measurably_faster():
    # Issue 32, item 1. segments=3's CI lies wholly below segments=2's, by less than the 3%
    # noise threshold of a ratio of the two: the old pick (the simpler segments=2, "not
    # measurably slower") had a fitting setting measurably faster by the paired CIs.
    rows = _issue_sweep()
    assert measurably_faster(rows[2], rows[1])
    rec = recommend(rows, budget_bytes=120 * MIB)
    assert rec.experiment_id == 3
    pick = next(r for r in rows if r.experiment_id == rec.experiment_id)
    assert not [r for r in rows if r.experiment_id in rec.fitting and measurably_faster(r, pick)]
    assert "+28% (95% CI" in rec.reason and "paired" in rec.reason and "ms" not in rec.reason


def test_one_ranking_gives_the_pick_of_every_budget_and_the_table_order():
    rows = _issue_sweep()
    for budget in (60, 75, 105, 115, 250):
        rec = recommend(rows, budget_bytes=budget * MIB)
        # The baseline first (0%, CI 0 to 0), then by the high end of the paired CI.
        assert rec.ranking == [1, 3, 2, 4]
        assert [r.rank for r in rows] == [1, 3, 2, 4, None]  # the repeat is no candidate
        first_fitting = next((i for i in rec.ranking if i in (rec.fitting or [])), None)
        assert rec.experiment_id == first_fitting
        for i in rec.fitting:
            fit = next(r for r in rows if r.experiment_id == i)
            assert not measurably_faster(fit, rows[rec.experiment_id - 1])


def test_within_is_against_the_baseline_never_against_the_fastest():
    # Against the fastest fitting run (+27.5%), segments=6 (+45%) is +14%: "within +20%" of
    # it. Against its baseline it is +45%: never named for 20%; segments=3 (+27.5%) is for 30%.
    rows = _issue_sweep()
    rec = recommend(rows, budget_bytes=120 * MIB, within_pct=20)
    assert rec.smallest_within is None
    rec = recommend(rows, budget_bytes=120 * MIB, within_pct=30)
    assert rec.smallest_within["experiment_id"] == 3 and rec.smallest_within["overhead_pct"] <= 30
    assert rec.smallest_within["overhead_text"].startswith("+28% (95% CI")


def test_within_names_nothing_above_the_limit_when_a_noisy_run_reaches_below_it():
    # The issue's "+39%" at 100 MiB: a noisy run whose CI reaches down to 20% is not within 20%.
    rows = [
        sweep_row(1, peak=200 * MIB, activations=150 * MIB),
        paired_row(2, 2, peak_mib=95, overhead_pct=12.0, spread_pct=1.0),
        paired_row(3, 6, peak_mib=60, overhead_pct=39.0, spread_pct=60.0),
    ]
    assert rows[2].overhead["low_pct"] <= 20 < rows[2].overhead["estimate_pct"]
    within = recommend(rows, budget_bytes=100 * MIB, within_pct=20).smallest_within
    assert within["experiment_id"] == 2 and within["overhead_pct"] <= 20


def test_without_a_budget_the_pick_and_the_within_answer_agree_on_a_near_tie_in_peak():
    """Review of issue 32: 100.5 MiB at +10% and 100.0 MiB at +20%. The lowest-peak pick takes
    the faster of peaks within 1% of the lowest; "within 30%" took the exact minimum and named
    the other. Both name the same run now, and the reason says which peak is the lowest."""
    rows = [
        sweep_row(1, peak=200 * MIB, activations=150 * MIB),
        paired_row(2, 2, peak_mib=100.5, overhead_pct=10.0, spread_pct=1.0),
        paired_row(3, 4, peak_mib=100.0, overhead_pct=20.0, spread_pct=1.0),
    ]
    rec = recommend(rows, within_pct=30)
    assert rec.experiment_id == 2 and rec.smallest_within["experiment_id"] == 2
    assert "the lowest is 100.0 MiB" in rec.reason
