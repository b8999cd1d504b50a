"""Fixtures of the browser tests: one ``python -m cli up`` (backend + worker, SQLite in a
temporary data dir, a free port) and one headless Debian chromium for the whole session,
a fresh page per test. Without /usr/bin/chromium the browser tests skip themselves."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.frontend.support import (
    CHROMIUM,
    CHROMIUM_ARGS,
    VIEWPORT,
    App,
    running_app,
)

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page


@pytest.fixture(scope="session")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    """``python -m cli up`` (backend + worker, SQLite in a temp dir), shared by the session."""
    with running_app(tmp_path_factory.mktemp("ckptlab-data")) as app:
        yield app


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
