"""Browser tests of degraded and wrong input: no event streams (the pages poll), field
errors of bad values in the experiment and sweep forms."""

from __future__ import annotations

import re

from playwright.sync_api import expect

from tests.factories import hf_model, spec_dict
from tests.frontend.support import (
    RUN_TIMEOUT_MS,
    Tab,
    _count,
    _request,
)


def test_without_event_streams_the_pages_poll(app_url: str, tab: Tab) -> None:
    """A proxy that refuses ``text/event-stream`` (here: every /events answered 503): the
    experiment and sweep pages fall back to polling and still finish."""
    page = tab.page
    page.route(re.compile(r".*/events(\?.*)?$"), lambda route: route.fulfill(status=503, body="no streams here"))
    tiny = {
        "model": {"kind": "mlp", "depth": 4, "width": 16},
        "batch_size": 8,
        "steps": 3,
        "timed_steps": 0,
        "device": "cpu",
    }
    code, exp = _request(f"{app_url}/api/experiments", tiny)
    assert code == 201
    page.goto(f"{app_url}/#/experiments/{exp['id']}")
    expect(page.locator("#exp-status")).to_have_text("succeeded", timeout=RUN_TIMEOUT_MS)
    assert page.evaluate("document.getElementById('chart-time').data[0].x.length") == 3
    code, sweep = _request(
        f"{app_url}/api/sweeps",
        {
            "name": "polled",
            "base": {**tiny, "checkpoint": {"strategy": "sequential"}},
            "axes": {"checkpoint.segments": [2, 4]},
        },
    )
    assert code == 201
    page.goto(f"{app_url}/#/sweeps/{sweep['id']}")
    expect(page.locator("#sweep-progress-text")).to_have_text("4 of 4", timeout=RUN_TIMEOUT_MS)  # baseline twice
    page.wait_for_function("(document.getElementById('sweep-chart-correctness').data || [{x: []}])[0].x.length === 2")
    assert any("/events" in u for u in tab.requested), "the pages did not try their streams first"
    tab.assert_local_only(app_url)
    tab.assert_no_errors(but="EventSource")


# ----------------------------------------------------------------------------- errors


def test_invalid_value_shows_field_error(app_url: str, tab: Tab) -> None:
    page = tab.page
    before = _count(app_url)
    page.goto(app_url + "/#/new")
    page.select_option("#checkpoint\\.strategy", "sequential")
    page.fill("#checkpoint\\.segments", "0")
    page.click("#submit")

    segments = page.locator("#checkpoint\\.segments")
    error = page.locator(".field:has(#checkpoint\\.segments) .field-error")
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

    # ["body", "model", "width"] (a field of the kind) is mapped to the width input.
    page.fill("#f-mlp-width", "0")
    page.click("#submit")
    width_error = page.locator(".field:has(#f-mlp-width) .field-error")
    expect(width_error).to_contain_text("greater than or equal to 1")
    expect(page.locator("#f-mlp-width")).to_have_attribute("aria-invalid", "true")
    page.fill("#f-mlp-width", "64")

    # An emptied number field says it is required, before anything is sent.
    page.fill("#f-mlp-depth", "")
    expect(page.locator("#run-count")).to_contain_text("mlp ?×64")
    page.click("#submit")
    expect(page.locator(".field:has(#f-mlp-depth) .field-error")).to_have_text("required: type a number")
    assert _count(app_url) == before
    page.fill("#f-mlp-depth", "8")

    tab.assert_local_only(app_url)
    tab.assert_no_errors()


