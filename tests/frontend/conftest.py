"""Fixtures of the browser tests: one ``python -m cli up`` (backend + worker, SQLite in a
temporary data dir, a free port) and one headless Debian chromium for the whole session,
a fresh page per test. Without /usr/bin/chromium the browser tests skip themselves."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.frontend.support import (
    CHROMIUM,
    CHROMIUM_ARGS,
    REPO,
    STARTUP_TIMEOUT_S,
    VIEWPORT,
    App,
    _free_port,
    _get_json,
    _stop,
)

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page


@pytest.fixture(scope="session")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    """``python -m cli up`` (backend + worker, SQLite in a temp dir), shared by the session."""
    data_dir = tmp_path_factory.mktemp("ckptlab-data")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTLAB_")}
    env.update(CKPTLAB_DATA_DIR=str(data_dir), PYTHONUNBUFFERED="1")
    log_path = data_dir / "app.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "up", "--port", str(port)],
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
        yield App(url=url, data_dir=data_dir)
    finally:
        _stop(proc)


@pytest.fixture(scope="session")
def app_url(app: App) -> str:
    return app.url


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} not found: no browser for the frontend tests")
    from playwright.sync_api import sync_playwright

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
    """Uncaught JavaScript errors and console errors on the page (filled by ``page``)."""
    return []


@pytest.fixture
def page(browser: Browser, requested_urls: list[str], page_errors: list[str]) -> Iterator[Page]:
    context = browser.new_context(viewport=VIEWPORT)
    p = context.new_page()
    p.set_default_timeout(15_000)
    p.on("request", lambda req: requested_urls.append(req.url))
    p.on("pageerror", lambda exc: page_errors.append(str(exc)))
    # Console errors too, except the browser's note on each 4xx answer (422s are expected).
    p.on(
        "console",
        lambda msg: (
            page_errors.append(msg.text)
            if msg.type == "error" and not msg.text.startswith("Failed to load resource")
            else None
        ),
    )
    try:
        yield p
    finally:
        context.close()
