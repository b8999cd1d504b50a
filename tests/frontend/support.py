"""What the browser tests share apart from fixtures: the app's address, HTTP helpers,
screenshots, and rows written straight into the app's database."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from playwright.sync_api import Page

CHROMIUM = Path("/usr/bin/chromium")
REPO = Path(__file__).resolve().parents[2]
#: Where the browser tests save their screenshots: a folder under the system's temporary
#: directory, so a test run leaves the tree as it was; ``make screenshots`` sets
#: ``CKPTLAB_SCREENSHOTS=docs/screenshots`` to regenerate the README's.
SCREENSHOTS = Path(os.environ.get("CKPTLAB_SCREENSHOTS") or Path(tempfile.gettempdir()) / "ckptlab-screenshots")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1280, "height": 900}
STARTUP_TIMEOUT_S = 60
RUN_TIMEOUT_MS = 90_000
CHARTS = {
    "memory_vs_segments": "sweep-chart-memory",
    "time_vs_segments": "sweep-chart-time",
    "pareto": "sweep-chart-pareto",
    "correctness": "sweep-chart-correctness",
}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(url: str, body: object | None = None) -> tuple[int, object]:
    """GET (or POST JSON) without any proxy from the environment (the app is on 127.0.0.1)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with opener.open(req, timeout=10) as resp:
            raw = resp.read()
            ctype = resp.headers.get("content-type", "")
            return resp.status, json.loads(raw or b"null") if "json" in ctype else raw.decode()
    except urllib.error.HTTPError as err:
        return err.code, None


def _get_json(url: str) -> tuple[int, object]:
    return _request(url)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL, for ``ckptlab up`` and then for whatever is left of its
    process group (the worker it started). The group is ours alone: the app was started
    in a new session."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    pgid = proc.pid
    for sig, grace_s in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        if not _group_alive(pgid):
            return
        os.killpg(pgid, sig)
        deadline = time.monotonic() + grace_s
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)


@dataclass(frozen=True)
class App:
    url: str
    data_dir: Path


@dataclass
class Tab:
    """What every browser test gets (the ``tab`` fixture of conftest.py): a fresh page of the
    session's chromium, :data:`VIEWPORT` wide, and what happened on it.

    Attributes:
        page: the page (default timeout 15 s).
        requested: every URL the page requested, in order.
        errors: every uncaught JavaScript error and console error on the page, but the
            browser's own note on each 4xx answer (the API's 422s are expected).
    """

    page: Page
    requested: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def assert_no_errors(self, *, but: str | None = None) -> None:
        """No error on the page; with ``but``, errors that contain that text are expected."""
        unexpected = [e for e in self.errors if but is None or but not in e]
        assert not unexpected, self.errors

    def assert_local_only(self, app_url: str) -> None:
        """The page requested nothing but ``app_url`` (see :func:`_assert_local_only`)."""
        _assert_local_only(app_url, self.requested)


