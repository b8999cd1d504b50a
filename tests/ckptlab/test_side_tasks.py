"""Side tasks: a loop that raises is reported (and restarted when asked), never swallowed."""

from __future__ import annotations

import logging
import threading

import pytest

from ckptlab.side_tasks import SideTask, first_dead
from tests.support import wait_for


def test_a_loop_that_raises_dies_loudly_and_tells_its_owner(caplog):
    deaths: list[tuple[str, str]] = []
    passes = []

    def step() -> None:
        passes.append(1)
        if len(passes) == 3:
            raise RuntimeError("disk on fire")

    task = SideTask("probe", step, interval_s=0.01, on_death=lambda t, e: deaths.append((t.name, str(e))))
    with caplog.at_level(logging.ERROR, logger="ckptlab.side_tasks"):
        task.start()
        wait_for(lambda: task.dead, timeout=5, interval=0.01)
    assert deaths == [("probe", "disk on fire")] and len(passes) == 3
    assert isinstance(task.error, RuntimeError)
    assert first_dead([task]) is task
    assert "side task probe died: RuntimeError: disk on fire" in caplog.text


def test_a_restarting_loop_logs_each_failure_and_goes_on(caplog):
    passes = []

    def step() -> None:
        passes.append(1)
        if len(passes) <= 2:
            raise ValueError("flaky")

    task = SideTask("warmer", step, interval_s=0.01, restart=True)
    with caplog.at_level(logging.ERROR, logger="ckptlab.side_tasks"):
        task.start()
        wait_for(lambda: len(passes) >= 4, timeout=5, interval=0.01)
        task.stop()
    assert task.restarts == 2 and task.error is None and not task.alive
    assert caplog.text.count("side task warmer raised; restarting it") == 2
    assert first_dead([task]) is None


def test_stop_ends_the_loop_without_a_death():
    ran = threading.Event()
    task = SideTask("idle", ran.set, interval_s=60).start()
    wait_for(ran.is_set, timeout=5, interval=0.01)
    task.stop(timeout_s=5)
    assert not task.alive and not task.dead


def test_the_interval_must_be_positive():
    with pytest.raises(ValueError, match="interval_s"):
        SideTask("x", lambda: None, interval_s=0)
