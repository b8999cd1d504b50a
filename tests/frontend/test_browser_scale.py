"""Browser tests at scale: a list of 100 experiments (filtered, sorted), WebGL charts above
1000 points."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.frontend.support import (
    App,
    Tab,
    _count,
    _insert_finished_experiments,
)


def test_a_list_of_100_experiments_renders_filters_and_sorts(app: App, tab: Tab) -> None:
    """All 100 rows, then a filter kept in the URL and a sort by peak. How fast the 100 rows
    render (issue 6: under 1 s) is measured by bench/bench_list_page.py, cold and warm, quiet
    and under load, not here: a timed assertion beside the rest of the suite on two cores
    fails by chance (it read 1,207 ms in one CI run; the bench's quiet medians are ~0.77 s
    cold, ~0.4 s warm)."""
    page = tab.page
    _insert_finished_experiments(app.data_dir, 100)
    assert _count(app.url) >= 100
    page.goto(app.url + "/#/")
    expect(page.locator("#experiments tbody tr")).to_have_count(100)
    expect(page.locator("#experiments-count")).to_contain_text("in all")
    # Rows show figures only: the list asks for summaries without their per-step lists.
    asked = [u for u in tab.requested if "/api/experiments?" in u]
    assert asked and all("per_step=false" in u for u in asked), asked

    # Filters live in the URL, so a filtered view can be shared.
    page.select_option("#filter-strategy", "none")
    expect(page).to_have_url(re.compile(r"strategy=none"))
    page.wait_for_function(
        "[...document.querySelectorAll('#experiments tbody tr')].every((r) => r.children[2].textContent === 'none')"
    )
    shared = page.url
    page.goto(app.url + "/#/")
    page.goto(shared)
    expect(page.locator("#filter-strategy")).to_have_value("none")
    expect(page.locator("#experiments tbody tr").first).to_be_visible()
    # Rows of the unfiltered list may still be on the page until the filtered answer lands.
    page.wait_for_function(
        "[...document.querySelectorAll('#experiments tbody tr')].every((r) => r.children[2].textContent === 'none')"
    )
    assert all(t == "none" for t in page.locator("#experiments tbody tr td:nth-child(3)").all_text_contents())

    # Sorting by peak memory (within the page): smallest first.
    page.click("#experiments thead th[data-sort='peak']")
    expect(page).to_have_url(re.compile(r"sort=peak"))
    page.wait_for_function(
        """() => {
        const titles = [...document.querySelectorAll('#experiments tbody tr')]
          .map((r) => r.children[9].getAttribute('title'));
        const cut = titles.findIndex((t) => !t);
        const known = cut < 0 ? titles : titles.slice(0, cut);
        const v = known.map((t) => Number(t.replace(/[^0-9]/g, '')));
        // unknown peaks (runs without a summary) come last
        const unknownLast = titles.slice(known.length).every((t) => !t);
        return v.length > 1 && unknownLast && v.every((x, i) => i === 0 || v[i - 1] <= x);
      }"""
    )
    tab.assert_local_only(app.url)
    tab.assert_no_errors()


def test_charts_switch_to_webgl_above_1000_points(app_url: str, tab: Tab) -> None:
    page = tab.page
    page.goto(app_url + "/#/new")
    types = page.evaluate(
        """async () => {
        const charts = await import('/static/charts.js');
        const steps = (n) => Array.from({length: n}, (_, i) => ({
          step: i + 1, forward_ms: 1, backward_ms: 2, optimizer_ms: 1, step_ms: 4, allocated_bytes: 1e6,
          peak_allocated_bytes: 2e6, reserved_bytes: null,
          extra: {memory_at_peak: {parameters: 1e6, gradients: 5e5, optimizer_state: 0, activations: 4e5, other: 1e5}},
        }));
        const spec = {steps: 1500, warmup_steps: 1};
        const kinds = (fig) => [...new Set(fig.data.map((t) => t.type || 'scatter'))].sort();
        const sweep = {data: [{type: 'scatter', name: 'runs', x: [...Array(1200).keys()], y: [...Array(1200).keys()]}],
                       layout: {yaxis: {title: {text: 'peak allocated (bytes)'}}}};
        const series = {step_ms: {x: [...Array(1500).keys()], y: Array(1500).fill(3), total: 90000, downsampled: true}};
        const both = (n) => [charts.memoryFigure, charts.timeFigure].map((f) => kinds(f(spec, steps(n), true)));
        return {
          small: both(20),
          large: both(1001),
          sweepSmall: kinds(charts.sweepFigure('pareto', {data: [{type: 'scatter', x: [1], y: [2]}], layout: {}})),
          sweepLarge: kinds(charts.sweepFigure('pareto', sweep)),
          series: kinds(charts.seriesFigures(spec, series).time),
          unit: charts.sweepFigure('pareto', sweep).layout.yaxis.title.text,
        };
      }"""
    )
    assert types["small"] == [["scatter"], ["bar", "scatter"]]
    assert types["large"] == [["scattergl"], ["scattergl"]]
    assert types["sweepSmall"] == ["scatter"]
    assert types["sweepLarge"] == ["scattergl"]
    assert types["series"] == ["scattergl"]
    assert types["unit"] == "peak allocated (KiB)"
    tab.assert_no_errors()


@pytest.mark.parametrize(("path", "marker"), [("/docs", ".opblock-summary-path"), ("/redoc", "[data-section-id]")])
def test_api_docs_render_with_every_request_outside_the_server_failing(
    app_url: str, tab: Tab, path: str, marker: str
) -> None:
    # Offline: anything not served by ckptlab itself fails, as on a machine without network.
    page = tab.page
    page.route(re.compile(r"^(?!" + re.escape(app_url) + r").*"), lambda route: route.abort())
    page.goto(app_url + path)
    expect(page.locator(marker).first).to_be_visible(timeout=20_000)
    assert page.get_by_text("/api/experiments").first.is_visible() or path == "/redoc"
    if path == "/redoc":
        expect(page.get_by_text("Create a sweep").first).to_be_attached()
    local = [u for u in tab.requested if u.startswith(app_url)]
    assert any("static-offline-docs" in u for u in local), local
