"""Browser tests of the frontend against the real app (backend + worker + SQLite).

One ``python -m ckptlab.cli up`` per test session (a free port, a temporary data dir; see conftest.py) and one
headless Debian chromium, driven with Playwright (no downloaded browser). The tests submit
a sweep and an experiment from the form, watch them finish live (no reload), check the
charts, the recommendation for a memory budget, the field errors of bad values, cancelling,
and a list of 100 experiments (its render time: bench/bench_list_page.py). They also save the README's
screenshots (1280 px wide; in docs/screenshots/ with `make screenshots`).
"""

from __future__ import annotations

import json
import re

from playwright.sync_api import expect

from tests.frontend.support import (
    CHARTS,
    RUN_TIMEOUT_MS,
    App,
    Tab,
    _count,
    _get_json,
    _insert_finished_experiments,
    _request,
    _screenshot,
    _trace_names,
    assert_charts_clear,
    submit_and_finish,
)

# ----------------------------------------------------------------------------- sweep

#: A JS filter that keeps a chart's own traces, not the marks of the card's picks.
NOT_A_MARK = "(t) => !(t.meta && t.meta.pick)"


def test_sweep_from_form_live_charts_and_recommendation(app_url: str, tab: Tab) -> None:
    page = tab.page
    sweeps_before = _count(app_url, "sweeps")
    page.goto(app_url + "/#/new?mode=sweep")
    expect(page.locator("#mode-sweep")).to_be_checked()
    # A 2 x 2 sweep of a tiny MLP on the CPU. Batch 128 (not 16) so that checkpointing moves
    # the peak: at batch 16 the gradients dominate and every run has the same peak, which
    # would leave no budget that only some runs fit. Dropout, so that RNG off shows.
    page.select_option("#model\\.kind", "mlp")
    page.fill("#f-mlp-depth", "8")
    page.fill("#f-mlp-width", "64")
    page.fill("#f-mlp-dropout", "0.1")
    page.fill("#batch_size", "128")
    page.fill("#steps", "3")
    page.select_option("#device", "cpu")
    page.check("#axis-segments")
    expect(page.locator("#checkpoint\\.strategy")).to_have_value("sequential")  # the axis needs it
    expect(page.locator("#checkpoint\\.segments")).to_be_disabled()  # the axis sets it
    page.fill("#axis-segments-values", "2,4")
    page.check("#axis-rng")
    page.fill("#sweep-name", "tiny mlp segments x rng")

    # The number of runs is shown before submitting: 2 x 2 runs + 1 baseline, run twice.
    expect(page.locator("#run-count-total")).to_have_text("6")
    expect(page.locator("#run-count")).to_contain_text("4 runs")
    expect(page.locator("#run-count")).to_contain_text("2 baselines")
    expect(page.locator("#run-count")).to_contain_text("again last so that drift shows")
    expect(page.locator("#submit")).to_have_text("Submit sweep (6 runs)")
    _screenshot(page, "new-sweep.png")

    # Watch the progress text for the rest of the test; mark the page to detect a reload.
    page.evaluate(
        """() => {
        window.__noReload = 'still here';
        window.__progress = [];
        window.__eta = [];
        const node = document.getElementById('sweep-progress-text');
        new MutationObserver(() => window.__progress.push(node.textContent))
          .observe(node, {childList: true, characterData: true, subtree: true});
        const eta = document.getElementById('sweep-eta');
        new MutationObserver(() => window.__eta.push(eta.textContent))
          .observe(eta, {childList: true, characterData: true, subtree: true});
      }"""
    )
    page.click("#submit")
    page.wait_for_url(re.compile(r"#/sweeps/\d+"))
    sweep_id = int(re.search(r"#/sweeps/(\d+)", page.url).group(1))
    expect(page.locator("#sweep-progress-text")).to_have_text("6 of 6", timeout=RUN_TIMEOUT_MS)

    # Live: the text went from "0 of 6" through partial counts to "6 of 6", with no reload.
    seen = [t for t in page.evaluate("window.__progress") if re.fullmatch(r"\d+ of \d+", t)]
    assert seen[0] == "0 of 6", seen
    assert seen[-1] == "6 of 6", seen
    assert len(set(seen)) >= 2, seen
    # ... with an estimate of the time left once a run had finished (issue 23), gone at the end.
    etas = page.evaluate("window.__eta")
    assert any(re.fullmatch(r" · about \d+ (s|min) left", t) for t in etas), etas
    expect(page.locator("#sweep-eta")).to_have_text("")
    assert page.evaluate("window.__noReload") == "still here"
    assert page.evaluate("performance.getEntriesByType('navigation').length") == 1
    assert any(f"/api/sweeps/{sweep_id}/events" in u for u in tab.requested), "no event stream was opened"

    code, sweep = _get_json(f"{app_url}/api/sweeps/{sweep_id}")
    assert code == 200 and sweep["progress"]["total"] == 6 and sweep["name"] == "tiny mlp segments x rng"
    assert _count(app_url, "sweeps") == sweeps_before + 1
    assert sweep["progress"]["counts"]["succeeded"] == 6, sweep["progress"]

    # The four charts show the API's traces, once every run is in (beside the marks of the
    # card's picks: traces with meta.pick).
    for name, div in CHARTS.items():
        code, fig = _get_json(f"{app_url}/api/sweeps/{sweep_id}/charts/{name}")
        assert code == 200
        expected = [[t.get("name"), len(t.get("x") or [])] for t in fig["data"]]
        page.wait_for_function(
            f"JSON.stringify((document.getElementById('{div}').data || []).filter({NOT_A_MARK})"
            f".map((t) => [t.name, (t.x || []).length])) === {json.dumps(json.dumps(expected, separators=(',', ':')))}"
        )
    memory = _trace_names(page, "sweep-chart-memory")
    for trace in ("activation rng=on", "activation rng=off", "peak rng=on", "peak rng=off", "expected"):
        assert trace in memory, memory
    assert sorted(n for n in _trace_names(page, "sweep-chart-time") if n.startswith("overhead")) == [
        "overhead rng=off",
        "overhead rng=on",
    ]
    assert "pareto frontier" in _trace_names(page, "sweep-chart-pareto")
    # Activations have their own axis, so the expected curve is visible: non-zero values inside
    # the plotted range of the axis it is drawn on (not flattened under the peak).
    law_visible = page.evaluate(
        """(() => {
          const d = document.getElementById('sweep-chart-memory');
          const law = d.data.find((t) => /expected/.test(t.name));
          const peak = d.data.find((t) => /^peak/.test(t.name));
          const axis = (t) => d._fullLayout[(t.yaxis || 'y').replace('y', 'yaxis')];
          const [lo, hi] = axis(law).range;
          return axis(law) !== axis(peak) && law.y.some((v) => v > 0 && v >= lo && v <= hi && v > lo + (hi - lo) / 10);
        })()"""
    )
    assert law_visible
    # The time chart draws each overhead's 95% confidence interval.
    bands = page.evaluate(
        f"document.getElementById('sweep-chart-time').data.filter({NOT_A_MARK})"
        ".map((t) => (t.error_y && t.error_y.array ? t.error_y.array.length : 0))"
    )
    assert bands and all(n == 2 for n in bands), bands
    assert page.evaluate("document.getElementById('sweep-chart-correctness').data[0].x.length") == 4
    # Memory axes in binary units, colours from the Okabe-Ito palette.
    assert re.search(
        r"\((B|KiB|MiB|GiB)\)", page.evaluate("document.getElementById('sweep-chart-memory').layout.yaxis.title.text")
    )
    okabe_ito = {"#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000", "#F0E442", "#8C8C8C"}
    colors = page.evaluate("document.getElementById('sweep-chart-memory').data.map((t) => t.line.color)")
    assert set(colors) <= okabe_ito, colors
    # No title, legend or label runs into another, at the widths the screenshots use (issue 23).
    assert_charts_clear(page, list(CHARTS.values()), screenshot="sweep")

    # The runs table lists every experiment of the sweep.
    code, results = _get_json(f"{app_url}/api/sweeps/{sweep_id}/results")
    assert code == 200
    rows = page.locator("#sweep-runs tbody tr")
    expect(rows).to_have_count(6)
    # The baseline's second run shows its drift from the first in the overhead column.
    (again,) = [r for r in results["data"] if r["repeat_of"] is not None]
    expect(page.locator(f"#sweep-runs tbody tr[data-id='{again['experiment_id']}']")).to_contain_text("drift")
    assert sorted(int(i) for i in rows.evaluate_all("(rs) => rs.map((r) => r.dataset.id)")) == sorted(
        r["experiment_id"] for r in results["data"]
    )

    # A budget that only some configurations fit: the card, the table and the API name the
    # same run (the server's recommendation is the only one); rng off with dropout, whose
    # gradients differ, is never it.
    done = [r for r in results["data"] if r["status"] == "succeeded"]
    assert any(r["gradients_match"] is False for r in done), "expected rng=off with dropout to differ"
    peaks = sorted({r["metrics"]["peak_allocated_bytes"] for r in done})
    assert len(peaks) >= 2, f"every run has the same peak, no budget splits them: {peaks}"
    budget_kib = round((peaks[0] + peaks[-1]) / 2 / 1024)
    budget = round(budget_kib * 1024)
    over_budget = [r for r in done if r["metrics"]["peak_allocated_bytes"] > budget]
    assert 0 < len(over_budget) < len(done)
    code, api_rec = _get_json(f"{app_url}/api/sweeps/{sweep_id}/recommendation?budget_bytes={budget}")
    assert code == 200 and api_rec["experiment_id"] is not None, api_rec
    best = next(r for r in results["data"] if r["experiment_id"] == api_rec["experiment_id"])
    assert best["gradients_match"] is not False and best["metrics"]["peak_allocated_bytes"] <= budget
    page.fill("#budget", f"{budget_kib} KiB")
    recommended = page.locator("#sweep-runs tbody tr.recommended")
    expect(recommended).to_have_count(1)
    expect(recommended).to_have_attribute("data-id", str(best["experiment_id"]))
    expect(recommended).to_contain_text("recommended")
    expect(page.locator("#pick-recommended")).to_have_attribute("data-id", str(best["experiment_id"]))
    expect(page.locator("#pick-recommended")).to_contain_text(best["label"])
    expect(page.locator("#pick-recommended")).to_contain_text("gradients differ")
    expect(page.locator("#recommend-reason")).to_contain_text(api_rec["reason"])
    fits = sorted(
        int(i) for i in page.locator("#sweep-runs tbody tr.fits").evaluate_all("(rs) => rs.map((r) => r.dataset.id)")
    )
    assert fits == sorted(api_rec["fitting"])
    # The charts mark the same run (issue 32), and the table sorted by overhead (the server's
    # ranking) has it first of the fitting rows; the card gives its paired overhead, no ms.
    page.wait_for_function(
        "(document.getElementById('sweep-chart-pareto').data || [])"
        f".some((t) => t.meta && t.meta.pick === 'recommended' && t.ids[0] === '{best['experiment_id']}')"
    )
    expect(page.locator("#pick-recommended")).to_contain_text("95% CI")
    expect(page.locator("#pick-recommended")).not_to_contain_text("ms/step")
    page.click("#sweep-runs thead th[data-sort='overhead']")
    order = [int(i) for i in page.locator("#sweep-runs tbody tr").evaluate_all("(rs) => rs.map((r) => r.dataset.id)")]
    assert [i for i in order if i in api_rec["fitting"]][0] == best["experiment_id"], (order, api_rec)
    over = page.locator("#sweep-runs tbody tr.over-budget")
    expect(over).to_have_count(len(over_budget))

    # The smallest peak within a time overhead of the fastest fitting run: the server's.
    page.fill("#overhead", "100000")
    code, within = _get_json(f"{app_url}/api/sweeps/{sweep_id}/recommendation?budget_bytes={budget}&within_pct=100000")
    smallest = within["smallest_within"]  # everything is within 100000%: the lowest fitting peak
    peak_of = {r["experiment_id"]: r["metrics"]["peak_allocated_bytes"] for r in done}
    assert peak_of[smallest["experiment_id"]] == min(peak_of[i] for i in api_rec["fitting"])
    expect(page.locator("#pick-smallest")).to_have_attribute("data-id", str(smallest["experiment_id"]))
    page.fill("#overhead", "20")

    # Sorting the table by a column; the view state is in the URL.
    page.click("#sweep-runs thead th[data-sort='peak']")
    order = [int(i) for i in page.locator("#sweep-runs tbody tr").evaluate_all("(rs) => rs.map((r) => r.dataset.id)")]
    by_id = {r["experiment_id"]: r for r in results["data"]}
    peaks_in_order = [by_id[i]["metrics"]["peak_allocated_bytes"] for i in order]
    assert peaks_in_order == sorted(peaks_in_order)
    assert "sort=peak" in page.url and "budget=" in page.url
    page.mouse.move(0, 0)
    _screenshot(page, "sweep.png")

    # The URL is shareable: opening it again restores the budget and the recommendation.
    shared = page.url
    page.goto(app_url + "/#/")
    page.goto(shared)
    expect(page.locator("#budget")).to_have_value(f"{budget_kib} KiB")
    expect(page.locator("#sweep-runs tbody tr.recommended")).to_have_attribute("data-id", str(best["experiment_id"]))

    # The recommended run's page: its overhead against the sweep's baseline.
    page.click(f"#sweep-runs tbody tr.recommended a[href='#/experiments/{best['experiment_id']}']")
    page.wait_for_url(re.compile(rf"#/experiments/{best['experiment_id']}$"))
    expect(page.locator("#exp-status")).to_have_text("succeeded")
    # A signed overhead only when measurable, else "no measurable difference"; the CI beside it.
    expect(page.locator("#exp-overhead")).to_have_text(re.compile(r"^([+−]?\d+(\.\d)?%|no measurable difference)$"))
    expect(page.locator("#exp-overhead-ci")).to_contain_text("95% CI")
    expect(page.locator("#exp-summary")).to_contain_text(f"#{best['baseline_id']}")
    expect(page.locator("#exp-grad")).to_contain_text("match")
    _, shown = _get_json(f"{app_url}/api/experiments/{best['experiment_id']}")
    if (shown.get("summary") or {}).get("recompute_verdict") == "match":  # it checkpoints a group
        expect(page.locator("#exp-recompute")).to_contain_text("every checkpointed group recomputes")
    page.wait_for_function(
        "document.getElementById('chart-memory').data && document.getElementById('chart-memory').data.length >= 5"
    )
    names = _trace_names(page, "chart-memory")
    assert names[:5] == ["parameters", "gradients", "optimizer state", "activations", "other"], names
    _screenshot(page, "experiment.png")

    # The list: the sweep with its progress, its experiments with their statuses.
    page.goto(app_url + "/#/")
    expect(page.locator(f"#sweeps tr[data-sweep='{sweep_id}']")).to_contain_text("6 of 6")
    expect(page.locator(f"#experiments tr[data-id='{best['experiment_id']}'] td.status")).to_have_text("succeeded")

    tab.assert_local_only(app_url)
    tab.assert_no_errors()


