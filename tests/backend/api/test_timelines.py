"""The memory timeline's routes (issue 34): a real CPU run recorded by the worker's outcome
recorder is served as one step's downsampled timeline (the exact peak kept) and who holds
its peak (summing to it); what cannot be served is a 404 or a 422 naming why, never a 500."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from ckptlab.db import queue, store
from ckptlab.db.database import make_engine, make_sessionmaker
from ckptlab.db.models import MemoryTimeline
from ckptlab.domain import Status
from ckptlab.worker.service.outcome import Job, record_run
from tests.backend.conftest import finish_next
from tests.factories import SHARDED_MODELS, make_spec


@pytest.fixture
def sessions(database_url):
    engine = make_engine(database_url)
    yield make_sessionmaker(engine)
    engine.dispose()


def _recorded_run(sessions, **spec) -> int:
    """An experiment claimed and run by the outcome recorder, as a worker's child does."""
    with sessions() as s:
        exp = store.create_experiment(
            s,
            spec=make_spec(
                model=SHARDED_MODELS["transformer"],
                steps=3,
                verify_gradients=False,
                checkpoint={"strategy": "per_block", "use_reentrant": False},
                **spec,
            ),
        )
        claimed = queue.claim_next(s, worker_id="test:1")
        assert claimed.id == exp.id
        attempt = claimed.attempt
    assert record_run(sessions, Job(experiment_id=exp.id, attempt=attempt)) == Status.SUCCEEDED
    return exp.id


@pytest.fixture
def run_id(sessions) -> int:
    return _recorded_run(sessions)


def test_the_timeline_of_the_peak_step_reaches_the_summarys_peak(client, run_id):
    exp = client.get(f"/api/experiments/{run_id}").json()
    peak = exp["summary"]["peak_allocated_bytes"]
    body = client.get(f"/api/experiments/{run_id}/timeline").json()
    assert body["steps"][0] == 1 and body["step"] == body["peak_step"] and body["step"] in body["steps"]
    assert body["peak_bytes"] == peak == max(body["live_bytes"])
    assert not body["downsampled"] and body["t_index"] == list(range(body["n_events"]))
    stacked = [sum(v[i] for v in body["by_category"].values()) for i in range(len(body["t_index"]))]
    assert stacked == body["live_bytes"]
    n = len(body["t_index"])
    assert all(len(body[k]) == n for k in ("bytes_delta", "module", "op", "saved_for_backward", "checkpoint_region"))
    assert {s["phase"] for s in body["phases"]} == {"forward", "backward", "optimizer"}
    assert body["recomputations"] and {"blocks.0", None} <= set(body["checkpoint_region"])
    assert [k["region"] for k in body["region_keeps"]] == ["blocks.0", "blocks.1"]
    assert all(k["excess_bytes"] == 0 for k in body["region_keeps"])

    few = client.get(f"/api/experiments/{run_id}/timeline", params={"max_points": 10}).json()
    assert few["downsampled"] and len(few["t_index"]) <= 10
    assert few["peak_index"] in few["t_index"] and max(few["live_bytes"]) == peak

    first = client.get(f"/api/experiments/{run_id}/timeline", params={"step": 1}).json()
    assert first["step"] == 1 and first["n_events"] > 0


def test_who_holds_the_peak_sums_to_it(client, run_id):
    peak = client.get(f"/api/experiments/{run_id}").json()["summary"]["peak_allocated_bytes"]
    body = client.get(f"/api/experiments/{run_id}/peak-holders").json()
    assert body["peak_bytes"] == peak
    assert sum(h["bytes"] for h in body["holders"]) + body["others_bytes"] == peak
    assert sum(body["by_category"].values()) == peak
    assert body["named_bytes"] + body["unknown_bytes"] == peak and body["named_bytes"] >= 0.95 * peak
    sizes = [h["bytes"] for h in body["holders"]]
    assert sizes == sorted(sizes, reverse=True) and body["holders"][0]["ops"]
    top = client.get(f"/api/experiments/{run_id}/peak-holders", params={"top": 1}).json()
    assert len(top["holders"]) == 1 and top["others_groups"] == body["groups"] - 1
    assert top["holders"][0]["bytes"] + top["others_bytes"] == peak


def _detail(response) -> str:
    detail = response.json()["detail"]
    return detail if isinstance(detail, str) else " ".join(f"{e['loc']} {e['msg']}" for e in detail)


def assert_refused(client, cases: list[tuple[str, int, str]]) -> None:
    """Each ``(url, status, words)``: GET ``url`` answers ``status`` with ``words`` in its detail."""
    for url, code, words in cases:
        r = client.get(url)
        assert r.status_code == code, (url, r.status_code, r.text)
        assert words in _detail(r), (url, r.text)


def test_bad_input_is_a_404_or_422_naming_why(client, run_id, sessions):
    base = f"/api/experiments/{run_id}"
    steps = client.get(f"{base}/timeline").json()["steps"]
    missing = next(k for k in (1, 2, 3) if k not in steps)
    cases = [
        (f"{base}/timeline?step=99", 422, "beyond the run"),
        (f"{base}/peak-holders?step=99", 422, "beyond the run"),
        (f"{base}/timeline?step={missing}", 404, "has no memory timeline"),
        (f"{base}/timeline?step=0", 422, "step"),
        (f"{base}/timeline?step=abc", 422, "step"),
        (f"{base}/timeline?step={2**31}", 422, "step"),
        (f"{base}/timeline?max_points=9", 422, "max_points"),
        (f"{base}/timeline?max_points=100001", 422, "max_points"),
        (f"{base}/timeline?max_points=1e3", 422, "max_points"),
        (f"{base}/peak-holders?top=0", 422, "top"),
        (f"{base}/peak-holders?top=1001", 422, "top"),
        ("/api/experiments/999999/timeline", 404, "not found"),
        ("/api/experiments/999999/peak-holders", 404, "not found"),
        ("/api/experiments/0/timeline", 422, "experiment_id"),
    ]
    assert_refused(client, cases)


def test_runs_without_a_timeline_say_why(client, sessions):
    with sessions() as s:
        failed = store.create_experiment(s, spec=make_spec()).id
        assert queue.claim_next(s, worker_id="test:1").id == failed
        queue.finish_experiment(s, experiment_id=failed, status=Status.FAILED, error="RuntimeError: boom")
        older = store.create_experiment(s, spec=make_spec()).id
        finish_next(s, older, {"peak_allocated_bytes": 1000, "memory_source": "cuda allocator"})
        queued = store.create_experiment(s, spec=make_spec()).id
    for exp_id, words in (
        (queued, "is queued: only a run that succeeded"),
        (failed, "is failed: only a run that succeeded"),
        (older, "has no memory timeline: runs the live-tensor tracker can follow"),
    ):
        for route in ("timeline", "peak-holders"):
            r = client.get(f"/api/experiments/{exp_id}/{route}")
            assert r.status_code == 404 and words in r.json()["detail"], (exp_id, route, r.text)
    assert "cuda allocator" in client.get(f"/api/experiments/{older}/timeline").json()["detail"]


def test_a_stored_timeline_that_does_not_read_back_is_a_404(client, run_id, sessions):
    with sessions() as s:
        s.execute(update(MemoryTimeline).where(MemoryTimeline.experiment_id == run_id).values(data=b"CKTL\x01junk"))
        s.commit()
    for route in ("timeline", "peak-holders"):
        r = client.get(f"/api/experiments/{run_id}/{route}")
        assert r.status_code == 404 and "does not read back" in r.json()["detail"], r.text
