"""The summary travels typed: the store's edge reads a corrupt column without failing, and
the API publishes a summary whose OpenAPI schema lists its fields with their types."""

from __future__ import annotations

from sqlalchemy import update

from ckptlab.db import queue
from ckptlab.db.models import Experiment
from ckptlab.summary import RunSummary
from tests.factories import spec_dict


def test_the_openapi_schema_of_a_summary_is_an_object_with_typed_properties(client) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    summary_ref = schemas["ExperimentPublic"]["properties"]["summary"]["anyOf"][0]["$ref"]
    summary = schemas[summary_ref.rsplit("/", 1)[1]]
    assert summary["type"] == "object"
    props = summary["properties"]
    assert {"type": "integer"} in props["peak_allocated_bytes"]["anyOf"]
    assert {"type": "number"} in props["step_time_ms"]["anyOf"]
    assert props["findings"]["type"] == "array" and "$ref" in props["findings"]["items"]
    assert "peak_phase" in props and "plan" in props


def test_a_summary_reads_back_with_only_what_the_run_measured(client, db_session) -> None:
    created = client.post("/api/experiments", json=spec_dict()).json()
    queue.claim_next(db_session, worker_id="test:1")
    summary = RunSummary(activation_bytes=7, step_time_ms=1.5)
    queue.finish_experiment(db_session, experiment_id=created["id"], status="succeeded", summary=summary)
    body = client.get(f"/api/experiments/{created['id']}").json()
    assert body["summary"] == {"activation_bytes": 7, "step_time_ms": 1.5}


def test_a_key_of_the_wrong_type_reads_as_its_default_not_a_500(client, db_session) -> None:
    created = client.post("/api/experiments", json=spec_dict()).json()
    queue.claim_next(db_session, worker_id="test:1")
    queue.finish_experiment(
        db_session, experiment_id=created["id"], status="succeeded", summary=RunSummary(activation_bytes=7)
    )
    bad = {"activation_bytes": "lots", "step_time_ms": 2.5}
    db_session.execute(update(Experiment).where(Experiment.id == created["id"]).values(summary=bad))
    db_session.commit()
    row = db_session.get(Experiment, created["id"], populate_existing=True)
    assert row.run_summary.activation_bytes is None and row.run_summary.step_time_ms == 2.5
    r = client.get(f"/api/experiments/{created['id']}")
    assert r.status_code == 200 and r.json()["summary"] == {"step_time_ms": 2.5}
