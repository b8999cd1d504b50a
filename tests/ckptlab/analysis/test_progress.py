"""The progress arithmetic shared by the API and ``ckptlab run`` (ckptlab/analysis/progress.py)."""

from __future__ import annotations

import pytest

from ckptlab.analysis.progress import (
    PASS_STEP_MS,
    STEPS_PLANNED,
    StepTimes,
    format_duration,
    run_progress,
    steps_planned,
    sweep_eta,
)

SPEC = {"steps": 5, "timed_steps": 20}


def test_a_queued_run_reports_only_its_place_in_the_queue() -> None:
    p = run_progress(spec=SPEC, last_step=None, last_extra=None, elapsed_s=None, queue_position=3)
    assert (p.queue_position, p.step, p.eta_s) == (3, None, None)
    assert p.words() == "position 3 in the queue"


def test_before_its_first_step_a_run_has_a_total_but_no_estimate() -> None:
    p = run_progress(spec=SPEC, last_step=None, last_extra=None, elapsed_s=2.0)
    assert (p.step, p.total_steps, p.eta_s) == (None, 25, None)
    assert p.words().startswith("starting")


def _memory(step_ms: float | None = None) -> dict:
    """A memory step's ``extra`` as the worker writes it (``step_ms``: the pass's step time)."""
    extra = {"pass": "memory", STEPS_PLANNED: steps_planned(5, 20)}
    return extra if step_ms is None else {**extra, PASS_STEP_MS: step_ms}


def _timed(memory_run: int, step_ms: float) -> dict:
    return {"pass": "timed", STEPS_PLANNED: steps_planned(memory_run, 20), PASS_STEP_MS: step_ms}


def test_the_timed_pass_is_estimated_from_its_own_step_times() -> None:
    # 5 memory steps ran, then 3 of 20 timed steps, each round 1.1 s: 17 rounds left.
    p = run_progress(spec=SPEC, last_step=8, last_extra=_timed(5, 1100.0), elapsed_s=600.0)
    assert (p.run_pass, p.pass_step, p.pass_steps, p.done_steps, p.total_steps) == ("timed", 3, 20, 8, 25)
    assert p.eta_s == pytest.approx(17 * 1.1)  # the elapsed time (model, gradient check) is not extrapolated
    assert p.words() == "timed step 3 of 20, about 19 s left"


def test_the_memory_pass_alone_does_not_guess_the_timed_steps() -> None:
    """Tracked memory steps are several times slower than timed steps on CPU: while the
    memory pass runs, only its own rest is estimated, and the whole is not guessed."""
    warm = run_progress(spec=SPEC, last_step=1, last_extra=_memory(), elapsed_s=24.0)
    assert (warm.eta_s, warm.memory_left_s, warm.done_steps, warm.total_steps) == (None, None, 1, 25)
    assert warm.words() == "memory step 1 of ≤5, then 20 timed steps: time left estimated once they start"
    p = run_progress(spec=SPEC, last_step=2, last_extra=_memory(3000.0), elapsed_s=30.0)
    assert (p.eta_s, p.memory_left_s) == (None, pytest.approx(9.0))
    assert (
        p.words()
        == "memory step 2 of ≤5 (about 9 s left in it), then 20 timed steps: time left estimated once they start"
    )


def test_a_run_without_timed_steps_is_estimated_from_its_memory_steps() -> None:
    spec = {"steps": 100, "timed_steps": 0, "memory_early_stop": False}
    p = run_progress(spec=spec, last_step=10, last_extra={"pass": "memory", PASS_STEP_MS: 500.0}, elapsed_s=9.0)
    assert (p.eta_s, p.total_steps, p.done_steps) == (pytest.approx(45.0), 100, 10)
    assert p.words() == "memory step 10 of 100, about 45 s left"
    warm = run_progress(spec=spec, last_step=1, last_extra={"pass": "memory"}, elapsed_s=2.0)
    assert warm.words() == "memory step 1 of 100, time left: estimating…"


def test_a_memory_pass_that_stopped_early_keeps_the_total_and_counts_its_skipped_steps_as_done() -> None:
    # 3 memory steps ran of 5, then the timed steps (numbered from 4): N stays 25.
    p = run_progress(spec=SPEC, last_step=4, last_extra=_timed(3, 500.0), elapsed_s=4.0)
    assert (p.total_steps, p.done_steps, p.pass_step) == (25, 6, 1)
    assert p.eta_s == pytest.approx(19 * 0.5)
    last = run_progress(spec=SPEC, last_step=23, last_extra=_timed(3, 500.0), elapsed_s=14.0)
    assert (last.done_steps, last.total_steps, last.eta_s) == (25, 25, 0.0)


def test_steps_recorded_before_steps_planned_existed_fall_back_on_the_spec() -> None:
    p = run_progress(spec=SPEC, last_step=2, last_extra={"pass": "memory"}, elapsed_s=1.0)
    assert p.total_steps == 25
    old = run_progress(spec=SPEC, last_step=9, last_extra={"pass": "timed", PASS_STEP_MS: 100.0}, elapsed_s=1.0)
    assert (old.pass_step, old.eta_s) == (4, pytest.approx(1.6))  # the memory pass taken as run in full


def test_a_step_past_the_planned_total_is_never_shown_as_more_than_all() -> None:
    p = run_progress(spec=SPEC, last_step=30, last_extra=_timed(5, 100.0), elapsed_s=3.0)
    assert (p.done_steps, p.total_steps, p.pass_step, p.eta_s) == (25, 25, 20, 0.0)


def test_a_pass_step_time_is_the_median_of_its_recent_steps_past_the_warm_up() -> None:
    times = StepTimes(skip=1, window=3)
    assert times.add(10_800.0) is None  # the warm-up: left out
    assert [times.add(ms) for ms in (8500.0, 2800.0, 2700.0, 2900.0)] == [8500.0, 5650.0, 2800.0, 2800.0]
    assert times.add(9000.0) == 2900.0  # one slow step moves the median little


def test_a_sweep_has_an_estimate_once_a_run_finished() -> None:
    assert sweep_eta(total=10, finished=0, elapsed_s=30.0).eta_s is None
    assert sweep_eta(total=10, finished=4, elapsed_s=120.0).eta_s == pytest.approx(180.0)
    assert sweep_eta(total=10, finished=10, elapsed_s=300.0).eta_s == 0.0
    assert sweep_eta(total=10, finished=2, elapsed_s=None).eta_s is None


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0 s"), (44.6, "45 s"), (89, "89 s"), (91, "2 min"), (3600, "1 h"), (4801, "1 h 21 min")]
)
def test_durations_read_in_the_unit_a_person_would_use(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
