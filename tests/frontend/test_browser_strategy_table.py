"""The form builds its strategy choices, the fields each strategy shows and the strategy
axis from the strategy table in ``/api/meta``: a strategy registered in the table (the
``noop_strategy`` fixture; its ``/api/meta`` answered by an in-process app that has it)
appears in the form with no frontend file touched."""

from __future__ import annotations

import re

from playwright.sync_api import expect

from tests.frontend.support import Tab


def test_a_registered_strategy_appears_in_the_form(noop_strategy, client, app_url: str, tab: Tab) -> None:
    page = tab.page
    meta = client.get("/api/meta").json()
    page.route(re.compile(r".*/api/meta$"), lambda route: route.fulfill(json=meta))
    page.goto(app_url + "/#/new")
    option = page.locator('#checkpoint\\.strategy option[value="noop_test"]')
    expect(option).to_have_text("noop_test — wrap no block (a test's strategy)")
    page.select_option("#checkpoint\\.strategy", "noop_test")
    # It reads preserve_rng_state only: the other checkpoint fields are hidden.
    expect(page.locator("#checkpoint\\.preserve_rng_state")).to_be_visible()
    for field in ("segments", "every", "policy", "use_reentrant"):
        expect(page.locator(f"#checkpoint\\.{field}")).to_be_hidden()
    expect(page.locator("#run-count")).to_contain_text("noop_test (true)")  # its label template
    page.select_option("#checkpoint\\.strategy", "sequential")
    expect(page.locator("#checkpoint\\.segments")).to_be_visible()

    page.goto(app_url + "/#/new?mode=sweep")
    page.check("#axis-strategy")
    box = page.locator('[data-axis-value="checkpoint.strategy"][value="noop_test"]')
    expect(box).not_to_be_checked()  # not a sweep default
    box.check()
    expect(page.locator("#run-count")).to_contain_text("3 strategies")
    tab.assert_no_errors()


def test_compile_budget_shows_what_it_compiles_and_sends_it(app_url: str, tab: Tab) -> None:
    """``compile_scope`` is one of compile_budget's fields in the table: the form shows its
    choice for that strategy only, and the choice reaches the spec (the label preview is
    the strategy table's template over the form's spec)."""
    page = tab.page
    page.goto(app_url + "/#/new")
    expect(page.locator("#checkpoint\\.compile_scope")).to_be_hidden()
    page.select_option("#checkpoint\\.strategy", "compile_budget")
    expect(page.locator("#checkpoint\\.compile_scope")).to_be_visible()
    expect(page.locator("#run-count")).to_contain_text("compile_budget (0.5, blocks)")
    page.select_option("#checkpoint\\.compile_scope", "step")
    expect(page.locator("#run-count")).to_contain_text("compile_budget (0.5, step)")
    tab.assert_no_errors()
