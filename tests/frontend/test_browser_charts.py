"""Charts whose text does not collide (frontend/chart_fit.js, issue 23): titles, legends and
labels measured in the browser. The sweep and experiment pages' own charts are checked in
test_browser.py; here a figure those pages do not reach with a short sweep."""

from __future__ import annotations

from itertools import product

from tests.frontend.support import Tab, assert_charts_clear

#: A gradient chart as GET /api/sweeps/{id}/charts/correctness draws it, for a sweep of 16
#: runs (segments x RNG x AMP): labels that would stand on end under 16 bars.
MANY_RUNS_CORRECTNESS = {
    "data": [
        {
            "type": "bar",
            "name": "grad_max_abs_diff",
            "x": [f"segments={n} rng={r} amp={a}" for n, r, a in product((1, 2, 4, 8), ("on", "off"), ("off", "bf16"))],
            "y": [0.0, 1e-3, 0.0, 2e-3] * 4,
            "marker": {"color": ["seagreen", "crimson"] * 8},
            "text": ["match", "differs"] * 8,
        }
    ],
    "layout": {
        "title": {"text": "Gradient difference against the run without checkpointing"},
        "xaxis": {"title": {"text": "configuration"}},
        "yaxis": {"title": {"text": "max |grad - grad without checkpointing|"}},
        "legend": {"orientation": "h", "y": -0.2},
    },
}


def test_a_gradient_chart_of_many_runs_reads_across_with_no_text_overlapping(app_url: str, tab: Tab) -> None:
    page = tab.page
    page.goto(app_url + "/#/")
    page.evaluate(
        """async (fig) => {
          const util = await import('/static/util.js');
          const { sweepFigure, PLOT_CONFIG } = await import('/static/charts.js');
          const { fitText } = await import('/static/chart_fit.js');
          const Plotly = await util.loadPlotly();
          const div = document.createElement('div');
          div.id = 'probe-chart';
          div.style.cssText = 'width: 560px; height: 380px';
          document.body.prepend(div);
          const f = sweepFigure('correctness', fig);
          await fitText(await Plotly.react(div, f.data, f.layout, PLOT_CONFIG));
        }""",
        MANY_RUNS_CORRECTNESS,
    )
    assert page.evaluate("document.getElementById('probe-chart').data[0].orientation") == "h"
    assert_charts_clear(page, ["probe-chart"])
