"""Issue 32, items 1 and 2, on the sweep page: the card, the table and the charts name the
same runs, all read from the server's one ranking by paired overhead; the "fastest fitting"
pick has no fitting run measurably faster; "within X%" names nothing above X%; and a run's
own step time is labelled as separate runs wherever it is shown."""

from __future__ import annotations

from typing import Any

from playwright.sync_api import expect

from tests.factories import paired_summary
from tests.frontend.seed import insert_finished_sweep
from tests.frontend.support import Tab, _get_json

MIB = 2**20
#: The README's preset (a GPT 6x128 at seq 128) over segments 2, 3, 6 as the issue saw it
#: on a busy host: segments -> peak (MiB), its own median step time (ms, a separate run)
#: and its paired overhead (estimate, 95% CI low, high; %). By raw ms segments=3 is the
#: slowest run; by paired overhead it is the fastest (its CI wholly below segments=2's);
#: segments=6 is +39% with a CI reaching 15%.
FIGURES: dict[int | None, tuple[int, float, tuple[float, float, float] | None]] = {
    None: (200, 964.5, None),
    2: (110, 389.5, (30.0, 29.0, 31.0)),
    3: (95, 933.5, (27.5, 26.5, 27.8)),
    6: (60, 535.0, (39.0, 15.0, 60.0)),
}


def _insert_issue_sweep(app_dir) -> tuple[int, dict[int | None, int]]:
    from tests.factories import spec_dict

    base = spec_dict(
        model={"kind": "transformer", "depth": 6, "d_model": 128, "heads": 4, "seq_len": 128, "vocab_size": 1000},
        **{"checkpoint.strategy": "sequential"},
    )

    def figures(spec: Any) -> tuple[int, int, float, dict[str, Any]]:
        segments = None if spec.checkpoint.strategy == "none" else spec.checkpoint.segments
        peak, ms, paired = FIGURES[segments]
        return peak * MIB, peak * MIB // 2, ms, paired_summary(*paired) if paired else {}

    sweep_id, ids = insert_finished_sweep(app_dir, "issue 32", base, {"checkpoint.segments": [2, 3, 6]}, figures)
    return sweep_id, {None if k.startswith("base") else int(k.split("=")[1]): v for k, v in ids.items()}


#: The charts' marks (traces with ``meta.pick``): {chart div: {kind: [experiment id]}}.
MARKS_JS = """() => Object.fromEntries(['sweep-chart-pareto', 'sweep-chart-time'].map((id) => [id,
  Object.fromEntries((document.getElementById(id).data || []).filter((t) => t.meta && t.meta.pick)
    .map((t) => [t.meta.pick, t.ids.map(Number)]))]))"""


def _marks(page) -> dict[str, dict[str, list[int]]]:
    return page.evaluate(MARKS_JS)


def _ids(page, selector: str) -> list[int]:
    return [int(i) for i in page.locator(selector).evaluate_all("(rs) => rs.map((r) => r.dataset.id)")]


def test_the_card_the_table_and_the_charts_name_the_same_runs_from_one_ranking(app, tab: Tab) -> None:
    page = tab.page
    sweep_id, ids = _insert_issue_sweep(app.data_dir)
    code, rec = _get_json(f"{app.url}/api/sweeps/{sweep_id}/recommendation?budget_bytes={120 * MIB}&within_pct=40")
    assert code == 200 and rec["experiment_id"] == ids[3] and rec["smallest_within"]["experiment_id"] == ids[6]

    page.goto(f"{app.url}/#/sweeps/{sweep_id}?budget=120MiB&overhead=40")
    # The card: the fastest fitting run by paired overhead (segments=3, its raw 933.5 ms the
    # slowest), its overhead with its CI and no raw step time; the smallest within +40%.
    card = page.locator("#pick-recommended")
    expect(card).to_have_attribute("data-id", str(ids[3]))
    expect(card).to_contain_text("segments=3")
    expect(card).to_contain_text("overhead +28% (95% CI +27% to +28%)")
    expect(card).not_to_contain_text("ms")
    expect(page.locator("#pick-smallest")).to_have_attribute("data-id", str(ids[6]))
    expect(page.locator("#pick-smallest")).to_contain_text("within +40% overhead of its baseline")
    # The table marks the same rows ...
    expect(page.locator("#sweep-runs tbody tr.recommended")).to_have_count(1)
    assert _ids(page, "#sweep-runs tbody tr.recommended") == [ids[3]]
    assert _ids(page, "#sweep-runs tbody tr.smallest") == [ids[6]]
    # ... the charts too, on the point of each (the pareto chart: peak against paired overhead) ...
    page.wait_for_function(f"({MARKS_JS})()['sweep-chart-pareto'].recommended")
    marks = _marks(page)
    assert marks["sweep-chart-pareto"] == {"recommended": [ids[3]], "smallest": [ids[6]]}, marks
    assert marks["sweep-chart-time"] == {"recommended": [ids[3]], "smallest": [ids[6]]}, marks
    pareto_x = page.evaluate(
        "(() => { const t = document.getElementById('sweep-chart-pareto').data.find((t) => t.name === 'runs');"
        " return Object.fromEntries(t.ids.map((id, i) => [id, t.x[i]])); })()"
    )
    assert pareto_x == {str(ids[2]): 30.0, str(ids[3]): 27.5, str(ids[6]): 39.0}  # never raw ms
    # ... and sorting the table by overhead follows the server's ranking: the first fitting
    # row is the pick, and no fitting row below it is measurably faster.
    page.click("#sweep-runs thead th[data-sort='overhead']")
    order = _ids(page, "#sweep-runs tbody tr")
    assert order == rec["ranking"], (order, rec["ranking"])
    fitting_in_order = [i for i in order if i in rec["fitting"]]
    assert fitting_in_order[0] == ids[3]
    ci = {ids[n]: FIGURES[n][2][1:] for n in (2, 3, 6)}
    assert not [i for i in fitting_in_order if ci[i][1] < ci[ids[3]][0]]
    # A run's own step time is labelled as separate runs, not comparable.
    header = page.locator("#sweep-runs thead th[data-sort='time']")
    expect(header).to_contain_text("own run")
    expect(page.locator("#runs-note")).to_contain_text("step time: each run's own, separate runs, not comparable")
    expect(header).to_have_attribute("title", "each run's own median: separate runs, not comparable on a busy host")

    # "Within +20%": nothing fitting is (segments=6 is +39%, however low its CI reaches);
    # the card says so, and neither the table nor a chart marks one.
    page.fill("#overhead", "20")
    expect(page.locator("#pick-smallest")).to_contain_text("none: no fitting configuration")
    expect(page.locator("#pick-smallest")).to_have_attribute("data-id", "")
    expect(page.locator("#sweep-runs tbody tr.smallest")).to_have_count(0)
    page.wait_for_function(f"!({MARKS_JS})()['sweep-chart-pareto'].smallest")
    assert _marks(page)["sweep-chart-pareto"] == {"recommended": [ids[3]]}
    # At 100 MiB segments=2 no longer fits: the pick stays segments=3, on the card, table and charts.
    page.fill("#budget", "100 MiB")
    expect(page.locator("#pick-recommended")).to_contain_text("Recommended for 100 MiB")
    expect(page.locator("#pick-recommended")).to_have_attribute("data-id", str(ids[3]))
    assert _ids(page, "#sweep-runs tbody tr.recommended") == [ids[3]]
    assert _marks(page)["sweep-chart-pareto"] == {"recommended": [ids[3]]}
    tab.assert_no_errors()
