""" "Run the baseline" is offered only where the server would queue that baseline (issue 32,
item 3): a run ``ckptlab.profile`` stored names its model by a class the server never
imports, so its page offers no button and says how to profile the baseline instead; a run
of a built-in model still offers it."""

from __future__ import annotations

from playwright.sync_api import expect

from tests.frontend.seed import MIB, app_session, insert_profile_run
from tests.frontend.support import App, Tab


def _insert_built_in_run(app: App) -> int:
    """A succeeded sequential run of a small MLP no other test runs (so it has no baseline)."""
    from ckptlab.db import store
    from ckptlab.spec.experiment import ExperimentSpec
    from tests.factories import spec_dict

    spec = ExperimentSpec.model_validate(
        spec_dict(model={"kind": "mlp", "depth": 3, "width": 24}, batch_size=6, **{"checkpoint.strategy": "sequential"})
    )
    with app_session(app.data_dir) as session:
        exp = store.create_experiment(session, spec=spec, status="succeeded", worker_id="test")
        exp.summary = {"peak_allocated_bytes": 2 * MIB, "activation_bytes": MIB, "step_time_ms": 3.5}
        session.commit()
        return exp.id


def test_a_profiled_run_says_how_to_run_its_baseline_and_a_built_in_run_offers_the_button(app: App, tab: Tab) -> None:
    page = tab.page
    page.goto(f"{app.url}/#/experiments/{insert_profile_run(app.data_dir)}")
    refused = page.locator("#exp-baseline-refused")
    expect(refused).to_contain_text("this run was profiled in your own process")
    expect(refused).to_contain_text('ckptlab.profile(model, sample, strategy="none")')
    expect(page.locator("#exp-run-baseline")).to_have_count(0)

    page.goto(f"{app.url}/#/experiments/{_insert_built_in_run(app)}")
    expect(page.locator("#exp-run-baseline")).to_be_visible()
    expect(page.locator("#exp-run-baseline")).to_have_text("Run the baseline")
    expect(page.locator("#exp-baseline-refused")).to_have_count(0)
    tab.assert_no_errors()
