"""A failed run's public ``error`` is one sentence (issue 33, item 6): no traceback frame,
no file path, in the detail, the exports, a sweep's rows and the live stream; the traceback
is the run's log, ``GET /api/experiments/{id}/log``, behind the API token when one is set."""

from __future__ import annotations

import csv
import io
import re

import pytest

from ckptlab.db import store
from ckptlab.db.database import make_sessionmaker
from ckptlab.worker.errors import RunError
from ckptlab.worker.service.outcome import Job, record_run
from tests.backend.conftest import parse_sse
from tests.factories import make_spec

#: A traceback frame, or an absolute path of two parts or more.
LEAKS = re.compile(r'File "|(?<![\w.:/])/[^\s/]+/')


def _fail_in_torch(spec, **_kwargs):
    """What the engine raises when the model fails inside torch: a RunError from the error."""
    import torch

    try:
        torch.nn.Linear(3, 4)(torch.zeros(2, 5))
    except RuntimeError as exc:
        raise RunError(f"{type(exc).__name__}: {exc}") from exc


@pytest.fixture
def failed_run(db_session, monkeypatch) -> int:
    """An experiment whose run failed inside torch, recorded by the worker's outcome recorder."""
    exp = store.create_experiment(db_session, spec=make_spec(), status="running", worker_id="t:1")
    monkeypatch.setattr("ckptlab.worker.engine.run.run_experiment", _fail_in_torch)
    status = record_run(
        make_sessionmaker(db_session.get_bind()), Job(experiment_id=exp.id, attempt=1, spec=make_spec())
    )
    assert status == "failed"
    return exp.id


def test_the_public_error_is_one_sentence_and_the_traceback_is_the_log(client, failed_run):
    error = client.get(f"/api/experiments/{failed_run}").json()["error"]
    assert error.startswith("RunError: RuntimeError: mat1 and mat2 shapes cannot be multiplied"), error
    assert "\n" not in error and not LEAKS.search(error), error
    exported = client.get("/api/experiments/export").json()["data"]
    assert [e["error"] for e in exported] == [error]
    (row,) = csv.DictReader(io.StringIO(client.get("/api/experiments/export?format=csv").text))
    assert row["error"] == error
    events = parse_sse(client.get(f"/api/experiments/{failed_run}/events").text)
    assert [e.data["error"] for e in events if e.event == "status"] == [error]

    log = client.get(f"/api/experiments/{failed_run}/log")
    assert log.status_code == 200 and log.headers["content-type"] == "application/json"
    body = log.json()
    assert (body["experiment_id"], body["attempt"], body["status"], body["error"]) == (failed_run, 1, "failed", error)
    assert body["log"].startswith("Traceback (most recent call last):")
    assert 'File "' in body["log"] and "linear.py" in body["log"]  # the frames, in torch too
    assert "The above exception was the direct cause" in body["log"] and body["log"].rstrip().endswith(error)


def test_the_log_needs_the_token_when_one_is_set(make_client, failed_run):
    c = make_client(api_token="s3cret")
    path = f"/api/experiments/{failed_run}/log"
    r = c.get(path)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert c.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert c.get(path, headers={"Authorization": "Bearer s3cret"}).json()["log"].startswith("Traceback")
    assert c.get(f"/api/experiments/{failed_run}").status_code == 200  # other reads stay open
    doc = c.get("/openapi.json").json()["paths"]
    assert doc["/api/experiments/{experiment_id}/log"]["get"]["security"] == [{"HTTPBearer": []}]
    assert "401" in doc["/api/experiments/{experiment_id}/log"]["get"]["responses"]
    assert "security" not in doc["/api/experiments/{experiment_id}"]["get"]


def test_without_a_token_the_log_is_open_and_a_run_without_one_reads_null(client, db_session):
    exp = store.create_experiment(db_session, spec=make_spec())
    body = client.get(f"/api/experiments/{exp.id}/log").json()
    assert (body["status"], body["error"], body["log"]) == ("queued", None, None)
    assert client.get("/api/experiments/999/log").status_code == 404
    assert "security" not in client.get("/openapi.json").json()["paths"]["/api/experiments/{experiment_id}/log"]["get"]
