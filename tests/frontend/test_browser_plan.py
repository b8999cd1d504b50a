"""A plan for a memory budget from the form: the page draws the block list with its
checkpointed segments, the budget line beside predicted and measured peak, the front of
time against peak, and names the recommendation. On a finished plan written into the
database (issue 32, item 4): memory in binary units in text, axes and bar labels, every
point in a table with its overhead as measured, labels inside the chart; and a plan whose
runs wait says where in the queue."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.factories import spec_dict
from tests.frontend.seed import MIB, insert_plan
from tests.frontend.support import RUN_TIMEOUT_MS, Tab, _free_port, _request, _stop, start_ckptlab, wait_healthy


def test_plan_a_budget_and_see_the_blocks_the_budget_line_and_the_front(app_url: str, tab: Tab) -> None:
    from ckptlab.worker.engine.run import run_experiment

    page = tab.page
    from ckptlab.spec.experiment import ExperimentSpec

    shape = {"model.depth": 8, "model.width": 128, "batch_size": 256, "steps": 3, "timed_steps": 3}
    budget = (
        run_experiment(ExperimentSpec.model_validate(spec_dict(**shape))).dump()["peak_allocated_bytes"] * 95 // 100
    )

    page.goto(app_url + "/#/new?mode=plan")
    expect(page.locator("#mode-plan")).to_be_checked()
    expect(page.locator("#checkpoint\\.strategy")).to_be_hidden()  # the plan chooses it
    page.select_option("#model\\.kind", "mlp")
    page.fill("#f-mlp-depth", "8")
    page.fill("#f-mlp-width", "128")
    page.fill("#batch_size", "256")
    page.fill("#steps", "3")
    page.fill("#timed_steps", "3")
    page.select_option("#device", "cpu")
    page.fill("#plan-budget", "lots")
    page.click("#submit")
    expect(page.locator("#plan-budget")).to_have_attribute("aria-invalid", "true")  # the server's 422, at the field
    page.fill("#plan-budget", str(budget))
    expect(page.locator("#run-count")).to_contain_text("1 plan")
    page.click("#submit")

    expect(page).to_have_url(re.compile(r"#/plans/\d+$"))
    expect(page.locator("#plan-status")).to_contain_text("6 of 6 points measured", timeout=RUN_TIMEOUT_MS)
    expect(page.locator("#plan-status")).not_to_contain_text("running", timeout=RUN_TIMEOUT_MS)
    assert page.locator("#plan-blocks-row .segment.checkpointed").count() >= 1
    page.wait_for_function("(document.getElementById('plan-chart-peak').layout || {}).shapes !== undefined")
    peak_layout = page.evaluate("document.getElementById('plan-chart-peak').layout")
    assert peak_layout["yaxis"]["title"]["text"] == "peak (MiB)"  # a budget of a few MiB
    assert peak_layout["shapes"][0]["y0"] == pytest.approx(budget / MIB)
    front = page.evaluate("document.getElementById('plan-chart-front').data[0]")
    assert front["name"] == "front" and len(front["x"]) >= 1
    expect(page.locator("#plan-recommendation")).to_contain_text("Use ")
    tab.assert_no_errors()


#: A number as an axis tick should read: digits with an optional fraction, no SI letter
#: ("115M") and no bare leading point (".343361M").
TICK = re.compile(r"^−?\d{1,3}(,\d{3})*(\.\d+)?$")


def test_the_plan_page_speaks_mib_prints_both_peaks_and_tables_every_point(app, tab: Tab) -> None:
    page = tab.page
    plan_id, ids = insert_plan(app.data_dir, budget=110 * MIB)
    page.goto(f"{app.url}/#/plans/{plan_id}")
    expect(page.locator("#plan-status")).to_contain_text("budget 110 MiB · 6 of 6 points measured")

    # Predicted and measured peak of the auto run: MiB, their numbers on the bars, the budget
    # line at 110 on a MiB axis, named.
    page.wait_for_function("(document.getElementById('plan-chart-peak').data || []).length > 0")
    bars = page.evaluate("document.getElementById('plan-chart-peak').data[0]")
    assert bars["text"] == ["103 MiB", "106 MiB"], bars
    assert bars["y"] == [103, 106]
    layout = page.evaluate("document.getElementById('plan-chart-peak').layout")
    assert layout["yaxis"]["title"]["text"].endswith("(MiB)")
    assert layout["shapes"][0]["y0"] == 110
    assert "budget 110 MiB" in [a["text"] for a in layout["annotations"]]
    expect(page.locator("#plan-chart-peak .bartext").first).to_have_text("103 MiB")
    front = page.evaluate("document.getElementById('plan-chart-front').layout")
    assert front["yaxis"]["title"]["text"].endswith("(MiB)") and front["shapes"][0]["y0"] == 110
    assert "separate runs, not comparable on a busy host" in front["xaxis"]["title"]["text"]
    for axes in ("#plan-chart-peak .ytick text", "#plan-chart-front .ytick text", "#plan-chart-front .xtick text"):
        ticks = page.locator(axes).all_text_contents()
        assert ticks and all(TICK.match(t) for t in ticks), (axes, ticks)

    # Every point in a table: its setting, peak, fit, overhead as measured, step time
    # labelled as separate runs, gradients.
    head = page.locator("#plan-points thead").inner_text()
    for words in ("setting", "peak", "overhead", "separate runs, not comparable on a busy host", "gradient check"):
        assert words in head.lower(), head
    rows = page.locator("#plan-points tbody tr")
    expect(rows).to_have_count(6)
    auto = page.locator(f"#plan-points tbody tr[data-id='{ids['strategy=auto segments=2']}']")
    expect(auto).to_contain_text("106 MiB")
    expect(auto).to_contain_text("fits")
    expect(auto).to_contain_text("match")
    expect(auto).to_contain_text("95% CI")
    over = page.locator(f"#plan-points tbody tr[data-id='{ids['base strategy=none']}']")
    expect(over).to_contain_text("over")

    # Labels inside the chart: every point's text within the plot's drawing.
    inside = page.evaluate(
        """() => {
          const gd = document.getElementById('plan-chart-front');
          const svg = gd.querySelector('.main-svg').getBoundingClientRect();
          return [...gd.querySelectorAll('.textpoint text')].map((t) => {
            const r = t.getBoundingClientRect();
            return [t.textContent, r.left >= svg.left && r.right <= svg.right && r.top >= svg.top];
          });
        }"""
    )
    assert inside and all(ok for _, ok in inside), inside
    tab.assert_no_errors()


def test_a_queued_plan_says_its_place_in_the_queue(tmp_path: Path, tab: Tab) -> None:
    """No worker: a run submitted first waits at position 1, the plan's first run at 2."""
    page = tab.page
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    backend = start_ckptlab(["serve", "--port", str(port)], tmp_path, "serve.log")
    try:
        wait_healthy(url, backend, tmp_path / "serve.log")
        assert _request(f"{url}/api/experiments", spec_dict())[0] == 201
        code, plan = _request(f"{url}/api/plans", {"base": spec_dict(), "budget": "1 MiB", "compile_budgets": []})
        assert code == 201, plan
        page.goto(f"{url}/#/plans/{plan['sweep_id']}")
        expect(page.locator("#plan-status")).to_contain_text("queued (position 2)")
        expect(page.locator("#plan-status")).not_to_contain_text("running")
        expect(page.locator("#plan-points tbody tr").first).to_contain_text("queued")
        tab.assert_no_errors()
    finally:
        _stop(backend)
