"""The progress arithmetic shared by the API and ``ckptlab run`` (ckptlab/analysis/progress.py)."""

from __future__ import annotations

import pytest

from ckptlab.analysis.progress import STEPS_PLANNED, format_duration, run_progress, steps_planned, sweep_eta

SPEC = {"steps": 5, "timed_steps": 20}


def test_a_queued_run_reports_only_its_place_in_the_queue() -> None:
    p = run_progress(spec=SPEC, last_step=None, last_extra=None, elapsed_s=None, queue_position=3)
    assert (p.queue_position, p.step, p.eta_s) == (3, None, None)
    assert p.words() == "position 3 in the queue"


def test_before_its_first_step_a_run_has_a_total_but_no_estimate() -> None:
    p = run_progress(spec=SPEC, last_step=None, last_extra=None, elapsed_s=2.0)
    assert (p.step, p.total_steps, p.eta_s) == (None, 25, None)
    assert p.words().startswith("starting")


def test_the_estimate_extrapolates_the_elapsed_time_over_the_steps_left() -> None:
    p = run_progress(spec=SPEC, last_step=5, last_extra={STEPS_PLANNED: 25}, elapsed_s=10.0)
    assert (p.step, p.total_steps) == (5, 25)
    assert p.eta_s == pytest.approx(40.0)  # 10 s for 5 steps, 20 left
    assert p.words() == "step 5 of 25, about 40 s left"


def test_a_memory_pass_that_stopped_early_shortens_the_total() -> None:
    # 3 memory steps ran of 5, then the timed steps: the step record says 3 + 20.
    p = run_progress(spec=SPEC, last_step=4, last_extra={STEPS_PLANNED: steps_planned(3, 20)}, elapsed_s=4.0)
    assert p.total_steps == 23
    assert p.eta_s == pytest.approx(19.0)


def test_steps_recorded_before_steps_planned_existed_fall_back_on_the_spec() -> None:
    p = run_progress(spec=SPEC, last_step=2, last_extra={"pass": "memory"}, elapsed_s=1.0)
    assert p.total_steps == 25


def test_a_step_past_the_planned_total_is_never_shown_as_more_than_all() -> None:
    p = run_progress(spec=SPEC, last_step=30, last_extra={STEPS_PLANNED: 25}, elapsed_s=3.0)
    assert (p.total_steps, p.eta_s) == (30, 0.0)


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