def start_ckptlab(args: list[str], data_dir: Path, log_name: str, **env: str) -> subprocess.Popen:
    """``python -m ckptlab.cli ARGS`` in a new session (so :func:`_stop` ends its whole group), with
    no ``CKPTLAB_*`` variable of ours but ``CKPTLAB_DATA_DIR=data_dir`` and ``env``; output
    goes to ``data_dir / log_name``."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTLAB_")}
    full_env.update(CKPTLAB_DATA_DIR=str(data_dir), PYTHONUNBUFFERED="1", **env)
    with open(data_dir / log_name, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "ckptlab.cli", *args],
            cwd=REPO,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@contextmanager
def running_app(data_dir: Path, **env: str) -> Iterator[App]:
    """``ckptlab up`` (backend + worker) on a free port over ``data_dir``, with ``env``
    (``CKPTLAB_*`` settings), stopped with its whole process group afterwards."""
    port = _free_port()
    proc = start_ckptlab(["up", "--port", str(port)], data_dir, "app.log", **env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, data_dir / "app.log")
        yield App(url=url, data_dir=data_dir)
    finally:
        _stop(proc)


def wait_healthy(url: str, proc: subprocess.Popen, log_path: Path) -> None:
    """Wait until ``url/api/health`` answers 200; fail the test (with the log) when ``proc``
    exits first or after :data:`STARTUP_TIMEOUT_S`."""
    import pytest

    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            pytest.fail(f"{proc.args} exited with {proc.returncode}:\n{log_path.read_text()}")
        try:
            if _get_json(f"{url}/api/health")[0] == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"no 200 from {url}/api/health in {STARTUP_TIMEOUT_S} s:\n{log_path.read_text()}")
        time.sleep(0.25)


def _assert_local_only(app_url: str, urls: list[str]) -> None:
    """The page works offline: nothing but the app itself (data:/blob: URLs are not network)."""
    assert urls, "the page made no requests at all"
    foreign = [u for u in urls if not (u.startswith(app_url + "/") or u.startswith(("data:", "blob:")))]
    assert not foreign, f"requests outside {app_url}: {foreign}"


def _count(app_url: str, what: str = "experiments") -> int:
    status, body = _get_json(f"{app_url}/api/{what}")
    assert status == 200
    return body["count"]


#: True once nothing on the page is still moving: every CSS transition and finite animation
#: (the charts' hover toolbar fading out, a progress bar's width) has finished; endless ones
#: (the live indicator's pulse) do not count. ``getAnimations`` applies pending style changes
#: first, so a transition the last mouse move or blur started is among them.
SETTLED_JS = """() => document.getAnimations().every(
  (a) => a.playState !== 'running' || !a.effect || a.effect.getComputedTiming().iterations === Infinity)"""


def _screenshot(page: Page, name: str, *, full_page: bool = True) -> None:
    """Save the page as ``SCREENSHOTS/name`` (``CKPTLAB_SCREENSHOTS``, see :data:`SCREENSHOTS`)
    with no hover toolbar, tooltip or focus ring, once nothing moves (:data:`SETTLED_JS`)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.mouse.move(0, 0)  # no hover toolbar or tooltip on the charts
    page.evaluate("document.activeElement && document.activeElement.blur()")  # no focus ring
    page.wait_for_function(SETTLED_JS)
    page.screenshot(path=str(SCREENSHOTS / name), full_page=full_page)


#: Bounding boxes of every chart's chart title, axis titles, legend and tick-label groups,
#: and the pairs among them that overlap (by more than a pixel each way): issue 23's
#: "no overlapping text" check. Tick labels are one box per axis (their union).
CHART_OVERLAPS_JS = """(ids) => {
  const box = (r) => ({l: r.left, r: r.right, t: r.top, b: r.bottom});
  const union = (els) => {
    const rs = els.map((e) => e.getBoundingClientRect()).filter((r) => r.width > 0 && r.height > 0);
    if (!rs.length) return null;
    return {l: Math.min(...rs.map((r) => r.left)), r: Math.max(...rs.map((r) => r.right)),
            t: Math.min(...rs.map((r) => r.top)), b: Math.max(...rs.map((r) => r.bottom))};
  };
  const out = {};
  for (const id of ids) {
    const root = document.getElementById(id);
    if (!root || !root.querySelector('.main-svg')) { out[id] = {missing: true}; continue; }
    const parts = {};
    const add = (name, b) => { if (b && b.r - b.l > 0 && b.b - b.t > 0) parts[name] = b; };
    add('chart title', union([...root.querySelectorAll('.gtitle')]));
    for (const t of root.querySelectorAll('[class$="title"] text, text[class$="title"]')) {
      const cls = t.getAttribute('class') || t.parentNode.getAttribute('class');
      if (cls && cls !== 'gtitle') add(cls, box(t.getBoundingClientRect()));
    }
    add('legend', union([...root.querySelectorAll('.legend .bg')]));
    const ticks = root.querySelectorAll('[class^="x"][class$="tick"], [class^="y"][class$="tick"]');
    for (const axis of new Set([...ticks].map((e) => e.getAttribute('class')))) {
      add(axis + ' labels', union([...root.querySelectorAll('.' + axis + ' text')]));
    }
    const names = Object.keys(parts);
    const overlaps = [];
    for (let i = 0; i < names.length; i++) for (let j = i + 1; j < names.length; j++) {
      const a = parts[names[i]], b = parts[names[j]];
      const w = Math.min(a.r, b.r) - Math.max(a.l, b.l), h = Math.min(a.b, b.b) - Math.max(a.t, b.t);
      if (w > 1 && h > 1) overlaps.push(names[i] + ' / ' + names[j]);
    }
    const plot = union([...root.querySelectorAll('.nsewdrag')]);
    const whole = root.getBoundingClientRect();
    out[id] = {parts: names, overlaps, plot_share: plot ? (plot.b - plot.t) / whole.height : null};
  }
  return out;
}"""


