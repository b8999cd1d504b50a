"""The form builds its model-kind choices, each kind's field group (fields, bounds, hints,
starting values) and the model's label from the model-kind table in ``/api/meta``: a kind
registered in the table (the ``noop_model_kind`` fixture; its ``/api/meta`` answered by an
in-process app that has it) appears in the form with no frontend file touched."""

from __future__ import annotations

import re

from playwright.sync_api import expect

from tests.frontend.support import Tab


def test_a_registered_model_kind_appears_in_the_form(noop_model_kind, client, app_url: str, tab: Tab) -> None:
    page = tab.page
    meta = client.get("/api/meta").json()
    page.route(re.compile(r".*/api/meta$"), lambda route: route.fulfill(json=meta))
    page.goto(app_url + "/#/new")
    options = page.locator("#model\\.kind option")
    expect(options.nth(1)).to_have_attribute("value", "noop_kind")  # by rank, after the default kind
    expect(options.nth(1)).to_have_text("noop_kind — linear blocks (a test's kind)")
    expect(page.locator("#model\\.kind")).to_have_value("mlp")  # the default kind stays chosen
    expect(page.locator("#f-noop_kind-depth")).to_be_hidden()

    page.select_option("#model\\.kind", "noop_kind")
    depth, features = page.locator("#f-noop_kind-depth"), page.locator("#f-noop_kind-features")
    expect(depth).to_be_visible()
    expect(depth).to_have_value("3")  # the entry's example
    expect(features).to_have_value("16")
    expect(features).to_have_attribute("max", "64")  # the spec class's bound
    expect(page.locator(".field:has(#f-noop_kind-features) .hint")).to_have_text("features per block, 1–64")
    expect(page.locator("#f-mlp-width")).to_be_hidden()
    expect(page.locator("#run-count")).to_contain_text("noop_kind 3×16")  # its label template
    expect(page.locator("#request-preview")).to_contain_text('"kind": "noop_kind"')
    page.fill("#f-noop_kind-features", "")
    expect(page.locator("#run-count")).to_contain_text("noop_kind 3×?")

    # The running server (another process) has no such kind: its 422 lands on the kind choice.
    page.fill("#f-noop_kind-features", "8")
    page.click("#submit")
    error = page.locator(".field:has(#model\\.kind) .field-error")
    expect(error).to_contain_text("unknown model kind 'noop_kind'")
    assert page.url.endswith("#/new")

    # Back to mlp: its fields again, with its example.
    page.select_option("#model\\.kind", "mlp")
    expect(page.locator("#f-mlp-width")).to_be_visible()
    expect(page.locator("#f-noop_kind-depth")).to_be_hidden()
    tab.assert_no_errors()
