"""Progress in the browser (issues 23, 32): a queued run's place in the queue, a running run's
pass, "step k of N", its estimate and a bar of the steps done of its fixed total. (A sweep's
estimate is checked in the sweep test of test_browser.py.)"""

from __future__ import annotations

import re
from pathlib import Path

from playwright.sync_api import expect

from tests.frontend.support import (
    RUN_TIMEOUT_MS,
    Tab,
    _free_port,
    _request,
    _stop,
    start_ckptlab,
    wait_healthy,
)

#: A run that goes on until cancelled (steps are cheap: a small MLP).
LONG_RUN = {
    "model": {"kind": "mlp", "depth": 4, "width": 64},
    "batch_size": 16,
    "steps": 100000,
    "timed_steps": 0,
    "memory_early_stop": False,
    "verify_gradients": False,
    "device": "cpu",
}


def test_a_queued_run_shows_its_place_and_a_running_one_its_step_of_the_total_and_time_left(
    tmp_path: Path, tab: Tab
) -> None:
    """One worker slot: the first run runs, the second waits first in the queue."""
    page = tab.page
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    worker = start_ckptlab(["worker", "--cpu-slots", "1"], tmp_path, "worker.log", CKPTLAB_POLL_INTERVAL_S="0.2")
    backend = start_ckptlab(["serve", "--port", str(port)], tmp_path, "serve.log")
    try:
        wait_healthy(url, backend, tmp_path / "serve.log")
        ids = []
        for _ in range(2):
            code, exp = _request(f"{url}/api/experiments", LONG_RUN)
            assert code == 201, exp
            ids.append(exp["id"])

        page.goto(f"{url}/#/experiments/{ids[1]}")
        expect(page.locator("#exp-progress")).to_have_text("· position 1 in the queue", timeout=RUN_TIMEOUT_MS)
        expect(page.locator("#summary-pending")).to_contain_text("position 1 in the queue")
        expect(page.locator("#exp-progress-row")).to_be_hidden()  # no bar while queued

        page.goto(f"{url}/#/experiments/{ids[0]}")
        expect(page.locator("#exp-status")).to_have_text("running", timeout=RUN_TIMEOUT_MS)
        progress = page.locator("#exp-progress")
        # No timed steps: the memory pass is all there is, estimated from its steps past the warm-up.
        expect(progress).to_have_text(re.compile(r"· memory step \d+ of 100000, about .+ left"), timeout=RUN_TIMEOUT_MS)
        first = int(re.search(r"step (\d+)", progress.inner_text()).group(1))
        # The bar (the sweep page's styles): the steps done of the fixed total.
        bar = page.locator("#exp-progress-bar")
        expect(page.locator("#exp-progress-row")).to_be_visible()
        expect(bar).to_have_attribute("aria-valuemax", "100000")
        expect(page.locator("#exp-progress-count")).to_have_text(re.compile(r"^\d+ of 100000$"))
        assert int(bar.get_attribute("aria-valuenow")) >= 1
        page.wait_for_function(
            f"(+(document.getElementById('exp-progress').textContent.match(/step (\\d+)/) || [0, 0])[1]) > {first}",
            timeout=RUN_TIMEOUT_MS,
        )  # it moves on by itself

        for i in ids:
            assert _request(f"{url}/api/experiments/{i}/cancel", {})[0] == 200
        expect(page.locator("#exp-status")).to_have_text("cancelled", timeout=30_000)
        expect(progress).to_be_hidden()
        expect(page.locator("#exp-progress-row")).to_be_hidden()
        tab.assert_no_errors()
    finally:
        _stop(backend)
        _stop(worker)
