"""A prediction's memory timeline in the API (issue 34, item 4): stored with the prediction
(by the prediction process's answer line, or ``ckptlab.predict`` in-process), served by
``GET /api/predictions/{id}/timeline`` in the shape of a run's, and offered beside the run of
the same spec (``GET /api/experiments/{id}/predictions``); what cannot be served is a 404 or
a 422 naming why, never a 500."""

from __future__ import annotations

import base64

import pytest

from ckptlab.backend.services.predictions.child import ChildRun, outcomes
from ckptlab.db import store
from ckptlab.db.database import make_engine, make_sessionmaker
from ckptlab.domain import Status
from ckptlab.prediction.targets import CPU_TARGET, TARGETS
from ckptlab.summary import RunSummary
from ckptlab.worker.predict_api import predict_and_store
from tests.backend.api.test_timelines import _recorded_run, assert_refused
from tests.factories import make_spec


@pytest.fixture
def sessions(database_url):
    engine = make_engine(database_url)
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.fixture
def run_and_prediction(sessions, database_url) -> tuple[int, int]:
    """A recorded CPU run, and a prediction for ``cpu`` of its spec made in-process."""
    run_id = _recorded_run(sessions)
    with sessions() as s:
        spec = store.get_experiment(s, experiment_id=run_id).experiment_spec
    predicted = predict_and_store(spec, CPU_TARGET, database_url=database_url)
    assert predicted.status == Status.SUCCEEDED, predicted.error
    return run_id, predicted.id


def test_a_predictions_timeline_is_served_as_a_runs(client, run_and_prediction):
    run_id, prediction_id = run_and_prediction
    predicted = client.get(f"/api/predictions/{prediction_id}").json()["summary"]["peak_allocated_bytes"]
    body = client.get(f"/api/predictions/{prediction_id}/timeline").json()
    assert (body["prediction_id"], body["target"], body["experiment_id"], body["attempt"]) == (
        prediction_id,
        "cpu",
        None,
        None,
    )
    assert body["peak_bytes"] == max(body["live_bytes"]) == predicted  # on cpu: to the byte
    assert body["steps"][0] == 1 and body["step"] == body["peak_step"]
    run = client.get(f"/api/experiments/{run_id}/timeline").json()
    assert run["peak_bytes"] == body["peak_bytes"] and run["n_events"] == body["n_events"]
    assert set(run) == set(body), "the same shape as a run's"
    assert body["module"] == run["module"] and body["phases"] == run["phases"]

    few = client.get(f"/api/predictions/{prediction_id}/timeline", params={"max_points": 10}).json()
    assert few["downsampled"] and len(few["t_index"]) <= 10 and max(few["live_bytes"]) == predicted
    first = client.get(f"/api/predictions/{prediction_id}/timeline", params={"step": 1}).json()
    assert first["step"] == 1 and first["n_events"] > 0


def test_the_run_offers_the_predictions_of_its_spec(client, sessions, run_and_prediction, database_url):
    run_id, prediction_id = run_and_prediction
    with sessions() as s:
        spec = store.get_experiment(s, experiment_id=run_id).experiment_spec
        # what a prediction does not read differs: still the run's spec
        elsewhere = spec.model_copy(update={"device": "cuda", "timed_steps": 0, "verify_gradients": True})
        other = spec.model_copy(update={"batch_size": spec.batch_size + 1})  # another spec
        no_timeline = store.create_prediction(
            s, spec=spec, target="cpu", status=Status.SUCCEEDED, summary=RunSummary(peak_allocated_bytes=1)
        ).id
    same = predict_and_store(elsewhere, CPU_TARGET, database_url=database_url).id
    different = predict_and_store(other, CPU_TARGET, database_url=database_url).id
    listed = client.get(f"/api/experiments/{run_id}/predictions").json()
    ids = [p["id"] for p in listed["data"]]
    assert ids == [same, prediction_id] and listed["count"] == 2
    assert different not in ids and no_timeline not in ids
    r = client.get("/api/experiments/999999/predictions")
    assert r.status_code == 404 and "not found" in r.json()["detail"]