# ----------------------------------------------------------------------------- experiment


def test_run_experiment_and_watch_it(app_url: str, tab: Tab) -> None:
    page = tab.page
    page.goto(app_url + "/#/new")
    expect(page.locator("#mode-experiment")).to_be_checked()
    page.fill("#f-mlp-depth", "8")
    page.fill("#f-mlp-width", "64")
    page.fill("#batch_size", "16")
    page.fill("#steps", "6")
    page.fill("#timed_steps", "4")
    page.click("#advanced > summary")
    page.uncheck("#memory_early_stop")  # all 6 memory steps, flat memory or not
    page.select_option("#checkpoint\\.strategy", "sequential")
    page.fill("#checkpoint\\.segments", "4")
    page.select_option("#device", "cpu")
    expect(page.locator("#run-count-total")).to_have_text("1")
    exp_id = submit_and_finish(page)
    assert any(f"/api/experiments/{exp_id}/events" in u for u in tab.requested), "no event stream was opened"

    # One chart point per step as stored: memory for the 6 memory steps, time for all 10 on
    # two panels (issue 32): the 6 memory steps, then the 4 timed steps (no memory reading).
    assert page.evaluate("document.getElementById('chart-memory').data[0].x.length") == 6
    assert _trace_names(page, "chart-time") == ["forward", "backward", "optimizer", "step"] * 2
    time_x = page.evaluate("document.getElementById('chart-time').data.map((t) => [t.xaxis, t.x.length])")
    assert time_x == [["x", 6]] * 4 + [["x2", 4]] * 4
    code, steps = _get_json(f"{app_url}/api/experiments/{exp_id}/steps")
    assert code == 200 and steps["count"] == 10
    assert [s["step"] for s in steps["data"]] == list(range(1, 11))
    assert [s["extra"]["pass"] for s in steps["data"]] == ["memory"] * 6 + ["timed"] * 4
    # Each step axis spans the steps its chart draws: memory ends with the memory pass (issue 23).
    assert page.evaluate("document.getElementById('chart-memory').layout.xaxis.range[1]") == 6.5
    assert page.evaluate("document.getElementById('chart-time').layout.xaxis.range[1]") == 6.5
    assert page.evaluate("document.getElementById('chart-time').layout.xaxis2.range") == [6.5, 10.5]
    assert_charts_clear(page, ["chart-memory", "chart-time"], screenshot="experiment")

    expect(page.locator("#exp-summary")).to_contain_text("Activation memory")
    expect(page.locator("#exp-env")).to_contain_text("PyTorch")
    expect(page.locator("#exp-cancel")).to_be_hidden()
    # Downloads point at the API.
    csv_href = page.locator("#exp-downloads a", has_text="Steps CSV").get_attribute("href")
    code, text = _request(app_url + csv_href)
    assert code == 200 and "step_ms" in text.splitlines()[0] and len(text.splitlines()) == 11
    json_href = page.locator("#exp-downloads a", has_text="Experiment JSON").get_attribute("href")
    code, body = _request(app_url + json_href)
    assert code == 200 and [e["id"] for e in body["data"]] == [exp_id]
    expect(page.locator("#exp-snapshot")).to_have_count(0)  # CPU: no memory snapshot

    # "Copy to form" fills the form with this spec.
    page.click("#exp-copy")
    page.wait_for_url(re.compile(r"#/new"))
    expect(page.locator("#f-mlp-width")).to_have_value("64")
    expect(page.locator("#steps")).to_have_value("6")
    expect(page.locator("#timed_steps")).to_have_value("4")
    expect(page.locator("#memory_early_stop")).not_to_be_checked()
    expect(page.locator("#checkpoint\\.strategy")).to_have_value("sequential")
    expect(page.locator("#checkpoint\\.segments")).to_have_value("4")
    page.go_back()
    expect(page.locator("#exp-status")).to_have_text("succeeded")

    # No baseline with this spec yet: run it from the page, then the overhead shows.
    page.click("#exp-run-baseline")
    page.wait_for_url(lambda u: re.search(r"#/experiments/\d+$", u) is not None and not u.endswith(f"/{exp_id}"))
    base_id = int(page.url.rsplit("/", 1)[1])
    assert base_id != exp_id
    expect(page.locator("#exp-status")).to_have_text("succeeded", timeout=RUN_TIMEOUT_MS)
    expect(page.locator("#exp-summary")).to_contain_text("this run is a baseline")
    page.goto(f"{app_url}/#/experiments/{exp_id}")
    expect(page.locator("#exp-overhead")).to_be_visible()
    expect(page.locator("#exp-summary")).to_contain_text(f"#{base_id}")

    # The list shows the experiment, finished, and its row opens it again.
    page.goto(app_url + "/#/")
    row = page.locator(f'#experiments tr[data-id="{exp_id}"]')
    expect(row.locator("td.status")).to_have_text("succeeded")
    expect(row).to_contain_text("mlp 8×64")
    expect(row).to_contain_text("sequential (4)")
    row.locator("td").nth(1).click()
    page.wait_for_url(re.compile(rf"#/experiments/{exp_id}$"))
    expect(page.locator("#exp-status")).to_have_text("succeeded")

    tab.assert_local_only(app_url)
    tab.assert_no_errors()


