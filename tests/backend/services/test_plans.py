"""``/api/plans``: a plan for a memory budget is queued as one sweep (auto beside none,
per_block and uniform sequential splits), and its verdict names what fits, at what cost."""

from __future__ import annotations

import pytest

from ckptlab.db import queue
from ckptlab.domain import Status
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.worker.engine.run import run_experiment
from tests.factories import spec_dict

BASE = spec_dict(**{"model.depth": 8, "model.width": 128, "batch_size": 256, "timed_steps": 3})


def run_all(session) -> None:
    """What a worker would do: run every queued experiment and record its summary."""
    while (exp := queue.claim_next(session, worker_id="test:1")) is not None:
        summary = run_experiment(ExperimentSpec.model_validate(exp.spec))
        queue.finish_experiment(session, experiment_id=exp.id, status=Status.SUCCEEDED, summary=summary)


def test_a_plan_queues_auto_beside_the_comparison_points_and_answers_its_verdict(client, db_session):
    none_peak = run_experiment(ExperimentSpec.model_validate(BASE)).dump()["peak_allocated_bytes"]
    budget = none_peak * 95 // 100
    # torch.compile's points are left out here (tests/worker/engine/test_compile_budget.py runs them)
    r = client.post("/api/plans", json={"base": BASE, "budget": budget, "compile_budgets": []})
    assert r.status_code == 201, r.text
    plan = r.json()
    assert plan["budget_bytes"] == budget and not plan["finished"]
    labels = {p["label"] for p in plan["points"]}
    assert labels == {
        "strategy=none",
        "strategy=auto",
        "strategy=per_block",
        "strategy=sequential segments=2",
        "strategy=sequential segments=4",
        "strategy=sequential segments=8",
    }
    assert client.get(f"/api/sweeps/{plan['sweep_id']}").status_code == 200  # a plan is a sweep
    run_all(db_session)

    verdict = client.get(f"/api/plans/{plan['sweep_id']}").json()
    assert verdict["finished"]
    points = {p["label"]: p for p in verdict["points"]}
    auto = points["strategy=auto"]
    assert auto["fits"] is True and auto["peak_allocated_bytes"] <= budget
    assert auto["peak_allocated_bytes"] <= auto["predicted_peak_bytes"]
    assert points["strategy=none"]["fits"] is False  # the budget is under the un-checkpointed peak
    for p in verdict["points"]:
        assert p["fits"] == (p["peak_allocated_bytes"] <= budget)
    assert any(p["on_front"] for p in verdict["points"])
    assert verdict["plan"]["checkpointed_blocks"]
    pick = verdict["recommendation"]["experiment_id"]
    assert pick is not None and next(p for p in verdict["points"] if p["experiment_id"] == pick)["fits"]
    same = client.get(f"/api/sweeps/{plan['sweep_id']}/recommendation", params={"budget_bytes": budget}).json()
    assert same["experiment_id"] == pick  # one recommender


def test_a_plan_compares_torch_compile_at_three_of_its_own_budgets_by_default(client):
    plan = client.post("/api/plans", json={"base": BASE, "budget": "1 MiB"}).json()
    compiled = sorted(p["label"] for p in plan["points"] if p["strategy"] == "compile_budget")
    assert compiled == [
        "strategy=compile_budget budget=0.1",
        "strategy=compile_budget budget=0.5",
        "strategy=compile_budget budget=1.0",
    ]
    # ... and each of the others once, whatever the compile budget axis says
    assert sum(p["strategy"] == "per_block" for p in plan["points"]) == 1


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"base": BASE, "budget": "lots"}, ["body", "budget"]),
        ({"base": BASE, "budget": 0}, ["body", "budget"]),
        ({"base": BASE, "budget": "1 GiB", "compile_budgets": [2.0]}, ["body", "compile_budgets", 0]),
        ({"base": {**BASE, "batch_size": 0}, "budget": "1 GiB"}, ["body", "base", "batch_size"]),
    ],
)
def test_a_bad_plan_request_is_a_422_naming_the_field(client, body, loc):
    r = client.post("/api/plans", json=body)
    assert r.status_code == 422, r.text
    assert loc in [e["loc"] for e in r.json()["detail"]]
    assert client.get("/api/sweeps").json()["count"] == 0


def test_a_budget_with_a_unit_is_read_as_bytes(client):
    r = client.post("/api/plans", json={"base": BASE, "budget": "24 GiB"})
    assert r.status_code == 201 and r.json()["budget_bytes"] == 24 * 2**30


def test_a_sweep_without_an_auto_run_is_not_a_plan(client):
    sweep = client.post(
        "/api/sweeps", json={"name": "plain", "base": BASE, "axes": {"checkpoint.segments": [2]}}
    ).json()
    assert client.get(f"/api/plans/{sweep['id']}").status_code == 404
    assert client.get("/api/plans/999").status_code == 404
