"""Nothing sticks out of its card (issue 32, item 5): on every page (the list, an experiment,
a sweep, a plan, a prediction and the form in each mode, an hf Llama's fields shown) at 1280
and 1920 px, every element and every run of text inside a card ends within it, and inside a
form field within the field (its label does not run into the next one).

What counts as inside: each visible descendant's box (text measured as laid out, so a long
word that does not wrap counts at its full length; SVG text as drawn, before any clipping)
lies within the card's box, 1 px of rounding allowed, at its left, right and bottom edges.

Scrolling wrappers: a table inside a wrapper with ``overflow-x: auto`` keeps the card from
growing, but at the widths checked here its columns past the wrapper's edge are still cut at
first sight (the issue's "Budget column cut"): so content inside such a wrapper is measured
against the card like any other. The wrappers stay for narrower windows, not checked here.
The cards themselves are measured against the page's column (the view), so a card that grows
past the page fails too. The data: a ``ckptlab.profile``-like run whose model is named by a
very long import path, a sweep of sixteen runs with long labels, a finished plan."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from tests.frontend.seed import insert_plan, insert_profile_run, insert_wide_sweep
from tests.frontend.support import CHECKED_WIDTHS, RUN_TIMEOUT_MS, VIEWPORT, App, Tab, _request, _screenshot

if TYPE_CHECKING:
    from playwright.sync_api import Page

#: Per box (the visible view, its cards and form fields, the header), every visible
#: descendant element and text run that ends outside it, named.
OVERFLOWS_JS = """() => {
  const view = [...document.querySelectorAll('.view')].find((v) => !v.hidden);
  const shown = (e) => {
    if (!e.checkVisibility({ visibilityProperty: true, contentVisibilityAuto: true })) return null;
    const r = e.getBoundingClientRect();
    return r.width > 0 && r.height > 0 ? r : null;
  };
  const name = (e) => {
    const id = e.id ? '#' + e.id : '';
    const cls = typeof e.className === 'string' && e.className ? '.' + e.className.trim().split(/\\s+/).join('.') : '';
    const near = e.parentElement && e.parentElement.closest('[id]');
    return `${e.tagName.toLowerCase()}${id}${cls}${near ? ' in #' + near.id : ''}`;
  };
  const quote = (text) => `"${text.trim().replace(/\\s+/g, ' ').slice(0, 50)}"`;
  // Below a box that scrolls or clips vertically (a code block's max-height), content may
  // run past its bottom; a code block (pre) also scrolls sideways by design.
  const scrollsY = (e, box) => {
    for (let p = e.parentElement; p && p !== box; p = p.parentElement) {
      if (getComputedStyle(p).overflowY !== 'visible') return true;
    }
    return false;
  };
  const boxes = [document.querySelector('.site-header .wrap'), view,
    ...view.querySelectorAll('.card, .field')].filter((b) => b && shown(b));
  const out = [];
  for (const box of boxes) {
    const b = box.getBoundingClientRect();
    const reported = new Set();
    const check = (r, e, what) => {
      const edges = [];
      if (r.right > b.right + 1) edges.push(`right ${Math.round(r.right)} > ${Math.round(b.right)}`);
      if (r.left < b.left - 1) edges.push(`left ${Math.round(r.left)} < ${Math.round(b.left)}`);
      const low = r.bottom > b.bottom + 1 && !scrollsY(e, box);
      if (low) edges.push(`bottom ${Math.round(r.bottom)} > ${Math.round(b.bottom)}`);
      if (!edges.length) return;
      reported.add(e);
      for (let p = e.parentElement; p && p !== box; p = p.parentElement) if (reported.has(p)) return;
      out.push(`${what} sticks out of ${name(box)}: ${edges.join(', ')}`);
    };
    for (const e of box.querySelectorAll('*')) {
      const r = shown(e);
      if (r && !e.closest('defs, clipPath, pre')) check(r, e, name(e));
    }
    const walk = document.createTreeWalker(box, NodeFilter.SHOW_TEXT);
    const range = document.createRange();
    for (let t = walk.nextNode(); t; t = walk.nextNode()) {
      const parent = t.parentElement;
      if (!t.textContent.trim() || !parent || !shown(parent) || reported.has(parent)) continue;
      if (parent.closest('svg, select, option, script, style, pre')) continue;
      range.selectNodeContents(t);
      const r = range.getBoundingClientRect();
      if (r.width > 0) check(r, parent, `text ${quote(t.textContent)} of ${name(parent)}`);
    }
  }
  return out;
}"""

#: True once every visible chart on the page is drawn at its box's width (after a resize,
#: Plotly's responsive redraw).
CHARTS_DRAWN_JS = """() => [...document.querySelectorAll('.view:not([hidden]) .chart')]
  .filter((c) => c.offsetParent !== null).every((c) => {
    const svg = c.querySelector('.main-svg');
    return svg && Math.abs(svg.getBoundingClientRect().width - c.getBoundingClientRect().width) < 1;
  })"""

#: How long a page may take to settle after a resize (charts redrawn, their text fitted:
#: frontend/chart_fit.js relayouts 250 ms after the last resize), s.
SETTLE_S = 8.0


def _overflows(page: Page, name: str) -> dict[int, list[str]]:
    """:data:`OVERFLOWS_JS` at each of :data:`CHECKED_WIDTHS`, the viewport put back; only
    widths with a finding that lasts :data:`SETTLE_S` after the charts were redrawn, each
    saved as a screenshot ``overflow-<name>-<width>.png`` (``SCREENSHOTS`` of support.py)."""
    found = {}
    try:
        for width in CHECKED_WIDTHS:
            page.set_viewport_size({"width": width, "height": VIEWPORT["height"]})
            page.wait_for_function(CHARTS_DRAWN_JS, timeout=RUN_TIMEOUT_MS)
            deadline = time.monotonic() + SETTLE_S
            while got := page.evaluate(OVERFLOWS_JS):
                if time.monotonic() > deadline:
                    found[width] = got
                    _screenshot(page, f"overflow-{name.replace(' ', '-')}-{width}.png")
                    break
                page.wait_for_timeout(250)
    finally:
        page.set_viewport_size(VIEWPORT)
    return found


@pytest.fixture(scope="module")
def pages(app: App) -> dict[str, str]:
    """Page name -> its route, with the data each needs."""
    profile_id = insert_profile_run(app.data_dir)
    sweep_id, _ = insert_wide_sweep(app.data_dir)
    plan_id, _ = insert_plan(app.data_dir)
    tiny = {"model": {"kind": "mlp", "depth": 4, "width": 64}, "batch_size": 16, "steps": 3, "device": "cpu"}
    code, prediction = _request(f"{app.url}/api/predictions", {"spec": tiny, "target": "h100-80gb"})
    assert code == 201, prediction
    return {
        "list": "#/",
        "experiment": f"#/experiments/{profile_id}",
        "sweep": f"#/sweeps/{sweep_id}?budget=120MiB",
        "plan": f"#/plans/{plan_id}",
        "prediction": f"#/predictions/{prediction['id']}",
        "form": "#/new",
        "sweep form": "#/new?mode=sweep",
        "plan form": "#/new?mode=plan",
        "hf llama form": "#/new",
    }


#: What shows that each page has drawn its data.
READY = {
    "list": "#experiments tbody tr",
    "experiment": "#exp-summary dt",
    "sweep": "#sweep-runs tbody tr",
    "plan": "#plan-blocks-row",
    "prediction": "#pred-verdict",
    "form": "#submit",
    "sweep form": "#axes-fieldset",
    "plan form": "#plan-budget",
    "hf llama form": "#f-hf-num_key_value_heads",
}


@pytest.mark.parametrize("name", list(READY))
def test_no_element_sticks_out_of_its_card(app_url: str, pages: dict[str, str], tab: Tab, name: str) -> None:
    page = tab.page
    page.goto(f"{app_url}/{pages[name]}")
    if name == "hf llama form":
        page.select_option("#model\\.kind", "hf")
        page.select_option("#f-hf-architecture", "llama")
    page.locator(READY[name]).first.wait_for(state="visible", timeout=RUN_TIMEOUT_MS)
    found = _overflows(page, name)
    assert not found, "\n".join(f"{name} at {w} px: {line}" for w, lines in found.items() for line in lines)
    tab.assert_no_errors()
