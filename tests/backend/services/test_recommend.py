"""The sweep recommendation never acts on noise: a saving must be real, a time difference
measurable, and ties go to the simpler setting."""

from __future__ import annotations

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


def test_a_time_difference_inside_the_noise_is_a_tie_that_the_simpler_setting_wins():
    rows = [
        sweep_row(1, peak=40 * MIB, activations=30 * MIB),
        sweep_row(2, segments=2, peak=25 * MIB, activations=15 * MIB, step_ms=12.0, jitter=0.3),
        sweep_row(3, segments=4, peak=18 * MIB, activations=8 * MIB, step_ms=11.8, jitter=0.3),
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


def test_the_recommendation_lists_what_fits_and_the_smallest_within_an_overhead_of_the_fastest():
    rows = [
        sweep_row(1, peak=40 * MIB, activations=30 * MIB, step_ms=10),
        sweep_row(2, segments=2, peak=25 * MIB, activations=15 * MIB, step_ms=11),  # +10%
        sweep_row(3, segments=4, peak=18 * MIB, activations=8 * MIB, step_ms=13),  # +30%
        sweep_row(4, segments=8, peak=16 * MIB, activations=6 * MIB, step_ms=20),  # +100%
    ]
    rec = recommend(rows, budget_bytes=30 * MIB, within_pct=35)
    assert rec.experiment_id == 2 and rec.fitting == [2, 3, 4]
    assert rec.smallest_within == {"experiment_id": 3, "label": "segments=4", "within_pct": 35}  # 4 is +100%
    assert recommend(rows, budget_bytes=30 * MIB, within_pct=5).smallest_within["experiment_id"] == 2  # the fastest
    assert recommend(rows).fitting is None and recommend(rows).smallest_within is None
    # Without a budget every candidate that is a choice counts: the baseline is the fastest.
    assert recommend(rows, within_pct=12).smallest_within["experiment_id"] == 2


def test_a_time_inside_the_noise_counts_as_within_whatever_its_raw_median():
    # segments=8 looks 40% slower by its median, but its steps are so noisy that the 95% CI
    # of the ratio reaches below 20%: noise never rules a setting out.
    rows = [
        sweep_row(1, peak=40 * MIB, activations=30 * MIB, step_ms=10, jitter=0.01),
        sweep_row(2, segments=8, peak=16 * MIB, activations=6 * MIB, step_ms=14, jitter=0.9),
    ]
    assert recommend(rows, within_pct=20).smallest_within["experiment_id"] == 2