def test_bad_input_is_a_404_or_422_naming_why(client, sessions, run_and_prediction):
    _run_id, prediction_id = run_and_prediction
    with sessions() as s:
        bare = store.create_prediction(s, spec=make_spec(), target="cpu", status=Status.SUCCEEDED).id
        failed = store.create_prediction(s, spec=make_spec(), target="cpu", status=Status.FAILED, error="no kernel").id
    base = f"/api/predictions/{prediction_id}/timeline"
    steps = client.get(base).json()["steps"]
    missing = next(k for k in (1, 2, 3) if k not in steps)
    cases = [
        (base + "?max_points=9", 422, "max_points"),
        (base + "?max_points=100001", 422, "max_points"),
        (base + "?step=0", 422, "step"),
        (base + "?step=99", 422, "beyond the prediction"),
        (base + f"?step={missing}", 404, "has no memory timeline"),
        (f"/api/predictions/{bare}/timeline", 404, f"prediction {bare} has no memory timeline"),
        (f"/api/predictions/{failed}/timeline", 404, "is failed: only a prediction that succeeded"),
        ("/api/predictions/999999/timeline", 404, "prediction 999999 not found"),
        ("/api/predictions/0/timeline", 422, "prediction_id"),
    ]
    assert_refused(client, cases)


def _child_said(*answers: dict) -> ChildRun:
    import json

    return ChildRun([(0.1, json.dumps(a).encode() + b"\n") for a in answers], 0, "", False, False, 0.2)


def test_an_answer_with_malformed_timelines_is_stored_without_them():
    summary = {"peak_allocated_bytes": 10}
    good = {
        "step": 1,
        "is_peak": True,
        "n_events": 3,
        "baseline_bytes": 0,
        "peak_bytes": 10,
        "peak_index": 1,
        "data": base64.b64encode(b"CKTL\x01whatever").decode(),
    }
    bad_rows = [
        [{**good, "data": "not base64!"}],
        [{**good, "data": base64.b64encode(b"JUNK").decode()}],
        [{**good, "peak_bytes": -1}],
        [{**good, "is_peak": "yes"}],
        [good, good],  # one step twice
        "not a list",
    ]
    for rows in bad_rows:
        (o,) = outcomes(
            _child_said({"target": "cpu", "status": "succeeded", "summary": summary, "timelines": rows}),
            ["cpu"],
            timeout_s=5,
            memory_bytes=2**30,
        )
        assert o.status == Status.SUCCEEDED and o.timelines == (), rows
    (o,) = outcomes(
        _child_said({"target": "cpu", "status": "succeeded", "summary": summary, "timelines": [good]}),
        ["cpu"],
        timeout_s=5,
        memory_bytes=2**30,
    )
    assert o.timelines[0]["data"] == b"CKTL\x01whatever" and o.timelines[0]["peak_bytes"] == 10


@pytest.mark.slow
def test_the_prediction_process_stores_its_timelines_cpu_and_cuda(client, run_and_prediction):
    run_id, _ = run_and_prediction
    spec = client.get(f"/api/experiments/{run_id}").json()["spec"]
    body = client.post("/api/predictions/batch", json={"spec": spec, "targets": ["cpu", "h100-80gb"]})
    assert body.status_code == 201, body.text
    cpu, h100 = body.json()["data"]
    assert (cpu["status"], h100["status"]) == ("succeeded", "succeeded"), (cpu["error"], h100["error"])
    tl_cpu = client.get(f"/api/predictions/{cpu['id']}/timeline").json()
    assert tl_cpu["peak_bytes"] == cpu["summary"]["peak_allocated_bytes"]
    tl_h100 = client.get(f"/api/predictions/{h100['id']}/timeline").json()
    workspaces = TARGETS["h100-80gb"].cublas_workspaces_bytes
    assert (
        tl_h100["target"] == "h100-80gb"
        and tl_h100["peak_bytes"] + workspaces == h100["summary"]["peak_allocated_bytes"]
    )
    listed = [p["id"] for p in client.get(f"/api/experiments/{run_id}/predictions").json()["data"]]
    assert {cpu["id"], h100["id"]} <= set(listed)
