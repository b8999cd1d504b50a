"""Browser tests of a server that asks for a token and of one that restarts: the UI takes the
API token and writes with it; a live stream resumes after a backend restart with no step
missed or repeated."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.frontend.support import (
    RUN_TIMEOUT_MS,
    App,
    Tab,
    _free_port,
    _get_json,
    _request,
    _stop,
    running_app,
    start_ckptlab,
    wait_healthy,
)
from tests.support import age_lease, wait_for

TOKEN = "browser-test-token"
#: Every step event any EventSource of the page received, as [attempt, step], in order.
RECORD_STEPS = """
(() => {
  const Native = window.EventSource;
  window.__stepEvents = [];
  window.EventSource = class extends Native {
    constructor(url, init) {
      super(url, init);
      this.addEventListener('step', (ev) => {
        const d = JSON.parse(ev.data);
        window.__stepEvents.push([d.attempt, d.step]);
      });
    }
  };
})();
"""


@pytest.fixture
def token_app(tmp_path: Path) -> Iterator[App]:
    """``ckptlab up`` with ``CKPTLAB_API_TOKEN`` set (its own data dir and port)."""
    with running_app(tmp_path, CKPTLAB_API_TOKEN=TOKEN) as app:
        yield app


def _fill_long_mlp(page: Page) -> None:
    """The single-experiment form: a small MLP on the CPU with 20,000 steps, every one run
    (memory early stop off: with it the memory pass ends after a few flat steps and the run
    could finish before a test clicks Cancel)."""
    page.select_option("#model\\.kind", "mlp")
    page.fill("#f-mlp-depth", "4")
    page.fill("#f-mlp-width", "32")
    page.fill("#steps", "20000")
    page.select_option("#device", "cpu")
    if not page.locator("#memory_early_stop").is_visible():
        page.click("#advanced > summary")
    page.uncheck("#memory_early_stop")


def _wait_for_stored_step(data_dir: Path, experiment_id: int, step: int) -> None:
    """Wait until the database in ``data_dir`` holds step ``step`` of the experiment's first
    attempt (read straight from the database: no backend needed)."""
    from ckptlab.db import store
    from ckptlab.db.database import make_engine, make_sessionmaker
    from ckptlab.settings import Settings

    engine = make_engine(Settings(data_dir=data_dir).resolved_database_url)
    sessions = make_sessionmaker(engine)

    def stored() -> bool:
        with sessions() as s:
            return store.last_step(s, experiment_id=experiment_id, attempt=1) >= step

    try:
        wait_for(stored, timeout=RUN_TIMEOUT_MS / 1000)
    finally:
        engine.dispose()


def test_with_a_token_the_ui_plans_submits_and_cancels_after_it_is_entered(token_app: App, tab: Tab) -> None:
    page = tab.page
    url = token_app.url
    page.goto(url + "/#/new")
    expect(page.locator("#token-form")).to_be_visible()
    expect(page.locator("#token-state")).to_contain_text("needed")
    _fill_long_mlp(page)

    # Without the token the server says 401 and the page says what to do.
    page.click("#submit")
    expect(page.locator("#auth-needed")).to_be_visible()
    expect(page.locator("#auth-needed")).to_contain_text("API token")
    assert _get_json(f"{url}/api/experiments")[1]["count"] == 0

    page.fill("#api-token", TOKEN)
    page.click("#token-save")
    expect(page.locator("#token-state")).to_contain_text("set for this session")
    expect(page.locator("#auth-needed")).to_be_hidden()

    # Plan: the sweep form's run count comes from the server's dry run (a POST).
    page.goto(url + "/#/new?mode=sweep")
    page.select_option("#model\\.kind", "mlp")
    page.fill("#f-mlp-depth", "4")
    page.check("#axis-segments")
    page.fill("#axis-segments-values", "2,4")
    expect(page.locator("#run-count-total")).to_have_text("4")  # 2 runs + a baseline, twice
    expect(page.locator("#auth-needed")).to_be_hidden()

    # Submit and cancel a long experiment.
    page.goto(url + "/#/new?mode=single")
    _fill_long_mlp(page)
    page.click("#submit")
    page.wait_for_url(re.compile(r"#/experiments/\d+"))
    exp_id = int(re.search(r"#/experiments/(\d+)", page.url).group(1))
    expect(page.locator("#exp-cancel")).to_be_visible(timeout=RUN_TIMEOUT_MS)
    page.click("#exp-cancel")
    expect(page.locator("#exp-status")).to_have_text("cancelled", timeout=30_000)
    assert _get_json(f"{url}/api/experiments/{exp_id}")[1]["status"] == "cancelled"
    expect(page.locator("#auth-needed")).to_be_hidden()
    # The token stays for the session: a reload still writes.
    page.reload()
    expect(page.locator("#token-state")).to_contain_text("set for this session")
    tab.assert_no_errors()


def test_a_live_stream_resumes_after_a_backend_restart_with_no_step_missed_or_repeated(
    tmp_path: Path, tab: Tab
) -> None:
    """Backend and worker as separate processes on one database; the backend is stopped
    while the run stores 100 more steps, then started again on the same port."""
    page = tab.page
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    worker = start_ckptlab(["worker"], tmp_path, "worker.log", CKPTLAB_POLL_INTERVAL_S="0.2")
    backend = start_ckptlab(["serve", "--port", str(port)], tmp_path, "serve.log")
    try:
        wait_healthy(url, backend, log)
        long_run = {
            "model": {"kind": "mlp", "depth": 8, "width": 256},
            "batch_size": 64,
            "steps": 100000,
            "timed_steps": 0,
            "memory_early_stop": False,
            "device": "cpu",
        }
        code, exp = _request(f"{url}/api/experiments", long_run)
        assert code == 201
        page.add_init_script(RECORD_STEPS)
        page.goto(f"{url}/#/experiments/{exp['id']}")
        expect(page.locator("#exp-status")).to_have_text("running", timeout=RUN_TIMEOUT_MS)
        page.wait_for_function("window.__stepEvents.length >= 5", timeout=RUN_TIMEOUT_MS)

        _stop(backend)
        expect(page.locator("#exp-live")).to_have_text("reconnecting…", timeout=15_000)
        # The run goes on while no backend serves: once the worker has stored a backlog of
        # steps the page never got, the restarted backend has to send them all.
        seen = max(step for _attempt, step in page.evaluate("window.__stepEvents"))
        _wait_for_stored_step(tmp_path, exp["id"], seen + 100)
        backend = start_ckptlab(["serve", "--port", str(port)], tmp_path, "serve.log")
        wait_healthy(url, backend, log)
        expect(page.locator("#exp-live")).to_have_text("live", timeout=30_000)
        resumed_at = page.evaluate("window.__stepEvents.length")
        page.wait_for_function(f"window.__stepEvents.length > {resumed_at} + 5", timeout=RUN_TIMEOUT_MS)

        assert _request(f"{url}/api/experiments/{exp['id']}/cancel", {})[0] == 200
        expect(page.locator("#exp-status")).to_have_text("cancelled", timeout=30_000)
        received = page.evaluate("window.__stepEvents")
        code, final = _get_json(f"{url}/api/experiments/{exp['id']}")
        code, stored = _get_json(f"{url}/api/experiments/{exp['id']}/steps")
        assert code == 200 and final["attempt"] == 1
        expected = [[1, s["step"]] for s in stored["data"]]
        assert len(received) == len({tuple(r) for r in received}), "a step arrived twice"
        assert received == expected, "steps missing or out of order"
        tab.assert_no_errors(but="EventSource")
    finally:
        _stop(backend)
        _stop(worker)


def test_a_requeued_experiments_page_shows_the_lost_attempt_and_the_one_that_succeeded(app: App, tab: Tab) -> None:
    from ckptlab.db import queue, store
    from ckptlab.db.database import make_engine, make_sessionmaker
    from ckptlab.settings import Settings
    from tests.factories import make_spec

    page = tab.page
    # Attempt 1 held by a worker that never heartbeats (as after kill -9), reaped; the app's
    # own worker then claims attempt 2 and runs it. The claim is dated 5 s back, past the
    # reaper's 1 s lease here (no waiting it out) but inside the app's own 60 s lease, so
    # the app's reaper does not take it first.
    engine = make_engine(Settings(data_dir=app.data_dir).resolved_database_url)
    try:
        with make_sessionmaker(engine)() as s:
            exp = store.create_experiment(s, spec=make_spec(steps=3), status="running", worker_id="gone-host:4242")
            age_lease(s, experiment_id=exp.id, seconds=5)
            assert queue.reap_lost(s, lease_s=1, max_attempts=3) == 1
    finally:
        engine.dispose()
    page.goto(f"{app.url}/#/experiments/{exp.id}")
    expect(page.locator("#exp-status")).to_have_text("succeeded", timeout=RUN_TIMEOUT_MS)
    history = page.locator("#exp-history li")
    expect(history.last).to_contain_text("succeeded")
    expect(history.last).to_have_attribute("data-attempt", "2")
    lost = page.locator("#exp-history li[data-attempt='1'][data-status='queued']")
    expect(lost).to_contain_text("gone-host:4242")
    expect(lost).to_contain_text("worker gone-host:4242 lost (no heartbeat for 1 s); requeued")
    code, body = _get_json(f"{app.url}/api/experiments/{exp.id}/events/history")
    assert code == 200 and [(e["status"], e["attempt"]) for e in body["data"]] == [
        ("running", 1),
        ("queued", 1),
        ("running", 2),
        ("succeeded", 2),
    ]
    tab.assert_no_errors()
