"""A plan for a memory budget from the form: the page draws the block list with its
checkpointed segments, the budget line beside predicted and measured peak, the front of
time against peak, and names the recommendation. On a finished plan written into the
database (issue 32, item 4): memory in binary units in text, axes and bar labels, every
point in a table with its overhead as measured, labels inside the chart; and a plan whose
runs wait says where in the queue. The front (issue 31, item 5): paired overhead (%) with
its CI against peak, the budget line at the budget, the model in the titles, labels inside
the plot at 1280 and 1920 px; and the plan form's hint of the un-checkpointed peak."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.factories import spec_dict
from tests.frontend.seed import MIB, insert_plan
from tests.frontend.support import (
    CHECKED_WIDTHS,
    RUN_TIMEOUT_MS,
    VIEWPORT,
    Tab,
    _free_port,
    _request,
    _screenshot,
    _stop,
    assert_charts_clear,
    start_ckptlab,
    wait_healthy,
)


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
    assert front["name"] == "measured front" and len(front["x"]) >= 1
    expect(page.locator("#plan-recommendation")).to_contain_text("Use ")
    _screenshot(page, "plan.png")  # the README's "Plan for a budget"
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
    assert "ms" not in front["xaxis"]["title"]["text"].split()  # no raw step times of separate runs
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


#: The front chart's point labels as drawn: their texts, those not inside the plot area
#: (1 px of rounding), the pairs that overlap; and any text of the chart (a title, a tick)
#: that runs past the chart's own box (cut at its edge).
LABELS_JS = """() => {
  const gd = document.getElementById('plan-chart-front');
  const plot = gd.querySelector('.nsewdrag').getBoundingClientRect();
  const whole = gd.getBoundingClientRect();
  const cut = [...gd.querySelectorAll('.main-svg text')].filter((t) => t.textContent.trim()).filter((t) => {
    const r = t.getBoundingClientRect();
    return r.width > 0 && (r.left < whole.left - 1 || r.right > whole.right + 1 || r.bottom > whole.bottom + 1);
  }).map((t) => t.textContent);
  const labels = [...gd.querySelectorAll('.scatterlayer .textpoint text')]
    .filter((t) => t.textContent.trim()).map((t) => [t.textContent, t.getBoundingClientRect()]);
  const out = labels.filter(([, r]) => r.left < plot.left - 1 || r.right > plot.right + 1
    || r.top < plot.top - 1 || r.bottom > plot.bottom + 1).map(([t]) => t);
  const overlaps = [];
  labels.forEach(([a, r], i) => labels.slice(i + 1).forEach(([b, q]) => {
    const w = Math.min(r.right, q.right) - Math.max(r.left, q.left);
    const h = Math.min(r.bottom, q.bottom) - Math.max(r.top, q.top);
    if (w > 1 && h > 1) overlaps.push(a + ' / ' + b);
  }));
  return {names: labels.map(([t]) => t), out, overlaps, cut};
}"""


def test_the_plan_front_is_paired_overhead_against_peak_with_the_budget_line_and_the_model_named(app, tab: Tab) -> None:
    """Issue 31 item 5 and 32 item 4: x is each point's paired overhead (%) with its CI as
    error bars, never the raw step times of separate runs (here sequential 2 ran faster
    than none by the clock); y is the peak in MiB with the budget line at exactly the
    budget; the model is named in the page's and the chart's titles; predictions are drawn
    hollow and dashed; every label inside the plot and none overlapping at 1280 and 1920 px
    (and the charts' texts clear, the existing check); the table says what the chart draws."""
    from tests.frontend.seed import PLAN_OVERHEADS

    page = tab.page
    plan_id, ids = insert_plan(app.data_dir, budget=110 * MIB)
    page.goto(f"{app.url}/#/plans/{plan_id}")
    expect(page.locator("#plan-title")).to_contain_text("mlp 8×64")
    expect(page.locator("#plan-chart-front-title")).to_contain_text("mlp 8×64")
    page.wait_for_function("(document.getElementById('plan-chart-front').data || []).length > 1")
    layout = page.evaluate("document.getElementById('plan-chart-front').layout")
    x_title = layout["xaxis"]["title"]["text"]
    assert "overhead" in x_title and "%" in x_title and "paired" in x_title, x_title
    assert layout["yaxis"]["title"]["text"] == "peak allocated (MiB)"
    assert layout["shapes"][0]["y0"] == layout["shapes"][0]["y1"] == 110  # the budget, 110 MiB

    measured = page.evaluate("document.getElementById('plan-chart-front').data[1]")
    at = {
        c[0].replace(" segments=", " "): (x, y)
        for c, x, y in zip(measured["customdata"], measured["x"], measured["y"], strict=True)
    }
    assert at["none"] == (0, 136)  # the reference
    for name, (estimate, low, high) in PLAN_OVERHEADS.items():
        assert at[name][0] == estimate, (name, at[name])  # the paired estimate, not 283.9 ms
        i = [c[0].replace(" segments=", " ") for c in measured["customdata"]].index(name)
        assert measured["error_x"]["array"][i] == pytest.approx(high - estimate)
        assert measured["error_x"]["arrayminus"][i] == pytest.approx(estimate - low)
    front = page.evaluate("document.getElementById('plan-chart-front').data[0]")
    assert front["x"] == [0, 9, 12, 22, 31]  # sequential 8 (+38%, 61 MiB) is beaten by per_block
    assert "symbol" not in measured["marker"] and "line" not in measured  # measured: solid markers
    predicted = page.evaluate("document.getElementById('plan-chart-front').data[2]")  # plan.front
    assert "predicted front" in predicted["name"] and predicted["marker"]["symbol"].endswith("-open")
    assert predicted["line"]["dash"] == "dash"
    assert predicted["y"] == [60, 78, 103, 136]  # lowest peak first, in MiB
    assert predicted["x"] == pytest.approx([28, 19, 10.5, 0])  # the fractions as %
    assert predicted["error_x"]["array"][0] == pytest.approx(3) and predicted["error_x"]["arrayminus"][
        0
    ] == pytest.approx(3)
    own = page.evaluate("document.getElementById('plan-chart-front').data[3]")  # auto's plan: predicted -> measured
    assert own["marker"]["symbol"] == "diamond-open" and own["line"]["dash"] == "dot"
    assert own["x"] == pytest.approx([10.5, 9]) and own["y"] == [103, 106]

    assert_charts_clear(page, ["plan-chart-peak", "plan-chart-front"], screenshot="plan")
    before = page.viewport_size
    try:
        for width in CHECKED_WIDTHS:
            page.set_viewport_size({"width": width, "height": VIEWPORT["height"]})
            deadline = time.monotonic() + 8
            while True:
                got = page.evaluate(LABELS_JS)
                if len(got["names"]) >= 5 and not got["out"] and not got["overlaps"] and not got["cut"]:
                    break
                assert time.monotonic() < deadline, f"at {width} px: {got}"
                page.wait_for_timeout(250)
            assert "auto" in got["names"] and "none" in got["names"], got
    finally:
        page.set_viewport_size(before)

    # The table: the same paired figures, the raw step time only under its label.
    seq2 = page.locator(f"#plan-points tbody tr[data-id='{ids['strategy=sequential segments=2']}']")
    expect(seq2).to_contain_text("+12% (95% CI +8.0% to +16%)")
    expect(seq2).to_contain_text("283.9 ms")
    auto = page.locator(f"#plan-points tbody tr[data-id='{ids['strategy=auto segments=2']}']")
    expect(auto).to_contain_text("+9.0% (95% CI +5.0% to +13%)")
    expect(auto).to_contain_text("predicted 103 MiB")
    expect(auto).to_contain_text("predicted +11% (95% CI +8.5% to +13%)")
    expect(auto).to_contain_text("match")
    expect(page.locator("#plan-points thead")).to_contain_text("paired")
    tab.assert_no_errors()


def test_the_plan_and_its_run_show_predicted_against_paired_measured_overhead(app, tab: Tab) -> None:
    """Issue 31 item 1: the plan page and the auto run's experiment page state the overhead
    the plan predicted (with its interval) beside the run's paired measured one, and no
    longer the plan's recomputation in ms."""
    page = tab.page
    plan_id, ids = insert_plan(app.data_dir, budget=110 * MIB)
    both = "predicted +11% (95% CI +8.5% to +13%) · measured paired +9.0% (95% CI +5.0% to +13%)"
    page.goto(f"{app.url}/#/plans/{plan_id}")
    expect(page.locator("#plan-overhead")).to_contain_text(both)
    expect(page.locator("#plan-blocks")).not_to_contain_text("recomputing")
    page.goto(f"{app.url}/#/experiments/{ids['strategy=auto segments=2']}")
    expect(page.locator("#exp-plan-overhead")).to_have_text(both)  # the stored overhead: no noise words
    expect(page.locator("#exp-spec")).to_contain_text("blocks 0–3 checkpointed of 8")
    expect(page.locator("#exp-spec")).not_to_contain_text("recomputing")
    # a run of the plan that is not auto has no plan row
    page.goto(f"{app.url}/#/experiments/{next(i for label, i in ids.items() if 'per_block' in label)}")
    expect(page.locator("#exp-summary")).to_contain_text("Overhead vs baseline")
    expect(page.locator("#exp-plan-overhead")).to_have_count(0)
    tab.assert_no_errors()


def test_a_plan_that_chose_torch_compile_says_so_on_both_pages(app, tab: Tab) -> None:
    """Issue 31 Done-when #2: ``auto`` with ``search_compile`` may run the compiler's own
    budget; the plan page and the run's page name it, with the eager plan it beat."""
    page = tab.page
    probes = [
        {"activation_memory_budget": f, "peak_bytes": p * MIB, "compile_ms": 900.0} for f, p in [(1.0, 140), (0.5, 98)]
    ]
    compiled = {
        "activation_memory_budget": 0.5,
        "compile_scope": "step",
        "peak_bytes": 98 * MIB,
        "chosen": True,
        "probes": probes,
    }
    plan_id, ids = insert_plan(app.data_dir, budget=110 * MIB, compiled=compiled)
    page.goto(f"{app.url}/#/plans/{plan_id}")
    words = "torch.compile on the whole step (forward and loss) at activation memory budget 0.5"
    expect(page.locator("#plan-compiled")).to_contain_text(words)
    expect(page.locator("#plan-compiled")).to_contain_text("2 compiled builds tried")
    page.goto(f"{app.url}/#/experiments/{ids['strategy=auto segments=2']}")
    expect(page.locator("#exp-spec")).to_contain_text(f"{words}, measured at 98")
    expect(page.locator("#exp-spec")).to_contain_text("eager plan (blocks 0–3 checkpointed of 8)")
    # a plan stored before the scope existed compiled the blocks, and says so
    plan_id, ids = insert_plan(app.data_dir, budget=110 * MIB, compiled={**compiled, "compile_scope": None})
    page.goto(f"{app.url}/#/plans/{plan_id}")
    expect(page.locator("#plan-compiled")).to_contain_text(
        "torch.compile on the blocks at activation memory budget 0.5"
    )
    # a candidate that fitted but was not run says why, and the eager plan is the plan
    why = "its gradients differ from the un-checkpointed model's (torch.compile draws other dropout masks)"
    plan_id, ids = insert_plan(app.data_dir, budget=110 * MIB, compiled={**compiled, "chosen": False, "why_not": why})
    page.goto(f"{app.url}/#/plans/{plan_id}")
    expect(page.locator("#plan-compiled")).to_have_text(f"torch.compile tried (2 compiled builds): {why}.")
    expect(page.locator("#plan-blocks-row .segment.checkpointed")).to_have_count(1)  # the eager plan, drawn
    page.goto(f"{app.url}/#/experiments/{ids['strategy=auto segments=2']}")
    expect(page.locator("#exp-spec")).to_contain_text(
        f"blocks 0–3 checkpointed of 8; torch.compile tried (2 compiled builds): {why}"
    )
    tab.assert_no_errors()


def test_the_plan_form_hints_at_the_un_checkpointed_peak(app_url: str, tab: Tab) -> None:
    """Issue 32 item 7: the plan form says what the model peaks at without checkpointing (a
    prediction, on request) and where the typed budget stands against it."""
    page = tab.page
    page.goto(app_url + "/#/new?mode=plan")
    expect(page.locator("#mode-plan")).to_be_checked()
    page.select_option("#model\\.kind", "mlp")
    page.fill("#f-mlp-depth", "4")
    page.fill("#f-mlp-width", "64")
    page.fill("#batch_size", "32")
    page.select_option("#device", "cpu")
    expect(page.locator("#run-count")).to_contain_text("mlp 4×64 · batch 32")  # the form has read them
    page.click("#plan-predict-peak")
    hint = page.locator("#plan-peak-hint")
    expect(hint).to_contain_text("Un-checkpointed, a step peaks at about", timeout=RUN_TIMEOUT_MS)
    expect(hint).to_contain_text("activations")
    expect(hint.locator("a")).to_have_attribute("href", re.compile(r"#/predictions/\d+$"))
    page.fill("#plan-budget", "1 GiB")
    expect(hint).to_contain_text("1.00 GiB is above it: nothing needs checkpointing")
    page.fill("#plan-budget", "1 KiB")
    expect(hint).to_contain_text("no plan fits")
    _screenshot(page, "plan-form-hint.png", full_page=False)
    page.fill("#f-mlp-depth", "5")  # another model: asked for again
    expect(page.locator("#plan-predict-peak")).to_be_visible()
    tab.assert_no_errors()
