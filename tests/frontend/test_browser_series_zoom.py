"""Browser test of a long run's charts: a finished 150,000-step run is drawn from its
downsampled series (from the rollup), a zoom dragged across the time chart reads that range
again from the server, a narrow zoom shows every step of it, and a double-click goes back
to the whole run."""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import Page

from ckptlab.summary import RunSummary
from tests.frontend.support import App, Tab

N = 150_000


def step_ms(step: int) -> float:
    """The run's step time: never equal at neighbouring steps (a flat stretch would be
    thinned for WebGL), one spike."""
    return 50.0 if step == 100_000 else 3.0 + (step % 97) / 100


def _insert_long_run(app_dir: Path) -> int:
    """A succeeded run of N steps written into the app's database the way a worker writes
    them (with their rollup)."""
    from ckptlab.db import store
    from ckptlab.db.database import make_engine, make_sessionmaker
    from ckptlab.settings import Settings
    from ckptlab.spec.experiment import ExperimentSpec

    engine = make_engine(Settings(data_dir=app_dir).resolved_database_url)
    spec = ExperimentSpec.model_validate(
        {"model": {"kind": "mlp", "depth": 8, "width": 64}, "device": "cpu", "steps": 100_000, "timed_steps": 50_000}
    )
    try:
        with make_sessionmaker(engine)() as session:
            exp = store.create_experiment(session, spec=spec, status="running", worker_id="test")
            for start in range(1, N + 1, 10_000):
                records = [
                    {
                        "step": s,
                        "forward_ms": 1.0,
                        "backward_ms": 1.5,
                        "optimizer_ms": 0.5,
                        "step_ms": step_ms(s),
                        "allocated_bytes": 1_000_000,
                        "peak_allocated_bytes": 2_000_000 + s % 89,
                        "loss": 1.0,
                    }
                    for s in range(start, min(N, start + 9_999) + 1)
                ]
                store.add_steps(session, experiment_id=exp.id, attempt=1, records=records)
            from ckptlab.db import queue

            queue.finish_experiment(session, experiment_id=exp.id, status="succeeded", summary=RunSummary())
            return exp.id
    finally:
        engine.dispose()


STEP_TRACE = """() => {
  const t = (document.getElementById('chart-time').data || []).find((d) => d.name === 'step');
  return t ? {x: Array.from(t.x), y: Array.from(t.y)} : null;
}"""


def note(page: Page) -> list[str]:
    """The time chart's note on what it shows."""
    return page.locator("#chart-time .annotation-text").all_text_contents()


def _drag(page: Page, chart: str, x_from: float, x_to: float) -> None:
    """Drag horizontally across ``chart``'s plot area from step ``x_from`` to ``x_to``, as
    a user zooms."""
    page.locator(f"#{chart}").scroll_into_view_if_needed()
    box = page.evaluate(
        """([id, a, b]) => {
        const gd = document.getElementById(id);
        const xa = gd._fullLayout.xaxis;
        const r = gd.querySelector('.nsewdrag').getBoundingClientRect();
        return {x0: r.left + xa.l2p(a), x1: r.left + xa.l2p(b), y: r.top + r.height / 2};
      }""",
        [chart, x_from, x_to],
    )
    page.mouse.move(box["x0"], box["y"])
    page.mouse.down()
    page.mouse.move(box["x1"], box["y"], steps=12)
    page.mouse.up()


def test_zooming_a_long_run_reads_the_range_again_at_full_resolution(app: App, tab: Tab) -> None:
    page = tab.page
    exp_id = _insert_long_run(app.data_dir)
    page.goto(f"{app.url}/#/experiments/{exp_id}")
    page.wait_for_function(f"(() => {{ const t = ({STEP_TRACE})(); return t && t.x.at(-1) === {N}; }})()")
    whole = page.evaluate(STEP_TRACE)
    assert len(whole["x"]) <= 2000 and 100_000 in whole["x"], "the spike survives downsampling"
    assert note(page) == [f"{len(whole['x']):,} of {N:,} steps shown (MinMaxLTTB: spikes kept)"]

    # A wide zoom: still downsampled, now from every step of the range.
    _drag(page, "chart-time", 60_000, 80_000)
    page.wait_for_function(
        f"(() => {{ const t = ({STEP_TRACE})(); return t && t.x[0] > 50000 && t.x.at(-1) < 90000; }})()"
    )
    assert any("step_min=" in u and "metric=step_ms" in u for u in tab.requested)

    # A narrow zoom: every step of the range, exactly the stored values.
    _drag(page, "chart-time", 70_000, 71_500)
    page.wait_for_function(
        f"(() => {{ const t = ({STEP_TRACE})(); return t && t.x[0] > 69000 && t.x.at(-1) < 72000; }})()"
    )
    lo, hi = page.evaluate("document.getElementById('chart-time').layout.xaxis.range")
    first, last = int(-(-lo // 1)), int(hi // 1)
    zoomed = page.evaluate(STEP_TRACE)
    assert last - first < 2000, (lo, hi)
    assert zoomed["x"] == list(range(first, last + 1)), "every step of the zoomed range"
    assert zoomed["y"] == [step_ms(s) for s in zoomed["x"]]
    memory_range = page.evaluate("document.getElementById('chart-memory').layout.xaxis.range")
    assert memory_range == [lo, hi], "both charts show the zoomed range"
    assert note(page) == [f"every step of {first:,}–{last:,} shown"]

    # A double-click goes back to the whole run.
    page.locator("#chart-time").scroll_into_view_if_needed()
    box = page.locator("#chart-time .nsewdrag").bounding_box()
    page.mouse.dblclick(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_function(f"(() => {{ const t = ({STEP_TRACE})(); return t && t.x.at(-1) === {N}; }})()")
    assert page.evaluate(STEP_TRACE) == whole
    tab.assert_local_only(app.url)
    tab.assert_no_errors()
