"""Live streams (SSE): steps and status changes in order, an end event, resumption with
Last-Event-ID, and the latency from a step's commit to the client."""

from __future__ import annotations

import statistics
import threading
import time

import httpx
import pytest

from ckptlab.db import queue
from ckptlab.summary import RunSummary
from tests.backend.conftest import add_steps, parse_sse, running_experiment


def finished_experiment(session, n_steps: int = 5):
    exp = running_experiment(session)
    add_steps(session, exp, range(1, n_steps + 1))
    queue.finish_experiment(
        session, experiment_id=exp.id, status="succeeded", summary=RunSummary.model_validate({"activation_bytes": 1})
    )
    return exp


def test_stream_of_finished_experiment_sends_steps_status_and_end(client, db_session):
    exp = finished_experiment(db_session)
    r = client.get(f"/api/experiments/{exp.id}/events")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(r.text)
    kinds = [e.event for e in events]
    assert kinds == ["step"] * 5 + ["status", "end"]
    assert [e.data["step"] for e in events[:5]] == [1, 2, 3, 4, 5]
    assert events[0].data["experiment_id"] == exp.id and events[0].data["attempt"] == 1
    assert events[5].data == {"experiment_id": exp.id, "status": "succeeded", "attempt": 1, "error": None}
    cursors = [int(e.id.split(":")[0]) for e in events]
    assert cursors[:5] == sorted(set(cursors[:5])), "step ids must increase"
    assert cursors[5:] == [cursors[4]] * 2


def test_resume_with_last_event_id_sends_only_what_was_missed(client, db_session):
    exp = finished_experiment(db_session, n_steps=6)
    events = parse_sse(client.get(f"/api/experiments/{exp.id}/events").text)
    third = events[2]
    resumed = parse_sse(client.get(f"/api/experiments/{exp.id}/events", headers={"Last-Event-ID": third.id}).text)
    # The client saw no status yet (the digest in the id predates it): status is re-sent.
    assert [e.event for e in resumed] == ["step", "step", "step", "status", "end"]
    assert [e.data["step"] for e in resumed[:3]] == [4, 5, 6]
    # Resuming from the status event: nothing new but the end.
    last_status = next(e for e in events if e.event == "status")
    again = parse_sse(client.get(f"/api/experiments/{exp.id}/events", headers={"Last-Event-ID": last_status.id}).text)
    assert [e.event for e in again] == ["end"]


def test_resume_with_the_last_event_id_query_parameter(client, db_session):
    """A new EventSource cannot set headers: the browser resumes with ?last_event_id=."""
    from urllib.parse import quote

    exp = finished_experiment(db_session, n_steps=6)
    events = parse_sse(client.get(f"/api/experiments/{exp.id}/events").text)
    url = f"/api/experiments/{exp.id}/events?last_event_id={quote(events[3].id)}"
    resumed = parse_sse(client.get(url).text)
    assert [e.data["step"] for e in resumed if e.event == "step"] == [5, 6]
    # The header, when a browser sends one, wins over the query.
    both = parse_sse(client.get(url, headers={"Last-Event-ID": events[4].id}).text)
    assert [e.data["step"] for e in both if e.event == "step"] == [6]
    assert client.get(f"/api/experiments/{exp.id}/events?last_event_id=x").status_code == 422


def test_statuses_only_and_bad_requests(client, db_session):
    exp = finished_experiment(db_session)
    events = parse_sse(client.get(f"/api/experiments/{exp.id}/events?steps=false").text)
    assert [e.event for e in events] == ["status", "end"]
    assert client.get("/api/experiments/999/events").status_code == 404
    assert client.get("/api/sweeps/999/events").status_code == 404
    for bad in ("abc", "1:xyz", "99999999999999999999:00"):
        r = client.get(f"/api/experiments/{exp.id}/events", headers={"Last-Event-ID": bad})
        assert r.status_code == 422, bad
        assert r.json()["detail"][0]["loc"] == ["header", "last-event-id"]


def test_sweep_stream_reports_each_experiment_and_progress(client, db_session):
    from tests.factories import spec_dict

    body = {
        "name": "stream",
        "base": spec_dict(**{"checkpoint.strategy": "sequential"}),
        "axes": {"checkpoint.segments": [2, 4]},
    }
    sweep = client.post("/api/sweeps", json=body).json()
    ids = [e["id"] for e in sweep["experiments"]]
    assert len(ids) == 4  # one baseline, two runs, the baseline again
    for _ in ids:  # run each "by hand": claim, one step, finish
        exp = queue.claim_next(db_session, worker_id="test:1")
        add_steps(db_session, exp, [1])
        queue.finish_experiment(db_session, experiment_id=exp.id, status="succeeded", summary=RunSummary())
    events = parse_sse(client.get(f"/api/sweeps/{sweep['id']}/events").text)
    steps = [e for e in events if e.event == "step"]
    assert sorted(e.data["experiment_id"] for e in steps) == sorted(ids)
    statuses = {e.data["experiment_id"]: e.data["status"] for e in events if e.event == "status"}
    assert statuses == dict.fromkeys(ids, "succeeded")
    progress = [e for e in events if e.event == "progress"]
    assert progress[-1].data["finished"] == progress[-1].data["total"] == 4
    assert events[-1].event == "end"


