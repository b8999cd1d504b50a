"""Browser tests of sharded runs (spec.distributed): the form's Distributed fieldset (fields
for the chosen kind only, a 422 next to its field), a real FSDP2 run of two CPU ranks from
the form to its "Memory per rank" card, and the card of a stored summary (three ranks,
gradients that differ) beside a run of one process that shows none of it."""

from __future__ import annotations

import json
import re

from playwright.sync_api import expect

from ckptlab.summary import RunSummary
from tests.frontend.support import (
    App,
    Tab,
    _count,
    _get_json,
    assert_charts_clear,
    submit_and_finish,
)

#: The bars of the ranks chart: the x positions of its bar traces, and each trace's length.
BARS_JS = """() => {
  const bars = (document.getElementById('ranks-chart').data || []).filter((t) => t.type === 'bar');
  return {positions: [...new Set(bars.flatMap((t) => t.x))], lengths: bars.map((t) => t.x.length)};
}"""
ANNOTATIONS_JS = "() => (document.getElementById('ranks-chart').layout.annotations || []).map((a) => [a.x, a.text])"


def _preview(page) -> dict:
    return json.loads(page.locator("#request-preview").text_content())


def test_an_fsdp2_run_of_two_ranks_from_the_form_shows_memory_per_rank(app_url: str, tab: Tab) -> None:
    page = tab.page
    page.goto(app_url + "/#/new")
    page.fill("#f-mlp-depth", "4")
    page.fill("#f-mlp-width", "64")
    page.fill("#batch_size", "8")
    page.fill("#steps", "3")
    page.fill("#timed_steps", "2")
    page.select_option("#device", "cpu")
    page.select_option("#checkpoint\\.strategy", "per_block")
    page.select_option("#distributed\\.kind", "fsdp2")
    page.fill("#distributed\\.world_size", "2")
    expect(page.locator("#run-count")).to_contain_text("batch 8 per rank · fsdp2 × 2")
    page.wait_for_function("JSON.parse(document.getElementById('request-preview').textContent).distributed")
    assert _preview(page)["distributed"] == {
        "kind": "fsdp2",
        "world_size": 2,
        "shard_unit": "block",
        "reshard_after_forward": True,
    }
    exp_id = submit_and_finish(page)

    code, exp = _get_json(f"{app_url}/api/experiments/{exp_id}")
    assert code == 200
    s = exp["summary"]
    assert s["world_size"] == 2 and s["global_batch_size"] == 16 and len(s["ranks"]) == 2, s
    worst = s["worst_rank"]
    expect(page.locator("#exp-ranks")).to_be_visible()
    page.wait_for_function("(document.getElementById('ranks-chart').data || []).length > 0")
    bars = page.evaluate(BARS_JS)
    assert bars["positions"] == ["rank 0", "rank 1"], bars
    assert set(bars["lengths"]) == {2}, bars
    assert page.evaluate(ANNOTATIONS_JS) == [[f"rank {worst}", "reported (highest peak)"]]
    note = page.locator("#ranks-note")
    expect(note).to_contain_text("2 ranks (fsdp2)")
    expect(note).to_contain_text("global batch 16 (8 per rank × 2)")
    expect(note).to_contain_text(f"this page reports rank {worst}'s figures")
    expect(page.locator("#ranks-table tbody tr")).to_have_count(2)
    expect(page.locator("#ranks-table tr.reported")).to_have_attribute("data-rank", str(worst))
    assert s["sharded_gradients"]["match"] is True, s["sharded_gradients"]
    grads = page.locator("#sharded-grads")
    expect(grads).to_contain_text("✓ match")
    expect(grads).to_contain_text("gradients match one process on the same global batch (worst relative error")
    expect(grads).to_contain_text(f"{s['sharded_gradients']['params_compared']} parameters)")
    expect(page.locator("#exp-distributed")).to_have_text(
        "fsdp2 · 2 ranks · shard unit block · reshard after forward on · no mixed precision"
    )
    expect(page.locator("#exp-spec")).to_contain_text("8 per rank (16 over 2 ranks)")
    assert_charts_clear(page, ["ranks-chart"], screenshot="sharded")

    # "Copy to form" brings the distributed block back.
    page.click("#exp-copy")
    page.wait_for_url(re.compile(r"#/new"))
    expect(page.locator("#distributed\\.kind")).to_have_value("fsdp2")
    expect(page.locator("#distributed\\.world_size")).to_have_value("2")
    expect(page.locator("#distributed\\.world_size")).to_be_visible()
    tab.assert_local_only(app_url)
    tab.assert_no_errors()


