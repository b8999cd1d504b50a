"""Will it fit? From the form, "Predict on" a card answers on its own page: fits or not
against the card's capacity, the figures and the memory at the peak, a "what fits" table
over every target, and the same spec run for real beside the prediction."""

from __future__ import annotations

import re

from playwright.sync_api import expect

from tests.frontend.support import RUN_TIMEOUT_MS, Tab


def _small_mlp(page) -> None:
    page.select_option("#model\\.kind", "mlp")
    page.fill("#f-mlp-depth", "4")
    page.fill("#f-mlp-width", "64")
    page.fill("#batch_size", "16")
    page.fill("#steps", "3")
    page.fill("#timed_steps", "2")
    page.select_option("#device", "cpu")


def test_predict_on_a_card_then_every_target(app_url: str, tab: Tab) -> None:
    page = tab.page
    page.goto(app_url + "/#/new")
    _small_mlp(page)
    page.select_option("#predict-target", "h100-80gb")
    page.click("#predict")
    expect(page).to_have_url(re.compile(r"#/predictions/\d+$"), timeout=RUN_TIMEOUT_MS)
    expect(page.locator("#pred-verdict")).to_contain_text("Fits", timeout=RUN_TIMEOUT_MS)
    expect(page.locator("#pred-title")).to_contain_text("H100")
    expect(page.locator("#pred-figures")).to_contain_text("Peak reserved")
    assert page.locator("#pred-categories tbody tr").count() >= 2  # parameters, optimizer state, ...
    expect(page.locator("#pred-bound")).to_contain_text("unverified")
    page.click("#pred-compare")
    table = page.locator("#pred-what-fits tbody tr")
    expect(table.first).to_be_visible(timeout=RUN_TIMEOUT_MS)
    assert table.count() == len(page.evaluate("fetch('/api/meta').then(r => r.json()).then(m => m.targets)"))
    tab.assert_no_errors()


def test_a_prediction_on_the_cpu_beside_the_same_spec_run_for_real(app_url: str, tab: Tab) -> None:
    page = tab.page
    page.goto(app_url + "/#/new")
    _small_mlp(page)
    page.select_option("#predict-target", "cpu")
    page.click("#predict")
    expect(page.locator("#pred-verdict")).to_contain_text("this machine's CPU", timeout=RUN_TIMEOUT_MS)
    page.click("#pred-run-real")
    expect(page).to_have_url(re.compile(r"#/predictions/\d+\?run=\d+$"))
    rows = page.locator("#pred-vs-run tbody tr")
    expect(rows.first).to_be_visible(timeout=RUN_TIMEOUT_MS)
    peak = rows.filter(has_text="Peak allocated").locator("td").nth(3)
    # On the CPU a prediction is the real run's count: no difference to speak of.
    expect(peak).to_have_text(re.compile(r"^[+−]?0\.\d%$"))
    tab.assert_no_errors()