class _StreamReader(threading.Thread):
    """Reads an SSE stream in a thread, for a test to wait on: ``connected`` is set by the
    first event (the status the server sends as soon as a stream is open), ``arrived[n]``
    once step ``n`` came (``received[n]``: when, ``time.monotonic()``), ``ended`` by the end
    event."""

    def __init__(self, url: str, steps: range):
        super().__init__(daemon=True)
        self.url = url
        self.connected, self.ended = threading.Event(), threading.Event()
        self.arrived = {n: threading.Event() for n in steps}
        self.received: dict[int, float] = {}

    def run(self) -> None:
        with httpx.Client(timeout=30) as http, http.stream("GET", self.url) as r:
            assert r.status_code == 200
            buf = ""
            for chunk in r.iter_text():
                buf = (buf + chunk).replace("\r\n", "\n")
                while "\n\n" in buf:
                    block, buf = buf.split("\n\n", 1)
                    for ev in parse_sse(block + "\n\n"):
                        self.connected.set()
                        if ev.event == "step":
                            self.received[ev.data["step"]] = time.monotonic()
                            self.arrived[ev.data["step"]].set()
                        if ev.event == "end":
                            self.ended.set()
                            return


def test_live_steps_reach_the_client_within_a_second(live_server, db_session):
    exp = running_experiment(db_session)
    steps = range(1, 21)
    reader = _StreamReader(f"{live_server}/api/experiments/{exp.id}/events", steps)
    reader.start()
    assert reader.connected.wait(10), "the stream sent no first event"
    committed = {}
    # One step at a time, each committed as soon as the one before arrived (just after a
    # poll): every latency is near the worst case, a whole poll interval.
    for step in steps:
        add_steps(db_session, exp, [step])
        committed[step] = time.monotonic()
        assert reader.arrived[step].wait(5), f"step {step} did not arrive"
    queue.finish_experiment(db_session, experiment_id=exp.id, status="succeeded", summary=RunSummary())
    assert reader.ended.wait(10), "no end event after the experiment finished"
    reader.join(5)
    assert sorted(reader.received) == list(steps)
    latencies = sorted(reader.received[s] - committed[s] for s in committed)
    p95 = latencies[int(0.95 * (len(latencies) - 1))]
    assert p95 < 1.0, f"p95 {p95:.3f} s, median {statistics.median(latencies):.3f} s"


@pytest.mark.parametrize("path", ["/api/experiments/{id}/events", "/api/sweeps/{id}/events"])
def test_stream_ids_out_of_range_are_rejected(client, path):
    r = client.get(path.format(id=2**64))
    assert r.status_code == 422


def test_non_finite_step_values_are_sent_as_null(client, db_session):
    exp = running_experiment(db_session)
    add_steps(db_session, exp, [1], forward_ms=float("inf"))
    queue.finish_experiment(db_session, experiment_id=exp.id, status="succeeded", summary=RunSummary())
    step = parse_sse(client.get(f"/api/experiments/{exp.id}/events").text)[0]
    assert step.event == "step" and step.data["forward_ms"] is None and step.data["backward_ms"] == 2.0


def test_a_long_backlog_is_sent_in_order_before_the_final_status(client, db_session):
    exp = finished_experiment(db_session, n_steps=2500)  # more than one read batch (1000)
    events = parse_sse(client.get(f"/api/experiments/{exp.id}/events").text)
    assert [e.data["step"] for e in events if e.event == "step"] == list(range(1, 2501))
    assert [e.event for e in events[-2:]] == ["status", "end"]


def test_steps_of_several_attempts_are_read_in_one_statement(db_session):
    """One statement, one snapshot: with a statement per experiment, a step committed in
    between could get an id below the cursor and be skipped by the stream for good."""
    from sqlalchemy import event

    from ckptlab.backend.services.queries import steps_after

    a, b = running_experiment(db_session), running_experiment(db_session)
    add_steps(db_session, a, range(1, 4))
    add_steps(db_session, b, range(1, 3))
    statements: list[str] = []
    engine = db_session.get_bind()
    listen = lambda *args: statements.append(args[2])  # noqa: E731 - (conn, cursor, statement, ...)
    event.listen(engine, "before_cursor_execute", listen)
    try:
        rows = steps_after(db_session, attempts=[(a.id, 1), (b.id, 1)], after_id=0)
    finally:
        event.remove(engine, "before_cursor_execute", listen)
    assert len(statements) == 1
    assert [r.id for r in rows] == sorted(r.id for r in rows) and len(rows) == 5