def test_cancel_and_live_list(app: App, tab: Tab) -> None:
    page = tab.page
    app_url = app.url
    long_run = {
        "model": {"kind": "mlp", "depth": 8, "width": 64},
        "batch_size": 16,
        "steps": 20000,
        "memory_early_stop": False,  # every one of the 20000 memory steps runs: the run stays live
        "device": "cpu",
    }

    # The list follows a running experiment through its event stream: cancelled elsewhere
    # (here through the API), its row changes without a reload.
    code, first = _request(f"{app_url}/api/experiments", long_run)
    assert code == 201
    page.goto(app_url + "/#/")
    row = page.locator(f"#experiments tr[data-id='{first['id']}'] td.status")
    expect(row).to_have_text("running", timeout=RUN_TIMEOUT_MS)
    expect(page.locator("#live-indicator")).to_be_visible()
    page.evaluate("window.__noReload = 1")
    assert _request(f"{app_url}/api/experiments/{first['id']}/cancel", {})[0] == 200
    expect(row).to_have_text("cancelled", timeout=10_000)
    assert page.evaluate("window.__noReload") == 1
    assert any(f"/api/experiments/{first['id']}/events" in u for u in tab.requested)

    # The experiment page's Cancel button, while live steps arrive on the charts.
    code, exp = _request(f"{app_url}/api/experiments", long_run)
    assert code == 201
    page.goto(f"{app_url}/#/experiments/{exp['id']}")
    expect(page.locator("#exp-status")).to_have_text("running", timeout=RUN_TIMEOUT_MS)
    page.wait_for_function("(document.getElementById('chart-time').data || [{x: []}])[0].x.length > 0")
    page.click("#exp-cancel")
    expect(page.locator("#exp-status")).to_have_text("cancelled", timeout=30_000)
    expect(page.locator("#exp-cancel")).to_be_hidden()
    assert _get_json(f"{app_url}/api/experiments/{exp['id']}")[1]["status"] == "cancelled"

    # The sweep page's Cancel button: every unfinished run of the sweep is cancelled.
    code, sweep = _request(
        f"{app_url}/api/sweeps",
        {
            "name": "long",
            "base": {**long_run, "checkpoint": {"strategy": "sequential"}},
            "axes": {"checkpoint.segments": [2, 4]},
        },
    )
    assert code == 201
    page.goto(f"{app_url}/#/sweeps/{sweep['id']}")
    expect(page.locator("#sweep-cancel")).to_be_visible()
    # It asks first: dismissing the dialog cancels nothing.
    asked: list[str] = []
    page.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))
    page.click("#sweep-cancel")
    assert asked and asked[0].startswith(f"Cancel the 4 unfinished runs of sweep #{sweep['id']}?"), asked
    assert _get_json(f"{app_url}/api/sweeps/{sweep['id']}")[1]["cancelled"] is False
    page.once("dialog", lambda d: d.accept())
    page.click("#sweep-cancel")
    expect(page.locator("#sweep-progress-text")).to_have_text("4 of 4", timeout=30_000)  # baseline twice
    expect(page.locator("#sweep-counts")).to_contain_text("cancelled")
    expect(page.locator("#sweep-cancel")).to_be_hidden()

    # The list after this module's runs (a sweep, experiments, a baseline, cancelled ones).
    page.goto(app_url + "/#/")
    expect(page.locator(f"#experiments tr[data-id='{exp['id']}'] td.status")).to_have_text("cancelled")
    _screenshot(page, "list.png", full_page=False)
    tab.assert_local_only(app_url)
    tab.assert_no_errors()


def test_snapshot_download_link(app: App, tab: Tab) -> None:
    """An experiment with a CUDA memory snapshot (written to the database here: the CPU
    makes none) offers it for download."""
    page = tab.page
    (exp_id,) = _insert_finished_experiments(app.data_dir, 1)
    snapshot = app.data_dir / f"snapshot-{exp_id}.pickle"
    snapshot.write_bytes(b"not really a pickle")
    from ckptlab.db.database import make_engine, make_sessionmaker
    from ckptlab.db.models import Experiment
    from ckptlab.settings import Settings

    engine = make_engine(Settings(data_dir=app.data_dir).resolved_database_url)
    try:
        with make_sessionmaker(engine)() as session:
            session.get(Experiment, exp_id).snapshot_path = str(snapshot)
            session.commit()
    finally:
        engine.dispose()
    page.goto(f"{app.url}/#/experiments/{exp_id}")
    link = page.locator("#exp-snapshot")
    expect(link).to_be_visible()
    code, body = _request(app.url + link.get_attribute("href"))
    assert code == 200 and body == "not really a pickle"
    tab.assert_no_errors()
