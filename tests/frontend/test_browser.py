"""Browser test of the frontend against the real app (backend + worker + SQLite).

Starts ``python -m ckptlab up`` on a free port with a temporary data dir, drives the page
with Playwright (Debian's chromium, no downloaded browser) and checks the form, the live
experiment view and the validation errors. Also saves the screenshots in docs/screenshots/.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip(f"{CHROMIUM} not found: no browser for the frontend test", allow_module_level=True)

from playwright.sync_api import Browser, Page, expect, sync_playwright  # noqa: E402

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "docs" / "screenshots"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
STARTUP_TIMEOUT_S = 60
RUN_TIMEOUT_MS = 90_000


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get_json(url: str) -> tuple[int, object]:
    """GET without any proxy from the environment (the app is on 127.0.0.1)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=5) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, None


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


@pytest.fixture(scope="module")
def app_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``python -m ckptlab up`` (backend + worker, SQLite in a temp dir); yields its base URL."""
    data_dir = tmp_path_factory.mktemp("ckptlab-data")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTLAB_")}
    env.update(CKPTLAB_DATA_DIR=str(data_dir), PYTHONUNBUFFERED="1")
    log_path = data_dir / "app.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ckptlab", "up", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"ckptlab up exited with {proc.returncode}:\n{log_path.read_text()}")
            try:
                if _get_json(f"{url}/api/health")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"no 200 from {url}/api/health in {STARTUP_TIMEOUT_S} s:\n{log_path.read_text()}")
            time.sleep(0.25)
        yield url
    finally:
        _stop(proc)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def requested_urls() -> list[str]:
    """Every URL the page requested (filled by the ``page`` fixture)."""
    return []


@pytest.fixture
def page_errors() -> list[str]:
    """Uncaught JavaScript errors on the page (filled by the ``page`` fixture)."""
    return []


@pytest.fixture
def page(browser: Browser, requested_urls: list[str], page_errors: list[str]) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    p = context.new_page()
    p.set_default_timeout(15_000)
    p.on("request", lambda req: requested_urls.append(req.url))
    p.on("pageerror", lambda exc: page_errors.append(str(exc)))
    try:
        yield p
    finally:
        context.close()


def _assert_local_only(app_url: str, urls: list[str]) -> None:
    """The page works offline: nothing but the app itself (data:/blob: URLs are not network)."""
    assert urls, "the page made no requests at all"
    foreign = [u for u in urls if not (u.startswith(app_url + "/") or u.startswith(("data:", "blob:")))]
    assert not foreign, f"requests outside {app_url}: {foreign}"


def _count(app_url: str) -> int:
    status, body = _get_json(f"{app_url}/api/experiments")
    assert status == 200
    return body["count"]


def test_run_experiment_and_watch_it(
    app_url: str, page: Page, requested_urls: list[str], page_errors: list[str]
) -> None:
    page.goto(app_url + "/")
    page.fill('[name="model.depth"]', "8")
    page.fill('[name="model.width"]', "64")
    page.fill('[name="batch_size"]', "16")
    page.fill('[name="steps"]', "6")
    page.select_option('[name="checkpoint.strategy"]', "sequential")
    page.fill('[name="checkpoint.segments"]', "4")
    page.select_option('[name="device"]', "cpu")
    page.click("#submit")

    page.wait_for_url(re.compile(r"#/experiments/\d+$"))
    exp_id = int(page.url.rsplit("/", 1)[1])
    status = page.locator("#exp-status")
    expect(status).to_have_text(re.compile(r"^(succeeded|failed)$"), timeout=RUN_TIMEOUT_MS)
    if status.text_content() != "succeeded":
        pytest.fail(f"experiment {exp_id} failed: {page.locator('#exp-error').text_content()}")

    # One chart point per step, and the server stored one row per step.
    assert page.evaluate("document.getElementById('chart-memory').data[0].x.length") == 6
    assert page.evaluate("document.getElementById('chart-time').data.length") >= 1
    code, steps = _get_json(f"{app_url}/api/experiments/{exp_id}/steps")
    assert code == 200
    assert steps["count"] == 6
    assert [s["step"] for s in steps["data"]] == [1, 2, 3, 4, 5, 6]

    expect(page.locator("#exp-summary")).to_contain_text("Activation memory")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.mouse.move(0, 0)  # no hover toolbar on the charts
    page.screenshot(path=str(SCREENSHOTS / "experiment.png"), full_page=True)

    # The list shows the experiment, finished, and its row opens it again.
    page.goto(app_url + "/#/")
    row = page.locator(f'#experiments tr[data-id="{exp_id}"]')
    expect(row.locator("td.status")).to_have_text("succeeded")
    expect(row).to_contain_text("mlp 8x64")
    expect(row).to_contain_text("sequential (4)")
    page.screenshot(path=str(SCREENSHOTS / "home.png"), full_page=True)
    row.locator("td").nth(1).click()
    page.wait_for_url(re.compile(rf"#/experiments/{exp_id}$"))
    expect(page.locator("#exp-status")).to_have_text("succeeded")

    _assert_local_only(app_url, requested_urls)
    assert not page_errors, page_errors


def test_invalid_value_shows_field_error(
    app_url: str, page: Page, requested_urls: list[str], page_errors: list[str]
) -> None:
    before = _count(app_url)
    page.goto(app_url + "/")
    page.select_option('[name="checkpoint.strategy"]', "sequential")
    page.fill('[name="checkpoint.segments"]', "0")
    page.click("#submit")

    segments = page.locator('[name="checkpoint.segments"]')
    error = page.locator('.field:has([name="checkpoint.segments"]) .field-error')
    expect(error).to_be_visible()
    expect(error).not_to_be_empty()
    expect(segments).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#form-error")).to_be_hidden()
    # Only the bad input is marked, and the page stayed on the form.
    assert page.locator('[aria-invalid="true"]').count() == 1
    assert "#/experiments/" not in page.url
    assert _count(app_url) == before

    # Fixing the value clears its error.
    segments.fill("2")
    expect(error).to_have_count(0)

    _assert_local_only(app_url, requested_urls)
    assert not page_errors, page_errors
