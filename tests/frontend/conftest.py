"""Fixtures of the browser tests: one ``python -m ckptlab.cli up`` (backend + worker, SQLite in a
temporary data dir, a free port) and one headless Debian chromium for the whole session,
and the one fixture every browser test takes, ``tab``: a fresh page per test with what it
requested and the errors it showed. Every test here is marked ``browser``; without
/usr/bin/chromium they all skip."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.frontend.support import (
    CHROMIUM,
    CHROMIUM_ARGS,
    VIEWPORT,
    App,
    Tab,
    running_app,
)

if TYPE_CHECKING:
    from playwright.sync_api import Browser, ConsoleMessage

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test of this folder is a browser test (``-m browser`` selects them, as ``make
    screenshots`` does) and skips when Debian's chromium is not installed."""
    no_browser = pytest.mark.skip(reason=f"{CHROMIUM} not found: no browser for the frontend tests")
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.browser)
            if not CHROMIUM.exists():
                item.add_marker(no_browser)


@pytest.fixture(scope="session")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    """``python -m ckptlab.cli up`` (backend + worker, SQLite in a temp dir), shared by the session."""
    with running_app(tmp_path_factory.mktemp("ckptlab-data")) as app:
        yield app


@pytest.fixture(scope="session")
def app_url(app: App) -> str:
    return app.url


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    """Debian's chromium, headless, for the whole session."""
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
def tab(browser: Browser) -> Iterator[Tab]:
    """A fresh page (its own browser context, :data:`VIEWPORT`, 15 s default timeout) that
    records every URL it requests and every uncaught error and console error (see
    :class:`Tab`); closed after the test."""
    context = browser.new_context(viewport=VIEWPORT)
    tab = Tab(context.new_page())
    tab.page.set_default_timeout(15_000)
    tab.page.on("request", lambda req: tab.requested.append(req.url))
    tab.page.on("pageerror", lambda exc: tab.errors.append(str(exc)))

    def console(msg: ConsoleMessage) -> None:
        # Not the browser's note on each 4xx answer: the API's 422s are expected.
        if msg.type == "error" and not msg.text.startswith("Failed to load resource"):
            tab.errors.append(msg.text)

    tab.page.on("console", console)
    try:
        yield tab
    finally:
        context.close()