def chart_overlaps(page: Page, chart_ids: list[str]) -> dict[str, dict]:
    """:data:`CHART_OVERLAPS_JS` on the charts ``chart_ids``: per chart, the text boxes found
    (``parts``), the pairs that overlap (``overlaps``) and the plot area's share of the
    chart's height (``plot_share``)."""
    return page.evaluate(CHART_OVERLAPS_JS, chart_ids)


#: The widths the screenshots and the overlap check use, px.
CHECKED_WIDTHS = (1280, 1920)


def assert_charts_clear(
    page: Page, chart_ids: list[str], *, screenshot: str | None = None, timeout_s: float = 8.0
) -> None:
    """At each of :data:`CHECKED_WIDTHS`, the charts ``chart_ids`` are drawn with no two of
    their titles, legends and tick-label groups overlapping, and each plot keeps at least
    40% of its chart's height (labels do not take it over). Waits up to ``timeout_s`` per
    width for the page to fit its charts after the resize, then saves the page as
    ``<screenshot>-<width>.png`` when ``screenshot`` is given; the viewport is put back."""
    before = page.viewport_size
    try:
        for width in CHECKED_WIDTHS:
            page.set_viewport_size({"width": width, "height": VIEWPORT["height"]})
            deadline = time.monotonic() + timeout_s
            while True:
                got = chart_overlaps(page, chart_ids)
                bad = {
                    k: v for k, v in got.items() if v.get("missing") or v["overlaps"] or (v["plot_share"] or 0) < 0.4
                }
                if not bad:
                    break
                if time.monotonic() > deadline:
                    _screenshot(page, f"overlap-{width}.png")  # what the assertion saw
                    raise AssertionError(f"at {width} px: {bad}")
                page.wait_for_timeout(250)
            if screenshot:
                _screenshot(page, f"{screenshot}-{width}.png")
    finally:
        page.set_viewport_size(before)


def _trace_names(page: Page, div_id: str) -> list[str]:
    return page.evaluate(f"(document.getElementById('{div_id}').data || []).map((t) => t.name)")


def _insert_finished_experiments(app_dir: Path, n: int) -> list[int]:
    """``n`` succeeded experiments written straight into the app's SQLite database (no worker
    runs them), with plausible summaries."""
    from ckptlab.db import store
    from ckptlab.db.database import make_engine, make_sessionmaker
    from ckptlab.settings import Settings
    from ckptlab.spec.experiment import ExperimentSpec

    engine = make_engine(Settings(data_dir=app_dir).resolved_database_url)
    sessions = make_sessionmaker(engine)
    ids = []
    strategies = ["none", "sequential", "per_block", "selective", "offload"]
    try:
        with sessions() as session:
            for i in range(n):
                strategy = strategies[i % len(strategies)]
                spec = ExperimentSpec.model_validate(
                    {
                        "model": {"kind": "mlp", "depth": 16, "width": 256},
                        "batch_size": 32 * (1 + i % 4),
                        "device": "cpu",
                        "checkpoint": {"strategy": strategy, "segments": 4},
                    }
                )
                exp = store.create_experiment(session, spec=spec, status="succeeded", worker_id="test")
                act = 1_000_000 * (1 + i % 7) // (2 if strategy != "none" else 1)
                exp.summary = {
                    "activation_bytes": act,
                    "peak_allocated_bytes": 4_000_000 + act,
                    "step_time_ms": 5.0 + (i % 11),
                    "gradients_match": None if strategy == "none" else True,
                    "grad_max_abs_diff": None if strategy == "none" else 0.0,
                }
                exp.finished_at = exp.created_at + timedelta(seconds=1)
                exp.attempt = 1
                session.commit()
                ids.append(exp.id)
    finally:
        engine.dispose()
    return ids


def submit_and_finish(page: Page) -> int:
    """Click the form's submit, follow to the experiment page and wait until the run
    succeeded (the test fails with the run's error otherwise); returns its id."""
    import re

    import pytest
    from playwright.sync_api import expect

    page.click("#submit")
    page.wait_for_url(re.compile(r"#/experiments/\d+$"))
    exp_id = int(page.url.rsplit("/", 1)[1])
    status = page.locator("#exp-status")
    expect(status).to_have_text(re.compile(r"^(succeeded|failed)$"), timeout=RUN_TIMEOUT_MS)
    if status.text_content() != "succeeded":
        pytest.fail(f"experiment {exp_id} failed: {page.locator('#exp-error').text_content()}")
    return exp_id