def test_world_size_shows_for_several_ranks_only_and_its_422_lands_next_to_it(app_url: str, tab: Tab) -> None:
    page = tab.page
    before = _count(app_url)
    page.goto(app_url + "/#/new")
    page.click("[data-preset='tiny']")
    world = page.locator("#distributed\\.world_size")
    shard_unit = page.locator("#distributed\\.shard_unit")
    mixed = page.locator("#distributed\\.mixed_precision")
    param_dtype = page.locator("#distributed\\.mixed_precision\\.param_dtype")

    # One process (the default): no rank fields, nothing sent; the hint says batch is per rank.
    expect(page.locator("#distributed\\.kind")).to_have_value("none")
    expect(world).to_be_hidden()
    expect(world).to_be_disabled()
    expect(shard_unit).to_be_hidden()
    expect(page.locator("#distributed-hint")).to_have_text(
        "batch size is per rank; sharded runs run on CPU ranks (gloo) for now"
    )
    assert "distributed" not in _preview(page)

    # DDP: a world size, none of FSDP2's knobs.
    page.select_option("#distributed\\.kind", "ddp")
    expect(world).to_be_visible()
    expect(world).to_be_enabled()
    expect(shard_unit).to_be_hidden()
    expect(mixed).to_be_hidden()
    expect(page.locator("#distributed\\.reshard_after_forward")).to_be_hidden()
    page.wait_for_function("JSON.parse(document.getElementById('request-preview').textContent).distributed")
    assert _preview(page)["distributed"] == {"kind": "ddp", "world_size": 2, "find_unused_parameters": False}
    page.check("#distributed\\.find_unused_parameters")  # the seed pitfall's switch (pytorch#24005)
    page.wait_for_function(
        "JSON.parse(document.getElementById('request-preview').textContent).distributed.find_unused_parameters"
    )
    page.uncheck("#distributed\\.find_unused_parameters")

    # FSDP2: its knobs, and the dtypes once mixed precision is on.
    page.select_option("#distributed\\.kind", "fsdp2")
    expect(shard_unit).to_be_visible()
    expect(page.locator("#distributed\\.find_unused_parameters")).to_be_hidden()
    expect(page.locator("#distributed\\.reshard_after_forward")).to_be_checked()
    expect(param_dtype).to_be_hidden()
    page.select_option("#distributed\\.mixed_precision", "on")
    expect(param_dtype).to_be_visible()
    expect(param_dtype).to_have_value("bf16")
    expect(page.locator("#distributed\\.mixed_precision\\.reduce_dtype")).to_have_value("fp32")
    page.select_option("#distributed\\.shard_unit", "model")
    page.uncheck("#distributed\\.reshard_after_forward")
    page.wait_for_function(
        "JSON.parse(document.getElementById('request-preview').textContent).distributed.reshard_after_forward === false"
    )
    assert _preview(page)["distributed"] == {
        "kind": "fsdp2",
        "world_size": 2,
        "shard_unit": "model",
        "mixed_precision": {"param_dtype": "bf16", "reduce_dtype": "fp32"},
        "reshard_after_forward": False,
    }

    # World size 0: the server's 422 at ["body", "distributed", "world_size"] shows under it.
    world.fill("0")
    page.click("#submit")
    error = page.locator(".field:has(#distributed\\.world_size) .field-error")
    expect(error).to_contain_text("greater than or equal to 1")
    expect(world).to_have_attribute("aria-invalid", "true")
    assert page.locator('[aria-invalid="true"]').count() == 1
    expect(page.locator("#form-error")).to_be_hidden()
    assert "#/experiments/" not in page.url
    assert _count(app_url) == before
    world.fill("2")
    expect(error).to_have_count(0)

    # Back to one process: the fields hide and the spec has no distributed block again.
    page.select_option("#distributed\\.kind", "none")
    expect(world).to_be_hidden()
    expect(mixed).to_be_hidden()
    page.wait_for_function("!JSON.parse(document.getElementById('request-preview').textContent).distributed")
    tab.assert_local_only(app_url)
    tab.assert_no_errors()


def _insert_finished(app: App, spec, summary: dict) -> int:
    """A succeeded experiment with ``summary``, written straight into the app's database."""
    from ckptlab.db import queue, store
    from ckptlab.db.database import make_engine, make_sessionmaker
    from ckptlab.settings import Settings

    engine = make_engine(Settings(data_dir=app.data_dir).resolved_database_url)
    try:
        with make_sessionmaker(engine)() as s:
            exp = store.create_experiment(s, spec=spec, status="running", worker_id="t:1")
            queue.finish_experiment(
                s, experiment_id=exp.id, status="succeeded", summary=RunSummary.model_validate(summary)
            )
            return exp.id
    finally:
        engine.dispose()


