"""Experiment listing (filters, sorting, paging, ids) and the CSV / JSON exports."""

from __future__ import annotations

import csv
import io

import pytest

from ckptlab.db import queue, store
from ckptlab.summary import PER_STEP_FIELDS, RunSummary
from tests.backend.conftest import add_steps, running_experiment
from tests.factories import make_spec, spec_dict


@pytest.fixture
def mixed(db_session):
    """Six experiments: 3 mlp queued (one sequential), 1 transformer running, 2 finished."""
    ids = {}
    ids["q1"] = store.create_experiment(db_session, spec=make_spec()).id
    ids["q2"] = store.create_experiment(
        db_session, spec=make_spec(**{"checkpoint.strategy": "sequential", "checkpoint.segments": 2})
    ).id
    ids["q3"] = store.create_experiment(db_session, spec=make_spec(batch_size=4)).id
    tf = {"kind": "transformer", "depth": 2, "d_model": 16, "heads": 2, "seq_len": 8, "vocab_size": 50}
    ids["tf"] = store.create_experiment(db_session, spec=make_spec(model=tf), status="running", worker_id="w").id
    done = running_experiment(db_session)
    queue.finish_experiment(
        db_session,
        experiment_id=done.id,
        status="succeeded",
        summary=RunSummary.model_validate({"activation_bytes": 7}),
    )
    ids["ok"] = done.id
    bad = running_experiment(db_session)
    queue.finish_experiment(db_session, experiment_id=bad.id, status="failed", error="=cmd|boom\nline 2")
    ids["bad"] = bad.id
    return ids


def listing(client, **params):
    r = client.get("/api/experiments", params=params)
    assert r.status_code == 200, r.text
    return r.json()


def test_filters(client, mixed):
    assert {e["id"] for e in listing(client, status="queued")["data"]} == {mixed["q1"], mixed["q2"], mixed["q3"]}
    assert [e["id"] for e in listing(client, model_kind="transformer")["data"]] == [mixed["tf"]]
    assert [e["id"] for e in listing(client, strategy="sequential")["data"]] == [mixed["q2"]]
    assert listing(client, status="succeeded", model_kind="transformer")["count"] == 0
    assert [e["status"] for e in listing(client, status="failed")["data"]] == ["failed"]
    assert listing(client, sweep_id=1)["count"] == 0


def test_sorting_and_paging(client, mixed):
    assert [e["id"] for e in listing(client)["data"]] == sorted(mixed.values(), reverse=True)
    assert [e["id"] for e in listing(client, sort="id")["data"]] == sorted(mixed.values())
    statuses = [e["status"] for e in listing(client, sort="status")["data"]]
    assert statuses == sorted(statuses)
    # started_at: queued ones have none and come last in both directions.
    started = listing(client, sort="-started_at")["data"]
    assert [e["started_at"] is None for e in started] == [False] * 3 + [True] * 3
    page = listing(client, sort="id", offset=2, limit=2)
    assert page["count"] == 6 and [e["id"] for e in page["data"]] == sorted(mixed.values())[2:4]


def test_ids_for_comparison_keep_their_order(client, mixed):
    wanted = [mixed["ok"], mixed["q1"], mixed["tf"]]
    body = listing(client, ids=",".join(map(str, wanted)))
    assert [e["id"] for e in body["data"]] == wanted and body["count"] == 3
    assert [e["id"] for e in listing(client, ids=f"{mixed['q1']},99999")["data"]] == [mixed["q1"]]


