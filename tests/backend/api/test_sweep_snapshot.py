"""A sweep read while its last run finishes: its progress counts what its experiments show.

``GET /api/sweeps/{id}`` loads the sweep's experiments and then derives the progress. Once the
progress was a second count query: on SQLite (a read outside a transaction) and PostgreSQL
(read committed) each statement sees the latest commit, so a run that finished between the
two reads was counted ``succeeded`` while it was listed ``running`` without its summary. A
client waiting for "finished == total" then read that summary as None (seen once in
``test_worker_runs_a_2x2x2_sweep_and_its_charts_hold_the_expected_traces``).
"""

from __future__ import annotations

from collections import Counter

from ckptlab.db import queue, store
from ckptlab.summary import RunSummary
from tests.backend.conftest import finish_next, parse_sse
from tests.factories import spec_dict

SUMMARY = {"peak_allocated_bytes": 2000, "activation_bytes": 1000, "step_times_ms": [3.0, 3.5]}


def test_a_sweep_read_while_its_last_run_finishes_counts_what_it_lists(client, db_session, monkeypatch):
    body = {"name": "race", "base": spec_dict(**{"checkpoint.strategy": "sequential"}), "axes": {"amp": ["off"]}}
    sweep = client.post("/api/sweeps", json=body).json()
    ids = [e["id"] for e in sweep["experiments"]]  # the baseline, the run, the baseline again
    assert len(ids) == 3
    for exp_id in ids[:-1]:
        finish_next(db_session, exp_id, SUMMARY)
    last = queue.claim_next(db_session, worker_id="test:1")
    assert last is not None and last.id == ids[-1]
    get_sweep = store.get_sweep

    def loaded_then_the_last_run_finishes(session, *, sweep_id):
        # The racing order, made certain: the worker commits the repeated baseline's outcome
        # right after the request loaded the sweep's experiments.
        loaded = get_sweep(session, sweep_id=sweep_id)
        summary = RunSummary.model_validate(SUMMARY)
        assert queue.finish_experiment(db_session, experiment_id=last.id, status="succeeded", summary=summary)
        return loaded

    monkeypatch.setattr(store, "get_sweep", loaded_then_the_last_run_finishes)
    read = client.get(f"/api/sweeps/{sweep['id']}").json()
    monkeypatch.undo()
    listed = Counter(e["status"] for e in read["experiments"])
    assert {s: n for s, n in read["progress"]["counts"].items() if n} == dict(listed)
    assert read["progress"]["finished"] == listed["succeeded"] == 2 and read["progress"]["eta_text"]
    # Read again: every run finished, and each one listed with its summary.
    again = client.get(f"/api/sweeps/{sweep['id']}").json()
    assert again["progress"]["finished"] == again["progress"]["total"] == 3
    assert all(e["status"] == "succeeded" and e["summary"] is not None for e in again["experiments"])


def test_a_sweep_stream_counts_the_statuses_it_sends(client, db_session, monkeypatch):
    """The live stream's ``progress`` counts the statuses of the same poll: a run finishing
    after they were read (here: while its steps are read) is counted with its status event,
    never before it (a client that stops on "finished == total" had the last status still
    to come)."""
    from ckptlab.backend.services import streams

    body = {"name": "race", "base": spec_dict(**{"checkpoint.strategy": "sequential"}), "axes": {"amp": ["off"]}}
    sweep = client.post("/api/sweeps", json=body).json()
    ids = [e["id"] for e in sweep["experiments"]]
    for exp_id in ids[:-1]:
        finish_next(db_session, exp_id, SUMMARY)
    last = queue.claim_next(db_session, worker_id="test:1")
    assert last is not None and last.id == ids[-1]
    steps_after, finished = streams.steps_after, []

    def the_last_run_finishes_meanwhile(session, **kw):
        if not finished:  # once, between the poll's statuses and its progress
            summary = RunSummary.model_validate(SUMMARY)
            finished.append(
                queue.finish_experiment(db_session, experiment_id=last.id, status="succeeded", summary=summary)
            )
        return steps_after(session, **kw)

    monkeypatch.setattr(streams, "steps_after", the_last_run_finishes_meanwhile)
    events = parse_sse(client.get(f"/api/sweeps/{sweep['id']}/events").text)
    assert finished == [True] and events[-1].event == "end"
    status: dict[int, str] = {}
    for event in events:
        if event.event == "status":
            status[event.data["experiment_id"]] = event.data["status"]
        elif event.event == "progress":
            sent = Counter(status.values())
            assert event.data["finished"] == sent["succeeded"], (event.data, status)
    assert [e.data["finished"] for e in events if e.event == "progress"][-1] == 3
