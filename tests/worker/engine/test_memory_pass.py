"""The memory pass runs only the steps it needs: it stops once two steps past the warm-up
read the same bytes, and runs every step of a memory that grows (and says why it might)."""

from __future__ import annotations

from ckptlab.analysis.progress import STEPS_PLANNED
from ckptlab.worker.engine.run import run_experiment
from tests.factories import make_spec

FLAT = {"model": {"kind": "mlp", "depth": 32, "width": 512}, "batch_size": 4, "verify_gradients": False}


def _run(**overrides):
    records: list[dict] = []
    summary = run_experiment(make_spec(**overrides), on_step=records.append).dump()
    return summary, records


def test_a_flat_memory_stops_the_memory_pass_and_the_timing_pass_runs_in_full():
    summary, records = _run(**FLAT, steps=100, timed_steps=3, memory_early_stop=True)
    memory = [r for r in records if r["extra"]["pass"] == "memory"]
    assert summary["memory_steps_requested"] == 100
    assert summary["memory_steps_run"] == len(memory) <= 4
    assert [r["step"] for r in records] == list(range(1, len(memory) + 4))
    assert [r["extra"]["pass"] for r in records[len(memory) :]] == ["timed"] * 3
    assert summary["timing"]["step_ms"]["n"] == 3
    # the last two memory steps read the same bytes, which is why the pass stopped
    assert memory[-1]["allocated_bytes"] == memory[-2]["allocated_bytes"]
    assert memory[-1]["extra"]["memory_at_peak"] == memory[-2]["extra"]["memory_at_peak"]
    assert summary["memory_growth_bytes_per_step"] == 0
    assert "memory_grows_per_step" not in {f["code"] for f in summary["findings"]}
    # Progress (issue 23): each step says how many the run records in all, as known then.
    assert {r["extra"][STEPS_PLANNED] for r in memory} == {100 + 3}
    assert {r["extra"][STEPS_PLANNED] for r in records[len(memory) :]} == {len(records)}


def test_without_early_stop_every_memory_step_runs():
    summary, records = _run(**FLAT, steps=6, timed_steps=0, memory_early_stop=False)
    assert summary["memory_steps_run"] == summary["memory_steps_requested"] == len(records) == 6


def test_a_model_that_keeps_each_steps_output_runs_every_step_and_is_a_finding(leaky_model):
    model = {"kind": "custom", "name": leaky_model, "depth": 2}
    summary, records = _run(model=model, steps=8, timed_steps=2, verify_gradients=False, memory_early_stop=True)
    memory = [r for r in records if r["extra"]["pass"] == "memory"]
    assert len(memory) == summary["memory_steps_run"] == 8
    live = [r["allocated_bytes"] for r in memory]
    assert all(b > a for a, b in zip(live, live[1:], strict=False)), live
    assert summary["memory_growth_bytes_per_step"] == 16 * 32 * 4  # one kept (batch 16, 32) float32 output
    found = {f["code"]: f["message"] for f in summary["findings"]}
    assert "appended to a list" in found["memory_grows_per_step"]
    assert f"ckptlab: {found['memory_grows_per_step']}" in summary["warnings"]
