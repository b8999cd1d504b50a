"""A plan for a memory budget from the form: the page draws the block list with its
checkpointed segments, the budget line beside predicted and measured peak, the front of
time against peak, and names the recommendation."""

from __future__ import annotations

from playwright.sync_api import expect

from tests.frontend.support import RUN_TIMEOUT_MS, Tab


def test_plan_a_budget_and_see_the_blocks_the_budget_line_and_the_front(app_url: str, tab: Tab) -> None:
    from ckptlab.worker.engine.run import run_experiment

    page = tab.page
    from ckptlab.spec.experiment import ExperimentSpec
    from tests.factories import spec_dict

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

    expect(page).to_have_url(__import__("re").compile(r"#/plans/\d+$"))
    expect(page.locator("#plan-status")).to_contain_text("6 of 6 points measured", timeout=RUN_TIMEOUT_MS)
    expect(page.locator("#plan-status")).not_to_contain_text("running", timeout=RUN_TIMEOUT_MS)
    assert page.locator("#plan-blocks-row .segment.checkpointed").count() >= 1
    page.wait_for_function("(document.getElementById('plan-chart-peak').layout || {}).shapes !== undefined")
    assert page.evaluate("document.getElementById('plan-chart-peak').layout.shapes[0].y0") == budget
    front = page.evaluate("document.getElementById('plan-chart-front').data[0]")
    assert front["name"] == "front" and len(front["x"]) >= 1
    expect(page.locator("#plan-recommendation")).to_contain_text("Use ")
    tab.assert_no_errors()