def test_a_list_without_per_step_lists_is_the_full_list_less_those_keys(client, db_session, mixed):
    timed = [1.5 + i / 10 for i in range(1000)]
    run = running_experiment(db_session)
    summary = {"activation_bytes": 9, "step_time_ms": 2.0, "paired_with": "none", "unit_note": "an extra key"}
    summary.update({name: timed for name in PER_STEP_FIELDS})
    queue.finish_experiment(
        db_session, experiment_id=run.id, status="succeeded", summary=RunSummary.model_validate(summary)
    )
    full_r = client.get("/api/experiments")
    brief_r = client.get("/api/experiments", params={"per_step": "false"})
    assert brief_r.status_code == 200 and brief_r.headers["content-type"] == "application/json"
    full, brief = full_r.json(), brief_r.json()
    assert full["data"][0]["summary"]["step_times_ms"] == timed  # the default keeps them
    for exp in full["data"]:
        for name in PER_STEP_FIELDS:
            (exp["summary"] or {}).pop(name, None)
    assert brief == full and brief["data"][0]["summary"]["unit_note"] == "an extra key"
    # One run's own answer always has them.
    assert client.get(f"/api/experiments/{run.id}").json()["summary"]["paired_baseline_cpu_ms"] == timed


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"sort": "spec"}, "sort"),
        ({"sort": "-password"}, "sort"),
        ({"ids": "1,,2"}, "ids"),
        ({"ids": "1;DROP TABLE experiments"}, "ids"),
        ({"status": "done"}, "status"),
        ({"model_kind": "unet"}, "model_kind"),
        ({"limit": 0}, "limit"),
        ({"offset": -1}, "offset"),
        ({"sweep_id": 2**70}, "sweep_id"),
        ({"per_step": "maybe"}, "per_step"),
    ],
)
def test_bad_query_parameters_get_422(client, params, field):
    r = client.get("/api/experiments", params=params)
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["query", field]


def _csv(r):
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/csv")
    assert r.headers["content-disposition"].startswith("attachment; filename=")
    return list(csv.DictReader(io.StringIO(r.text)))


def test_experiment_export_csv_and_json(client, mixed):
    rows = _csv(client.get("/api/experiments/export", params={"format": "csv", "sort": "id"}))
    assert [int(r["id"]) for r in rows] == sorted(mixed.values())
    by_id = {int(r["id"]): r for r in rows}
    assert by_id[mixed["ok"]]["summary.activation_bytes"] == "7"
    assert by_id[mixed["tf"]]["spec.model.d_model"] == "16" and by_id[mixed["q1"]]["spec.model.d_model"] == ""
    assert by_id[mixed["q2"]]["spec.checkpoint.segments"] == "2"
    # An error that would run as a spreadsheet formula is defused; only its first line is kept.
    assert by_id[mixed["bad"]]["error"] == "'=cmd|boom"
    js = client.get("/api/experiments/export", params={"status": "queued"})
    assert js.status_code == 200 and js.json()["count"] == 3 and len(js.json()["data"]) == 3
    assert client.get("/api/experiments/export", params={"format": "xml"}).status_code == 422


def test_steps_export_csv(client, db_session):
    exp = running_experiment(db_session)
    add_steps(db_session, exp, range(1, 12))
    r = client.get(f"/api/experiments/{exp.id}/steps", params={"format": "csv"})
    rows = _csv(r)
    assert f"experiment-{exp.id}-steps.csv" in r.headers["content-disposition"]
    assert [int(r["step"]) for r in rows] == list(range(1, 12))
    assert list(rows[0]) == ["attempt", "step", *store.STEP_FIELDS, "loss", "loss_nonfinite"]
    assert rows[1]["loss"] == "0.5" and rows[0]["reserved_bytes"] == ""
    assert client.get(f"/api/experiments/{exp.id}/steps").json()["count"] == 11
    assert client.get("/api/experiments/999/steps?format=csv").status_code == 404


def test_nonfinite_loss_is_exported_as_null_with_its_kind(client, db_session):
    exp = running_experiment(db_session)
    store.add_steps(
        db_session,
        experiment_id=exp.id,
        attempt=1,
        records=[{**_plain_step(), "step": 1, "loss": float("nan")}],
    )
    step = client.get(f"/api/experiments/{exp.id}/steps").json()["data"][0]
    assert step["loss"] is None and step["loss_nonfinite"] == "nan"
    row = _csv(client.get(f"/api/experiments/{exp.id}/steps?format=csv"))[0]
    assert row["loss"] == "" and row["loss_nonfinite"] == "nan"


def _plain_step():
    return {
        "forward_ms": 1.0,
        "backward_ms": 1.0,
        "optimizer_ms": 1.0,
        "step_ms": 3.0,
        "allocated_bytes": 1,
        "peak_allocated_bytes": 1,
    }


def test_sweep_id_filter(client):
    body = {"name": "f", "base": spec_dict(), "axes": {"batch_size": [4, 8]}}
    sweep = client.post("/api/sweeps", json=body).json()
    store_ids = {e["id"] for e in sweep["experiments"]}
    client.post("/api/experiments", json=spec_dict())
    got = listing(client, sweep_id=sweep["id"])
    assert {e["id"] for e in got["data"]} == store_ids and all(e["sweep_id"] == sweep["id"] for e in got["data"])
