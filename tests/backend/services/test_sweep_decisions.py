"""Sweeps decide on real differences only: an overhead inside the noise is "no measurable
difference", and a peak that checkpointing cannot move makes the recommendation say so."""

from __future__ import annotations

import random

import pytest

from ckptlab.db import queue
from ckptlab.domain import Status
from ckptlab.summary import RunSummary
from tests.factories import spec_dict
from tests.support import wait_for


def _finish(session, experiment_id: int, step_times: list[float], **summary) -> None:
    queue.claim_next(session, worker_id="test:1")
    queue.finish_experiment(
        session,
        experiment_id=experiment_id,
        status=Status.SUCCEEDED,
        summary=RunSummary.model_validate(
            {"step_times_ms": step_times, "step_time_ms": sorted(step_times)[len(step_times) // 2], **summary}
        ),
    )


def test_segments_1_against_none_is_no_measurable_difference_never_a_signed_overhead(client, db_session):
    base = spec_dict(**{"checkpoint.strategy": "sequential"})
    body = {"name": "s1", "base": base, "axes": {"checkpoint.segments": [1]}}
    sweep = client.post("/api/sweeps", json=body).json()
    rng = random.Random(0)
    same = {"activation_bytes": 1000, "peak_allocated_bytes": 50_000}
    for e in sorted(sweep["experiments"], key=lambda e: e["id"]):  # same distribution, +-20% noise
        _finish(db_session, e["id"], [10.0 * (1 + rng.uniform(-0.2, 0.2)) for _ in range(20)], **same)
    rows = client.get(f"/api/sweeps/{sweep['id']}/results").json()["data"]
    run = next(r for r in rows if r["role"] == "run")
    assert run["overhead_text"].startswith("no measurable difference (95% CI ")
    assert run["overhead"]["measurable"] is False and run["overhead"]["low_pct"] < 0 < run["overhead"]["high_pct"]
    csv = client.get(f"/api/sweeps/{sweep['id']}/results?format=csv").text
    assert "no measurable difference" in csv


@pytest.mark.slow
def test_a_sweep_whose_peak_is_adams_step_does_not_pick_segments_1_and_says_why(client, worker_process):
    base = spec_dict(
        **{"checkpoint.strategy": "sequential", "model.depth": 8, "model.width": 256, "batch_size": 16},
        timed_steps=10,
    )
    body = {"name": "adam peak", "base": base, "axes": {"checkpoint.segments": [1, 2, 4]}}
    sid = client.post("/api/sweeps", json=body).json()["id"]

    def finished():
        s = client.get(f"/api/sweeps/{sid}").json()
        return s if s["progress"]["finished"] == s["progress"]["total"] else None

    sweep = wait_for(finished, timeout=180, interval=0.5)
    assert sweep["progress"]["counts"]["succeeded"] == 5, [(e["label"], e["error"]) for e in sweep["experiments"]]
    rows = {r["label"]: r for r in client.get(f"/api/sweeps/{sid}/results").json()["data"]}
    assert rows["segments=4"]["metrics"]["activation_saving_pct"] > 0  # activations fall ...
    assert all(r["peak_phase"] == "optimizer" for r in rows.values())  # ... the peak does not
    assert "sequential_equals_none" in rows["segments=1"]["findings"]
    rec = client.get(f"/api/sweeps/{sid}/recommendation").json()
    assert rec["label"] != "segments=1" and rec["reason"].startswith("nothing beats the baseline")
    assert "optimizer.step" in rec["reason"]
    # The baseline ran first and again last; its second run is not a candidate, it shows drift.
    again = rows["base (again)"]
    assert again["repeat_of"] == rows["base"]["experiment_id"] and again["overhead_text"].startswith("drift since")
    assert again["experiment_id"] in [x["experiment_id"] for x in rec["excluded"]]
