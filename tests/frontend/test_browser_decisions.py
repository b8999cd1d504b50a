"""The experiment page never shows a signed overhead for a difference inside the noise:
the same work run twice is "no measurable difference" in the API and on the page (issue 11)."""

from __future__ import annotations

import pytest

from tests.frontend.support import CHROMIUM, RUN_TIMEOUT_MS, _get_json, _request
from tests.support import wait_for

if not CHROMIUM.exists():
    pytest.skip(f"{CHROMIUM} not found: no browser for the frontend test", allow_module_level=True)

from playwright.sync_api import Page, expect  # noqa: E402

pytestmark = pytest.mark.browser


def test_the_same_work_twice_is_no_measurable_difference(app_url: str, page: Page, page_errors: list[str]) -> None:
    # segments=1 checkpoints nothing (checkpoint_sequential runs its last segment plainly): the
    # same work as strategy none. Baseline, run, baseline again, as a sweep orders them, so
    # a drift of the machine during the test widens the interval instead of biasing it.
    spec = {
        "model": {"kind": "mlp", "depth": 8, "width": 128},
        "batch_size": 64,
        "steps": 3,
        "timed_steps": 30,
        "verify_gradients": False,
        "device": "cpu",
    }
    same = {**spec, "checkpoint": {"strategy": "sequential", "segments": 1}}
    ids = []
    for body in (spec, same, spec):
        code, exp = _request(f"{app_url}/api/experiments", body)
        assert code == 201, exp
        ids.append(exp["id"])
    run_id = ids[1]

    def all_done():
        rows = [_get_json(f"{app_url}/api/experiments/{i}")[1] for i in ids]
        return rows if all(r["status"] in ("succeeded", "failed") for r in rows) else None

    rows = wait_for(all_done, timeout=RUN_TIMEOUT_MS / 1000, interval=0.5)
    assert [r["status"] for r in rows] == ["succeeded"] * 3, [r["error"] for r in rows]
    code, cmp = _get_json(f"{app_url}/api/experiments/{run_id}/comparison")
    assert code == 200 and set(cmp["baseline_ids"]) >= {ids[0], ids[2]}
    assert cmp["overhead"]["measurable"] is False, cmp
    assert cmp["overhead_text"].startswith("no measurable difference (95% CI ")

    page.goto(f"{app_url}/#/experiments/{run_id}")
    expect(page.locator("#exp-overhead")).to_have_text("no measurable difference")
    expect(page.locator("#exp-overhead-ci")).to_contain_text("95% CI")
    expect(page.locator("#exp-headline")).to_contain_text("no measurable difference")
    assert not page_errors, page_errors
