"""Adding a strategy is one registration: a strategy registered in the table (the
``noop_strategy`` fixture) is in ``/api/meta``, the spec schema, the API's validation and
filters, a sweep's plan and results, and the worker runs it, with no other file
touched. The form's part is in tests/frontend/test_browser_strategy_table.py."""

from __future__ import annotations

from ckptlab.db import queue
from ckptlab.domain import Status
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.worker.engine.run import run_experiment
from tests.factories import spec_dict


def _strategy_enum(schema: dict) -> list[str]:
    return schema["$defs"]["CheckpointSpec"]["properties"]["strategy"]["enum"]


def test_a_registered_strategy_is_in_meta_the_schema_and_the_api(noop_strategy, client):
    meta = client.get("/api/meta").json()
    assert meta["strategies"].index("noop_test") == meta["strategies"].index("sequential") + 1  # by rank
    assert noop_strategy.public() in meta["strategy_table"]
    assert "noop_test" in _strategy_enum(meta["spec_schema"])
    openapi = client.get("/openapi.json").json()
    assert "noop_test" in openapi["components"]["schemas"]["CheckpointSpec"]["properties"]["strategy"]["enum"]
    r = client.post("/api/experiments", json=spec_dict(**{"checkpoint.strategy": "noop_test"}))
    assert r.status_code == 201, r.text
    listed = client.get("/api/experiments", params={"strategy": "noop_test"}).json()
    assert [e["id"] for e in listed["data"]] == [r.json()["id"]]


def test_an_unregistered_strategy_is_a_422_naming_the_field(client):
    r = client.post("/api/experiments", json=spec_dict(**{"checkpoint.strategy": "noop_test"}))
    assert r.status_code == 422
    (error,) = r.json()["detail"]
    assert error["loc"] == ["body", "checkpoint", "strategy"] and "unknown strategy 'noop_test'" in error["msg"]
    assert "noop_test" not in client.get("/api/meta").json()["strategies"]


def test_a_registered_strategy_runs_in_a_sweep_and_the_worker(noop_strategy, client, db_session):
    body = {
        "name": "noop vs sequential",
        "base": spec_dict(**{"checkpoint.segments": 2}),
        "axes": {"checkpoint.strategy": ["noop_test", "sequential"]},
    }
    r = client.post("/api/sweeps", json=body)
    assert r.status_code == 201, r.text
    sweep_id = r.json()["id"]
    while (exp := queue.claim_next(db_session, worker_id="test:1")) is not None:
        summary = run_experiment(ExperimentSpec.model_validate(exp.spec))
        queue.finish_experiment(db_session, experiment_id=exp.id, status=Status.SUCCEEDED, summary=summary)
    rows = client.get(f"/api/sweeps/{sweep_id}/results").json()["data"]
    by_strategy = {row["strategy"]: row for row in rows if row["role"] == "run"}
    assert set(by_strategy) == {"noop_test", "sequential"}
    noop, baseline = by_strategy["noop_test"], next(row for row in rows if row["role"] == "baseline")
    assert noop["status"] == Status.SUCCEEDED and noop["gradients_match"] is True
    # It wraps no block: it keeps what the baseline keeps, and says so.
    assert noop["metrics"]["activation_bytes"] == baseline["metrics"]["activation_bytes"]
    assert "sequential_equals_none" in noop["findings"]
    assert by_strategy["sequential"]["metrics"]["activation_bytes"] < noop["metrics"]["activation_bytes"]
