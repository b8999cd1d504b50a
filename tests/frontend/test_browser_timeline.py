"""The memory timeline in the browser (issue 34, item 4): a sweep of three real CPU runs of a
tiny MLP (none, per_block, selective) overlaid on one phase-aligned axis from the sweep page's
link, at 1280 and 1920 px with no overlapping text and nothing out of its card; each run's peak
marker at its summary's peak; the experiment page's stacked timeline and "who holds the peak"
table summing to the peak; and the one line a run without a timeline shows instead."""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import expect

from tests.frontend.support import (
    RUN_TIMEOUT_MS,
    App,
    Tab,
    _get_json,
    _insert_finished_experiments,
    _request,
    assert_charts_clear,
)
from tests.frontend.test_browser_overflow import _overflows

MIB = 2**20
#: Big enough for a peak in MiB (Adam's state of 1.5 MiB of weights), small enough to run in
#: a second or two per run.
TINY = {
    "model": {"kind": "mlp", "depth": 4, "width": 256},
    "batch_size": 256,
    "steps": 3,
    "timed_steps": 2,
    "verify_gradients": False,
    "device": "cpu",
}
STRATEGIES = ("none", "per_block", "selective")

#: The overlay's runs as drawn: per run its line's name and its peak marker's y.
DRAWN_JS = """() => {
  const gd = document.getElementById('overlay-chart');
  const data = gd.data || [];
  const lines = data.filter((t) => t.meta && !t.meta.peak);
  const peaks = data.filter((t) => t.meta && t.meta.peak);
  return {lines: lines.map((t) => [t.meta.run, t.name, t.x.length]), peaks: peaks.map((t) => [t.meta.run, t.y[0]]),
          unit: gd.layout.yaxis.title.text, ticks: gd.layout.xaxis.ticktext};
}"""


@pytest.fixture(scope="module")
def sweep(app: App) -> tuple[int, dict[str, dict]]:
    """A sweep of TINY under each of STRATEGIES, run by the app's worker: its id and each
    strategy's experiment (a baseline's repeat left out)."""
    code, body = _request(
        f"{app.url}/api/sweeps",
        {"name": "timelines", "base": TINY, "axes": {"checkpoint.strategy": list(STRATEGIES)}},
    )
    assert code == 201, body
    deadline = time.monotonic() + RUN_TIMEOUT_MS / 1000
    while (p := _get_json(f"{app.url}/api/sweeps/{body['id']}")[1]["progress"])["finished"] < p["total"]:
        assert time.monotonic() < deadline, p
        time.sleep(0.25)
    assert p["counts"]["succeeded"] == p["total"], p
    rows = _get_json(f"{app.url}/api/sweeps/{body['id']}/results")[1]["data"]
    runs = {}
    for row in rows:
        if row["repeat_of"] is None:
            exp = _get_json(f"{app.url}/api/experiments/{row['experiment_id']}")[1]
            runs[exp["spec"]["checkpoint"]["strategy"]] = exp
    assert set(runs) == set(STRATEGIES)
    return body["id"], runs


