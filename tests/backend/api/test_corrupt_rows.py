"""One stored row that does not read back (issue 33, item 1) is served marked ``corrupt``,
and the listing, the detail, the exports and every route of that experiment or sweep keep
answering for it and for everything else, on SQLite and PostgreSQL. An unexpected error is
a 500 that leaves the keep-alive connection usable."""

from __future__ import annotations

import csv
import http.client
import io
import json
import logging
from urllib.parse import urlsplit

from fastapi.testclient import TestClient

from ckptlab.db import queue, store
from ckptlab.db.database import make_engine, make_sessionmaker
from ckptlab.settings import Settings
from ckptlab.summary import RunSummary
from tests.factories import CORRUPT_VALUES, corrupt, make_spec, spec_dict

#: The routes of one experiment (its live stream is read once it has finished).
EXPERIMENT_ROUTES = (
    "",
    "/steps",
    "/steps?format=csv",
    "/attempts",
    "/events/history",
    "/comparison",
    "/series",
    "/log",
    "/events",
)
SWEEP_ROUTES = ("", "/results", "/results?format=csv", "/charts/pareto", "/recommendation", "/events")


def _finished(session, **spec) -> int:
    """A stored experiment that has ``succeeded`` with a small summary."""
    exp = store.create_experiment(session, spec=make_spec(**spec), status="running", worker_id="t:1")
    queue.finish_experiment(
        session, experiment_id=exp.id, status="succeeded", summary=RunSummary(activation_bytes=7), warnings=["w"]
    )
    return exp.id


def _client(url: str, data_dir) -> TestClient:
    from ckptlab.backend.app import create_app

    return TestClient(create_app(Settings(data_dir=data_dir, database_url=url)))


def test_a_corrupt_experiment_is_served_marked_and_nothing_else_fails(any_database_url, data_dir, caplog):
    engine = make_engine(any_database_url)
    with make_sessionmaker(engine)() as session, _client(any_database_url, data_dir) as client:
        dialect = session.get_bind().dialect.name
        columns = [c for c in CORRUPT_VALUES[dialect] if c not in ("axes", "base")]
        clean = _finished(session)
        broken = {column: _finished(session) for column in columns}
        running = store.create_experiment(session, spec=make_spec(), status="running", worker_id="t:1").id
        for column, exp_id in broken.items():
            corrupt(session, "experiments", exp_id, column)
        corrupt(session, "experiments", running, "spec", '{"steps": "x"}')  # valid JSON, not a spec
        broken["spec "] = running

        with caplog.at_level(logging.WARNING, logger="ckptlab.db.corrupt"):
            listing = client.get("/api/experiments", params={"limit": 1000})
        assert listing.status_code == 200, listing.text
        by_id = {e["id"]: e for e in listing.json()["data"]}
        assert by_id[clean]["corrupt"] is None and by_id[clean]["summary"] == {"activation_bytes": 7}
        for column, exp_id in broken.items():
            assert by_id[exp_id]["corrupt"]["fields"] == [column.strip()], (column, by_id[exp_id])
            assert by_id[exp_id]["corrupt"]["reason"].startswith(f"{column.strip()}: ")
            assert f"experiments row {exp_id} is corrupt" in caplog.text
        brief = client.get("/api/experiments", params={"limit": 1000, "per_step": "false"})
        assert brief.status_code == 200, brief.text
        assert [e["corrupt"] for e in brief.json()["data"]] == [e["corrupt"] for e in listing.json()["data"]]

        exported = client.get("/api/experiments/export")
        assert exported.status_code == 200 and exported.json()["count"] == len(broken) + 1
        rows = list(csv.DictReader(io.StringIO(client.get("/api/experiments/export?format=csv").text)))
        marks = {int(r["id"]): r["corrupt"] for r in rows}
        assert marks[clean] == "" and all(marks[i].startswith(f"{c.strip()}: ") for c, i in broken.items())

        for exp_id in [clean, *broken.values()]:
            for route in EXPERIMENT_ROUTES:
                if route == "/events" and exp_id == running:
                    continue  # a running experiment's stream stays open
                r = client.get(f"/api/experiments/{exp_id}{route}")
                assert r.status_code == 200, (exp_id, route, r.status_code, r.text[:300])
        assert client.get(f"/api/experiments/{running}").json()["progress"]["total_steps"] > 0  # the defaults
    engine.dispose()


def test_a_corrupt_sweep_is_served_marked_and_nothing_else_fails(any_database_url, data_dir):
    engine = make_engine(any_database_url)
    with make_sessionmaker(engine)() as session, _client(any_database_url, data_dir) as client:
        body = {"name": "s", "base": spec_dict(**{"checkpoint.strategy": "sequential"}), "axes": {"amp": ["off"]}}
        clean, bad_axes, bad_base = (client.post("/api/sweeps", json=body).json()["id"] for _ in range(3))
        corrupt(session, "sweeps", bad_axes, "axes")
        corrupt(session, "sweeps", bad_base, "base")
        assert client.post(f"/api/sweeps/{bad_axes}/cancel").status_code == 200  # its stream ends

        listing = client.get("/api/sweeps")
        assert listing.status_code == 200, listing.text
        marks = {s["id"]: s["corrupt"] for s in listing.json()["data"]}
        assert marks[clean] is None
        assert marks[bad_axes]["fields"] == ["axes"] and marks[bad_base]["fields"] == ["base"]
        for sweep_id in (clean, bad_axes, bad_base):
            for route in SWEEP_ROUTES if sweep_id == bad_axes else SWEEP_ROUTES[:-1]:
                r = client.get(f"/api/sweeps/{sweep_id}{route}")
                assert r.status_code == 200, (sweep_id, route, r.status_code, r.text[:300])
        assert client.get(f"/api/sweeps/{bad_axes}").json()["axes"] == {}
    engine.dispose()


def test_an_error_leaves_the_keep_alive_connection_usable(live_server, monkeypatch):
    def broken(*_args, **_kwargs):
        raise RuntimeError("a bug in a route")

    monkeypatch.setattr("ckptlab.backend.services.queries.query_experiments", broken)
    parts = urlsplit(live_server)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request("GET", "/api/experiments")
        first = conn.getresponse()
        body = json.loads(first.read())
        assert first.status == 500 and body == {"detail": "internal server error; the server logged it"}
        conn.request("GET", "/api/health")  # the same connection: it was reset after the 500
        second = conn.getresponse()
        assert second.status == 200 and json.loads(second.read())["status"] == "ok"
    finally:
        conn.close()
