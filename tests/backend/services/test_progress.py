"""Progress in the API (backend/services/progress.py): a queued run's place in the queue, a
running run's step k of N and ETA, a sweep's ETA (issue 23)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from ckptlab.analysis.progress import PASS_STEP_MS, STEPS_PLANNED
from ckptlab.db import queue, store
from ckptlab.db.models import Experiment
from ckptlab.summary import RunSummary
from tests.backend.conftest import add_steps
from tests.factories import make_spec


def _queued(session: Session) -> Experiment:
    return store.create_experiment(session, spec=make_spec(steps=5, timed_steps=20))


def test_queued_runs_are_numbered_in_the_order_workers_claim_them(client: TestClient, db_session: Session) -> None:
    first, second, third = (_queued(db_session) for _ in range(3))
    positions = [client.get(f"/api/experiments/{e.id}").json()["progress"] for e in (first, second, third)]
    assert [p["queue_position"] for p in positions] == [1, 2, 3]
    assert positions[1]["text"] == "position 2 in the queue"

    claimed = queue.claim_next(db_session, worker_id="test:1")
    assert claimed is not None and claimed.id == first.id
    assert client.get(f"/api/experiments/{third.id}").json()["progress"]["queue_position"] == 2


def test_a_running_run_reports_its_pass_a_fixed_total_and_an_eta_from_its_step_times(
    client: TestClient, db_session: Session
) -> None:
    spec = make_spec(steps=5, timed_steps=20)
    exp = store.create_experiment(db_session, spec=spec, status="running", worker_id="t:1")
    assert client.get(f"/api/experiments/{exp.id}").json()["progress"]["step"] is None  # building the model

    exp.started_at = exp.started_at - timedelta(seconds=10)  # 10 s ago
    db_session.commit()
    add_steps(db_session, exp, [1, 2], extra={"pass": "memory", STEPS_PLANNED: 25, PASS_STEP_MS: 2000.0})
    p = client.get(f"/api/experiments/{exp.id}").json()["progress"]
    assert (p["run_pass"], p["done_steps"], p["total_steps"], p["eta_s"]) == ("memory", 2, 25, None)
    assert p["memory_left_s"] == pytest.approx(6.0)
    assert (
        p["text"]
        == "memory step 2 of 5 (about 6 s left in it), then 20 timed steps: time left estimated once they start"
    )

    # The memory pass stopped after 3 steps: the timed steps say 3 + 20, the total stays 25.
    add_steps(db_session, exp, [3], extra={"pass": "memory", STEPS_PLANNED: 25, PASS_STEP_MS: 2000.0})
    add_steps(db_session, exp, [4, 5], extra={"pass": "timed", STEPS_PLANNED: 23, PASS_STEP_MS: 500.0})
    p = client.get(f"/api/experiments/{exp.id}").json()["progress"]
    assert (p["step"], p["total_steps"], p["done_steps"], p["pass_step"]) == (5, 25, 7, 2)
    assert p["elapsed_s"] == pytest.approx(10, abs=5)
    assert p["eta_s"] == pytest.approx(18 * 0.5)
    assert p["text"] == "timed step 2 of 20, about 9 s left"


def test_a_finished_run_has_no_progress(client: TestClient, db_session: Session) -> None:
    exp = _queued(db_session)
    queue.claim_next(db_session, worker_id="test:1")
    queue.finish_experiment(db_session, experiment_id=exp.id, status="failed", error="x")
    assert client.get(f"/api/experiments/{exp.id}").json()["progress"] is None


def test_a_sweeps_eta_follows_its_first_finished_run(client: TestClient, db_session: Session) -> None:
    body = {"name": "eta", "base": make_spec().model_dump(mode="json"), "axes": {"batch_size": [2, 4, 8]}}
    r = client.post("/api/sweeps", json=body)
    assert r.status_code == 201, r.text
    sweep_id, total = r.json()["id"], r.json()["progress"]["total"]

    first = queue.claim_next(db_session, worker_id="test:1")
    first.started_at = first.started_at - timedelta(seconds=60)
    db_session.commit()
    p = client.get(f"/api/sweeps/{sweep_id}").json()["progress"]
    assert p["eta_s"] is None and p["eta_text"] == "time left: estimated once a run finishes"

    queue.finish_experiment(db_session, experiment_id=first.id, status="succeeded", summary=RunSummary())
    p = client.get(f"/api/sweeps/{sweep_id}").json()["progress"]
    assert p["eta_s"] == pytest.approx(p["elapsed_s"] * (total - 1), rel=0.01)
    assert p["elapsed_s"] == pytest.approx(60, abs=10)
    assert p["eta_text"].startswith("about ")