def test_three_runs_of_a_sweep_overlaid_phases_aligned_with_their_peaks(app: App, sweep, tab: Tab) -> None:
    sweep_id, runs = sweep
    page = tab.page
    page.goto(f"{app.url}/#/sweeps/{sweep_id}")
    page.click("#sweep-overlay")
    page.wait_for_url(re.compile(rf"#/timeline\?sweep={sweep_id}$"))
    page.wait_for_function("(document.getElementById('overlay-chart').data || []).length === 6", timeout=RUN_TIMEOUT_MS)
    drawn = page.evaluate(DRAWN_JS)
    by_id = {exp["id"]: name for name, exp in runs.items()}
    assert sorted(r for r, _, _ in drawn["lines"]) == sorted(by_id), drawn
    for run, name, n in drawn["lines"]:
        assert name.startswith(f"#{run} {by_id[run]}") and n > 10, drawn  # the legend names each run's strategy
    assert drawn["unit"] == "live memory (MiB)" and drawn["ticks"] == ["forward", "backward", "optimizer"]
    peaks = dict(drawn["peaks"])
    for exp in runs.values():
        assert peaks[exp["id"]] * MIB == pytest.approx(exp["summary"]["peak_allocated_bytes"], rel=1e-12, abs=0)
    # The table: one row per run, its timeline's peak the summary's to the byte.
    for exp in runs.values():
        cell = page.locator(f"#overlay-runs-table tr[data-id='{exp['id']}'] td[data-bytes]")
        assert int(cell.get_attribute("data-bytes")) == exp["summary"]["peak_allocated_bytes"]
    assert_charts_clear(page, ["overlay-chart"], screenshot="timeline-overlay")
    found = _overflows(page, "timeline overlay")
    assert not found, found

    # The same runs named by id (the list's "compare" form), in the order given.
    ids = ",".join(str(runs[s]["id"]) for s in reversed(STRATEGIES))
    page.fill("#overlay-ids", ids)
    page.click("#overlay-form button[type=submit]")
    page.wait_for_url(re.compile(rf"#/timeline\?ids={ids}$"))
    page.wait_for_function(
        f"(document.getElementById('overlay-chart').data || []).filter((t) => t.meta && !t.meta.peak)"
        f".map((t) => t.meta.run).join(',') === '{ids}'"
    )
    tab.assert_local_only(app.url)
    tab.assert_no_errors()


def test_the_experiment_page_shows_its_timeline_and_who_holds_the_peak(app: App, sweep, tab: Tab) -> None:
    _, runs = sweep
    exp = runs["per_block"]
    peak = exp["summary"]["peak_allocated_bytes"]
    page = tab.page
    page.goto(f"{app.url}/#/experiments/{exp['id']}")
    page.wait_for_function("(document.getElementById('chart-timeline').data || []).length > 3", timeout=RUN_TIMEOUT_MS)
    fig = page.evaluate(
        """() => { const gd = document.getElementById('chart-timeline');
          return {names: gd.data.map((t) => t.name), fills: gd.data.filter((t) => t.fill).length,
                  peak: gd.data.filter((t) => t.meta && t.meta.peak).map((t) => t.y[0]),
                  bands: gd.layout.shapes.map((s) => s.name), unit: gd.layout.yaxis.title.text}; }"""
    )
    assert fig["fills"] >= 3 and "live, all categories" in fig["names"], fig  # stacked by category
    assert fig["peak"][0] * MIB == pytest.approx(peak, rel=1e-12, abs=0) and fig["unit"] == "live memory (MiB)"
    assert {"forward", "backward", "optimizer", "recomputation"} <= set(fig["bands"]), fig
    # Hovering the peak's event names its module and op.
    hover = page.evaluate(
        """() => { const gd = document.getElementById('chart-timeline');
          const i = gd.data.findIndex((t) => t.name === 'live, all categories');
          const k = gd.data[i].x.indexOf(gd.data.find((t) => t.meta && t.meta.peak).x[0]);
          window.Plotly.Fx.hover(gd, [{curveNumber: i, pointNumber: k}]);
          return gd.querySelector('.hoverlayer').textContent; }"""
    )
    assert re.search(r"blocks\.\d.* · aten\.\w+", hover) and "backward" in hover, hover
    # Who holds the peak: the rows sum to it, to the byte.
    rows = page.locator("#timeline-holders-table tbody tr")
    held = sum(int(b) for b in rows.evaluate_all("(rs) => rs.map((r) => r.dataset.bytes)"))
    total = int(page.locator("#timeline-holders-table tfoot tr").get_attribute("data-total"))
    assert held == total == peak
    expect(page.locator("#timeline-note")).to_contain_text("held by a named module")
    code, body = _request(app.url + page.locator("#timeline-json").get_attribute("href"))
    assert code == 200 and body["t_index"] == list(range(body["n_events"])) and body["peak_bytes"] == peak
    assert_charts_clear(page, ["chart-timeline"], screenshot="timeline")
    # The first step, one click away.
    page.click("#timeline-steps button:not([aria-pressed='true'])")
    expect(page.locator("#timeline-title")).to_contain_text("step 1")

    # A run stored without a timeline says why in one line, and nothing else fails.
    (old,) = _insert_finished_experiments(app.data_dir, 1)
    page.goto(f"{app.url}/#/experiments/{old}")
    expect(page.locator("#timeline-none")).to_contain_text(
        f"Experiment {old} has no memory timeline: runs the live-tensor tracker can follow"
    )
    expect(page.locator("#timeline-body")).to_be_hidden()
    # Overlaid with a run that has one, it is named under the chart with the same reason.
    page.goto(f"{app.url}/#/timeline?ids={exp['id']},{old}")
    expect(page.locator("#overlay-missing")).to_contain_text(f"#{old}: Experiment {old} has no memory timeline")
    page.wait_for_function("(document.getElementById('overlay-chart').data || []).length === 2")
    tab.assert_no_errors()


