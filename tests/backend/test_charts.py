"""Sweep charts from stored summaries: the segment law, overhead against the baseline, the
Pareto frontier, gradient differences; robust to missing summary keys."""

from __future__ import annotations

import pytest

from backend.services.charts import pareto_frontier
from ckptlab.db import queue
from tests.factories import spec_dict


def test_pareto_frontier():
    pts = [(1, 10), (2, 5), (3, 7), (4, 1), (2, 6), (5, 1)]
    assert pareto_frontier(pts) == [0, 1, 3]
    assert pareto_frontier([]) == []


def _finish(session, exp_id, summary, status="succeeded"):
    exp = queue.claim_next(session, worker_id="test:1")
    assert exp.id == exp_id
    queue.finish_experiment(session, experiment_id=exp_id, status=status, summary=summary)


@pytest.fixture
def synthetic(client, db_session):
    """A sweep over segments 2 and 4 finished by hand with chosen summaries."""
    body = {
        "name": "synthetic",
        "base": spec_dict(**{"checkpoint.strategy": "sequential"}),
        "axes": {"checkpoint.segments": [2, 4, 8]},
    }
    sweep = client.post("/api/sweeps", json=body).json()
    # The baseline's second run (queued last) stays queued: charts use what has finished.
    by = {e["values"]["checkpoint.segments"]: e["id"] for e in sweep["experiments"] if e["repeat_of"] is None}
    _finish(db_session, by[None], {"activation_bytes": 8000, "peak_allocated_bytes": 20000, "step_time_ms": 10.0})
    _finish(
        db_session,
        by[2],
        {
            "activation_bytes": 5200,
            "peak_allocated_bytes": 17000,
            "step_time_ms": 12.0,
            "grad_max_abs_diff": 0.0,
            "gradients_match": True,
        },
    )
    _finish(
        db_session,
        by[4],
        {"activation_bytes": 5100, "peak_allocated_bytes": 16000, "step_time_ms": 13.0, "grad_max_abs_diff": None},
    )
    _finish(db_session, by[8], {"device": "cpu"})  # an engine that reported nothing useful
    return sweep["id"], by


def traces(client, sid, name):
    r = client.get(f"/api/sweeps/{sid}/charts/{name}")
    assert r.status_code == 200, r.text
    return {t["name"]: t for t in r.json()["data"]}


def test_memory_chart_overlays_the_segment_law(client, synthetic):
    sid, _ = synthetic
    t = traces(client, sid, "memory_vs_segments")
    assert set(t) == {"activation", "peak", "segment law"}
    assert t["activation"]["x"] == [2, 4, 8] and t["activation"]["y"] == [5200, 5100, None]
    assert t["peak"]["y"] == [17000, 16000, None]
    # a = b = 8000 / 8 = 1000: retained(N) = (N-1)*1000 + last*1000
    assert t["segment law"]["x"] == list(range(1, 9))
    assert t["segment law"]["y"] == [8000, 5000, 6000, 5000, 8000, 8000, 8000, 8000]


def test_time_pareto_and_correctness_charts(client, synthetic):
    sid, by = synthetic
    overhead = traces(client, sid, "time_vs_segments")["overhead"]
    assert overhead["x"] == [2, 4, 8] and overhead["y"][:2] == pytest.approx([20.0, 30.0])
    assert overhead["y"][2] is None
    pareto = traces(client, sid, "pareto")
    assert pareto["baseline"]["x"] == [10.0] and sorted(pareto["runs"]["x"]) == [12.0, 13.0]
    assert pareto["pareto frontier"]["x"] == [10.0, 12.0, 13.0]  # each is faster or smaller
    bars = traces(client, sid, "correctness")["grad_max_abs_diff"]
    assert bars["x"] == ["segments=2", "segments=4", "segments=8"]
    assert bars["y"] == [0.0, None, None]
    assert bars["text"] == ["match", "not verified", "not verified"]
    results = {r["experiment_id"]: r for r in client.get(f"/api/sweeps/{sid}/results").json()["data"]}
    assert results[by[2]]["metrics"]["overhead_pct"] == pytest.approx(20.0)
    assert results[by[2]]["metrics"]["activation_saving_pct"] == pytest.approx(35.0)
    assert results[by[8]]["metrics"]["overhead_pct"] is None


def test_charts_of_an_unfinished_sweep_are_empty_not_errors(client):
    body = {"name": "x", "base": spec_dict(), "axes": {"amp": ["off", "bf16"]}}
    sid = client.post("/api/sweeps", json=body).json()["id"]
    for name in ("memory_vs_segments", "time_vs_segments", "pareto", "correctness"):
        r = client.get(f"/api/sweeps/{sid}/charts/{name}")
        assert r.status_code == 200
        assert all(not t.get("x") for t in r.json()["data"])


def test_unknown_chart_and_sweep(client):
    sid = client.post("/api/sweeps", json={"name": "x", "base": spec_dict(), "axes": {"amp": ["off"]}}).json()["id"]
    r = client.get(f"/api/sweeps/{sid}/charts/heatmap")
    assert r.status_code == 422
    msg = r.json()["detail"][0]["msg"]
    assert all(n in msg for n in ("memory_vs_segments", "time_vs_segments", "pareto", "correctness"))
    assert client.get("/api/sweeps/999/charts/pareto").status_code == 404
