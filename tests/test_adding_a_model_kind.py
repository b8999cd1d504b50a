"""Adding a model kind is one registration: a kind registered in the model-kind table (the
``noop_model_kind`` fixture: ``depth`` linear blocks of ``features`` features, built by
``tests.conftest:build_noop_model``) is in ``/api/meta``, the spec schema and OpenAPI, the
API's validation and limits, a sweep's axes, and the worker builds and runs it, with no
other file touched. The form's part is in tests/frontend/test_browser_model_kind_table.py."""

from __future__ import annotations

from ckptlab.db import queue
from ckptlab.domain import Status
from ckptlab.settings import Settings
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.spec.limits import estimate_param_count, limit_errors
from ckptlab.worker.engine.run import run_experiment
from ckptlab.worker.models.build import build_model
from tests.factories import spec_dict

NOOP = {"kind": "noop_kind", "depth": 4, "features": 8}


def _model_schema(schema: dict) -> dict:
    return schema["properties"]["model"]


def test_a_registered_kind_is_in_meta_the_schema_and_openapi(noop_model_kind, client):
    meta = client.get("/api/meta").json()
    assert meta["model_kinds"].index("noop_kind") == meta["model_kinds"].index("mlp") + 1  # by rank
    assert noop_model_kind.public() in meta["model_kind_table"]
    entry = next(k for k in meta["model_kind_table"] if k["name"] == "noop_kind")
    assert entry["fields"]["features"] | {"description": None} == {
        "type": "int",
        "title": "Features",
        "required": False,
        "nullable": False,
        "default": 8,
        "minimum": 1,
        "maximum": 64,
        "description": None,
    }
    assert entry["example"] == {"depth": 3, "features": 16} and entry["parameter_limit_checked"] is True
    schema = meta["spec_schema"]
    assert _model_schema(schema)["discriminator"]["mapping"]["noop_kind"] == "#/$defs/NoopModelSpec"
    assert schema["$defs"]["NoopModelSpec"]["properties"]["features"]["maximum"] == 64
    components = client.get("/openapi.json").json()["components"]["schemas"]
    # Every request schema with a model (ExperimentCreate, PlanCreate, ...) offers the kind.
    models = [
        s["properties"]["model"] for s in components.values() if "oneOf" in s.get("properties", {}).get("model", {})
    ]
    assert models and all({"$ref": "#/components/schemas/NoopModelSpec"} in m["oneOf"] for m in models)
    assert "features" in components["NoopModelSpec"]["properties"]


def test_a_registered_kind_is_accepted_checked_and_labelled_by_the_api(noop_model_kind, client):
    r = client.post("/api/experiments", json=spec_dict(model=NOOP))
    assert r.status_code == 201, r.text
    stored = client.get(f"/api/experiments/{r.json()['id']}").json()
    assert stored["spec"]["model"] == NOOP
    listed = client.get("/api/experiments").json()["data"]
    assert [e["spec"]["model"]["kind"] for e in listed] == ["noop_kind"]
    # A bad field of the kind: a 422 located at the field (what the form marks).
    r = client.post("/api/experiments", json=spec_dict(model={**NOOP, "features": 65}))
    assert r.status_code == 422
    assert [e["loc"] for e in r.json()["detail"]] == [["body", "model", "features"]]
    # Its parameter counter feeds the server's limits.
    spec = ExperimentSpec.model_validate(spec_dict(model=NOOP))
    assert estimate_param_count(spec) == 4 * (8 * 8 + 8)
    (error,) = limit_errors(spec, Settings(max_param_count=100))
    assert error["loc"] == ["body", "model"] and "288 parameters" in error["msg"]
    assert noop_model_kind.label_for(NOOP) == "noop_kind 4×8"


def test_an_unregistered_kind_is_a_422_naming_model_kind(client):
    r = client.post("/api/experiments", json=spec_dict(model=NOOP))
    assert r.status_code == 422
    (error,) = r.json()["detail"]
    assert error["loc"] == ["body", "model", "kind"] and "unknown model kind 'noop_kind'" in error["msg"]
    assert "expected one of mlp" in error["msg"]
    meta = client.get("/api/meta").json()
    assert "noop_kind" not in meta["model_kinds"]
    assert "noop_kind" not in _model_schema(meta["spec_schema"])["discriminator"]["mapping"]


def test_a_registered_kind_runs_in_the_worker(noop_model_kind):
    spec = ExperimentSpec.model_validate(
        spec_dict(model=NOOP, **{"checkpoint.strategy": "sequential", "checkpoint.segments": 2})
    )
    built = build_model(spec.model)
    assert sum(p.numel() for p in built.module.parameters()) == estimate_param_count(spec)
    summary = run_experiment(spec)
    assert summary.gradients_match is True
    assert summary.memory_at_forward_end["parameters"] == 4 * estimate_param_count(spec)  # fp32 bytes


def test_a_registered_kind_sweeps_over_its_fields(noop_model_kind, client, db_session):
    body = {
        "name": "noop features",
        "base": spec_dict(model=NOOP, **{"checkpoint.segments": 2}),
        "axes": {"model.features": [4, 8], "checkpoint.strategy": ["sequential"]},
    }
    r = client.post("/api/sweeps", json=body)
    assert r.status_code == 201, r.text
    sweep_id = r.json()["id"]
    while (exp := queue.claim_next(db_session, worker_id="test:1")) is not None:
        summary = run_experiment(ExperimentSpec.model_validate(exp.spec))
        queue.finish_experiment(db_session, experiment_id=exp.id, status=Status.SUCCEEDED, summary=summary)
    rows = client.get(f"/api/sweeps/{sweep_id}/results").json()["data"]
    runs = [row for row in rows if row["role"] == "run"]
    assert sorted(row["values"]["model.features"] for row in runs) == [4, 8]
    assert all(row["status"] == Status.SUCCEEDED and row["gradients_match"] is True for row in runs)


def test_the_experiments_list_filters_on_a_registered_kind(noop_model_kind, client):
    created = client.post("/api/experiments", json=spec_dict(model=NOOP)).json()["id"]
    client.post("/api/experiments", json=spec_dict())
    r = client.get("/api/experiments", params={"model_kind": "noop_kind"})
    assert r.status_code == 200, r.text
    assert [e["id"] for e in r.json()["data"]] == [created]
    assert client.get("/api/experiments", params={"model_kind": "cnn"}).status_code == 422