def test_a_stored_sharded_summary_shows_its_ranks_and_a_run_of_one_process_none(app: App, tab: Tab) -> None:
    from tests.factories import make_spec

    page = tab.page
    mib = 2**20
    ranks = [
        {
            "rank": r,
            "peak_allocated_bytes": (10 + r) * mib,
            "peak_phase": "backward",
            "activation_bytes": 3 * mib,
            "memory_at_peak": {
                "parameters": 2 * mib,
                "gradients": 2 * mib,
                "activations": 3 * mib,
                "unsharded_parameters": (2 + r) * mib,
                "communication": 1 * mib,
            },
            "memory_at_forward_end": {"parameters": 2 * mib, "activations": 3 * mib},
        }
        for r in range(3)
    ]
    sharded = _insert_finished(
        app,
        make_spec(
            batch_size=8,
            distributed={"kind": "fsdp2", "world_size": 3, "mixed_precision": {"param_dtype": "bf16"}},
        ),
        {
            "activation_bytes": 3 * mib,
            "peak_allocated_bytes": 12 * mib,
            "world_size": 3,
            "global_batch_size": 24,
            "worst_rank": 2,
            "ranks": ranks,
            "sharded_gradients": {
                "match": False,
                "params_compared": 16,
                "worst_param": "blocks.3.linear.weight",
                "worst_rel_error": 0.25,
                "tolerance": 1e-5,
                "loss_diff": 0.0,
            },
        },
    )
    single = _insert_finished(
        app, make_spec(batch_size=8), {"activation_bytes": 3 * mib, "peak_allocated_bytes": 12 * mib}
    )

    page.goto(f"{app.url}/#/experiments/{sharded}")
    expect(page.locator("#exp-ranks")).to_be_visible()
    page.wait_for_function("(document.getElementById('ranks-chart').data || []).length > 0")
    bars = page.evaluate(BARS_JS)
    assert bars["positions"] == ["rank 0", "rank 1", "rank 2"] and set(bars["lengths"]) == {3}, bars
    names = page.evaluate("document.getElementById('ranks-chart').data.map((t) => t.name)")
    assert names == ["parameters", "gradients", "activations", "unsharded parameters", "communication"], names
    assert page.evaluate("document.getElementById('ranks-chart').layout.yaxis.title.text").endswith("(MiB)")
    assert page.evaluate(ANNOTATIONS_JS) == [["rank 2", "reported (highest peak)"]]
    expect(page.locator("#ranks-note")).to_contain_text("global batch 24 (8 per rank × 3)")
    expect(page.locator("#ranks-note")).to_contain_text("this page reports rank 2's figures")
    grads = page.locator("#sharded-grads")
    expect(grads).to_have_class(re.compile(r"\bbad\b"))
    expect(grads).to_contain_text(
        "gradients differ from one process on the same global batch: worst relative error 0.250 > tolerance 1.0e-5"
        " in blocks.3.linear.weight (16 parameters compared); loss identical"
    )
    expect(page.locator("#ranks-table tr.reported")).to_have_attribute("data-rank", "2")
    expect(page.locator("#exp-distributed")).to_have_text(
        "fsdp2 · 3 ranks · shard unit block · reshard after forward on · mixed precision: bf16 params, fp32 reduce"
    )

    # A run of one process: no card, no distributed row, a plain batch.
    page.goto(f"{app.url}/#/experiments/{single}")
    expect(page.locator("#exp-title")).to_contain_text(f"#{single}")
    expect(page.locator("#m-peak")).to_have_text("12.0 MiB")
    expect(page.locator("#exp-ranks")).to_be_hidden()
    expect(page.locator("#exp-distributed")).to_have_count(0)
    expect(page.locator("#exp-spec")).not_to_contain_text("per rank")
    tab.assert_no_errors()


def test_a_sweep_over_world_size_draws_memory_per_rank_and_others_hide_that_chart(app: App, tab: Tab) -> None:
    from tests.factories import spec_dict
    from tests.frontend.seed import MIB, insert_finished_sweep

    def figures(spec) -> tuple[int, int, float, dict]:
        world = spec.distributed.world_size
        act = (8 if spec.checkpoint.strategy == "none" else 2) * MIB
        return 64 * MIB // world + act, act, 100.0, {}

    base = spec_dict(**{"checkpoint.strategy": "per_block"}, distributed={"kind": "fsdp2", "world_size": 2})
    sharded, _ = insert_finished_sweep(app.data_dir, "ranks", base, {"distributed.world_size": [2, 4, 8]}, figures)
    plain, _ = insert_finished_sweep(app.data_dir, "amp", spec_dict(), {"amp": ["off", "bf16"]}, figures)
    page = tab.page
    page.goto(f"{app.url}/#/sweeps/{sharded}")
    page.wait_for_function("(document.getElementById('sweep-chart-ranks').data || []).length === 4")
    traces = page.evaluate(
        "document.getElementById('sweep-chart-ranks').data.map((t) => [t.name, t.x, t.y])"
    )  # drawn in MiB
    assert ["peak per_block", [2, 4, 8], [34, 18, 10]] in traces and ["peak none", [2, 4, 8], [40, 24, 16]] in traces
    expect(page.locator("#sweep-chart-ranks-title")).to_contain_text("Memory per rank against world size")
    assert page.evaluate("document.getElementById('sweep-chart-ranks').layout.yaxis.title.text").endswith("(MiB)")
    page.goto(f"{app.url}/#/sweeps/{plain}")
    page.wait_for_function("(document.getElementById('sweep-chart-pareto').data || []).length > 0")
    expect(page.locator("#sweep-chart-ranks")).to_be_hidden()
    tab.assert_no_errors()