def test_invalid_sweep_values_show_field_errors(app_url: str, tab: Tab) -> None:
    page = tab.page
    sweeps = _count(app_url, "sweeps")
    page.goto(app_url + "/#/new?mode=sweep")
    page.click("[data-preset='tiny']")
    page.check("#axis-segments")
    list_input = page.locator("#axis-segments-values")
    list_error = page.locator(".axis:has(#axis-segments-values) .field-error")

    # A list that does not parse, and a repeated value (the API refuses both): caught here.
    list_input.fill("2, x")
    expect(page.locator("#plan-notes")).to_contain_text("Segment counts: “x” is not a number")
    page.click("#submit")
    expect(list_error).to_contain_text("not a number")
    expect(list_input).to_have_attribute("aria-invalid", "true")
    list_input.fill("2,2")
    page.click("#submit")
    expect(list_error).to_contain_text("repeats a value")

    # Every combination invalid (segments > depth): the API's 422 names the axis.
    list_input.fill("16,32")
    expect(page.locator("#plan-notes")).to_contain_text("No valid combination")
    page.click("#submit")
    expect(list_error.first).to_contain_text("must not exceed model.depth")

    # One invalid combination of three: the count says why it is two runs, not three.
    list_input.fill("2,4,32")
    expect(page.locator("#run-count")).to_contain_text("2 runs (3 segment counts, 1 not queued: see below)")
    expect(page.locator("#plan-notes")).to_contain_text("1 combination is invalid")

    # A bad base value: ["body", "base", "model", "width"] lands on the width input.
    list_input.fill("2,4")
    expect(list_error).to_have_count(0)
    page.fill("#f-mlp-width", "0")
    page.click("#submit")
    expect(page.locator(".field:has(#f-mlp-width) .field-error")).to_contain_text("greater than or equal to 1")
    assert page.locator('[aria-invalid="true"]').count() == 1
    expect(page.locator("#form-error")).to_be_hidden()
    assert "#/sweeps/" not in page.url
    assert _count(app_url, "sweeps") == sweeps

    tab.assert_local_only(app_url)
    tab.assert_no_errors()


# ----------------------------------------------------------------------------- list


def _submit(page, app_url: str, body: dict) -> dict:
    """POST ``body`` to /api/experiments from the page (the app's origin); the created experiment."""
    page.goto(f"{app_url}/#/")
    return page.evaluate(
        "(b) => fetch('/api/experiments', {method: 'POST', headers: {'Content-Type': 'application/json'},"
        " body: JSON.stringify(b)}).then((r) => r.json())",
        body,
    )


def test_an_out_of_memory_in_setup_reads_as_such_and_never_null(app_url: str, tab: Tab) -> None:
    page = tab.page
    body = spec_dict(memory_limit_bytes=1000)  # over the limit while building the model
    created = _submit(page, app_url, body)
    page.goto(f"{app_url}/#/experiments/{created['id']}")
    box = page.locator("#exp-error")
    expect(box).to_contain_text("out of memory in setup", timeout=RUN_TIMEOUT_MS)
    expect(box).to_contain_text("checkpointing cannot help")
    assert "null" not in box.text_content()
    tab.assert_no_errors()


def test_the_spec_panel_leaves_out_fields_the_model_does_not_set(app_url: str, tab: Tab) -> None:
    page = tab.page
    body = spec_dict(model=hf_model("llama"), steps=2, timed_steps=0)
    created = _submit(page, app_url, body)
    assert None in created["spec"]["model"].values()  # e.g. image_size: a language model has none
    page.goto(f"{app_url}/#/experiments/{created['id']}")
    spec = page.locator("#exp-spec")
    expect(spec).to_contain_text("hidden_size 32")
    assert "null" not in spec.text_content()
    tab.assert_no_errors()


def test_the_spec_panel_shows_the_timed_steps_and_no_unset_field_of_the_rest(app_url: str, tab: Tab) -> None:
    """Issue 32: past the model's fields, the spec's unset ones (no memory limit, no timeout,
    no mixed precision) are left out, never "null"; both passes' steps show."""
    page = tab.page
    created = _submit(page, app_url, spec_dict(steps=3, timed_steps=4, **{"checkpoint.strategy": "sequential"}))
    assert created["spec"]["memory_limit_bytes"] is None and created["spec"]["timeout_s"] is None
    page.goto(f"{app_url}/#/experiments/{created['id']}")
    spec = page.locator("#exp-spec")
    expect(spec).to_contain_text("3 memory (1 warm-up), then 4 timed")
    assert "null" not in spec.text_content() and "?" not in spec.text_content()
    _request(f"{app_url}/api/experiments/{created['id']}/cancel", {})
    tab.assert_no_errors()


def test_the_saving_shows_from_the_reference_forward_without_a_baseline_run(app_url: str, tab: Tab) -> None:
    page = tab.page
    transformer = {"kind": "transformer", "depth": 2, "d_model": 32, "heads": 2, "seq_len": 16, "vocab_size": 100}
    body = spec_dict(model=transformer, **{"checkpoint.strategy": "per_block"})
    created = _submit(page, app_url, body)
    page.goto(f"{app_url}/#/experiments/{created['id']}")
    saving = page.locator("#m-activation-ref")
    expect(saving).to_have_text(
        re.compile(r"^−\d+(\.\d+)?% vs no checkpointing \(reference forward\)$"), timeout=RUN_TIMEOUT_MS
    )
    tab.assert_no_errors()