#: The overlay's lines as drawn: per line its meta, name and dash, and per peak marker its meta and y.
LINES_JS = """() => {
  const data = document.getElementById('overlay-chart').data || [];
  return {lines: data.filter((t) => t.meta && !t.meta.peak).map((t) => [t.meta, t.name, t.line.dash]),
          peaks: data.filter((t) => t.meta && t.meta.peak).map((t) => [t.meta, t.y[0]])};
}"""


def test_a_run_and_its_prediction_overlaid_from_the_experiment_page(app: App, sweep, tab: Tab) -> None:
    _, runs = sweep
    exp = runs["per_block"]
    code, pred = _request(f"{app.url}/api/predictions", {"spec": exp["spec"], "target": "cpu"})
    assert code == 201 and pred["status"] == "succeeded", pred
    page = tab.page
    page.goto(f"{app.url}/#/experiments/{exp['id']}")
    link = page.locator("#timeline-compare")
    expect(link).to_have_text("compare with prediction (cpu)", timeout=RUN_TIMEOUT_MS)
    link.click()
    page.wait_for_url(re.compile(rf"#/timeline\?ids={exp['id']}&predictions={pred['id']}$"))
    page.wait_for_function("(document.getElementById('overlay-chart').data || []).length === 4", timeout=RUN_TIMEOUT_MS)
    drawn = page.evaluate(LINES_JS)
    assert [(m, d) for m, _, d in drawn["lines"]] == [
        ({"run": exp["id"]}, "solid"),
        ({"prediction": pred["id"]}, "dash"),
    ]
    assert drawn["lines"][1][1] == "predicted (fake tensors, cpu)", drawn
    peaks = {(m.get("run"), m.get("prediction")): y for m, y in drawn["peaks"]}
    # on cpu the prediction's timeline reaches its predicted peak, which is the run's, to the byte
    predicted = pred["summary"]["peak_allocated_bytes"]
    assert predicted == exp["summary"]["peak_allocated_bytes"]
    assert peaks[(None, pred["id"])] * MIB == pytest.approx(predicted, rel=1e-12, abs=0)
    assert peaks[(exp["id"], None)] * MIB == pytest.approx(predicted, rel=1e-12, abs=0)
    cell = page.locator(f"#overlay-runs-table tr[data-prediction='{pred['id']}'] td[data-bytes]")
    assert int(cell.get_attribute("data-bytes")) == predicted
    expect(page.locator("#overlay-title")).to_have_text("Memory timelines, predicted and measured")
    expect(page.locator("#overlay-note")).to_contain_text("fake tensor count")
    expect(page.locator("#overlay-predictions")).to_have_value(str(pred["id"]))
    assert_charts_clear(page, ["overlay-chart"], screenshot="timeline-prediction")
    found = _overflows(page, "timeline prediction")
    assert not found, found

    # The prediction's page links to the same overlay beside its run.
    page.goto(f"{app.url}/#/predictions/{pred['id']}?run={exp['id']}")
    expect(page.locator("#pred-timelines")).to_have_attribute(
        "href", f"#/timeline?ids={exp['id']}&predictions={pred['id']}"
    )
    tab.assert_local_only(app.url)
    tab.assert_no_errors()
