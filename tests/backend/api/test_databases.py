"""The read paths that use dialect-sensitive SQL (NULLS LAST, CASE ordering, the raw DBAPI
cursor of the series and its rollup, row-id cursors of the streams) behave the same on
SQLite and PostgreSQL."""

from __future__ import annotations

from fastapi.testclient import TestClient

from ckptlab.db import queue, store
from ckptlab.db.database import make_engine, make_sessionmaker
from ckptlab.settings import Settings
from ckptlab.summary import RunSummary
from tests.backend.conftest import parse_sse, step_record
from tests.factories import make_spec, spec_dict


def test_queries_series_and_streams_on_both_databases(any_database_url, data_dir):
    from ckptlab.backend.app import create_app

    engine = make_engine(any_database_url)
    with (
        make_sessionmaker(engine)() as session,
        TestClient(create_app(Settings(data_dir=data_dir, database_url=any_database_url))) as client,
    ):
        queued = store.create_experiment(session, spec=make_spec()).id
        run = store.create_experiment(session, spec=make_spec(), status="running", worker_id="t:1")
        records = [
            step_record(s, step_ms=50.0 if s == 777 else 3.0, loss=None if s % 2 else 0.5) for s in range(1, 3001)
        ]
        store.add_steps(session, experiment_id=run.id, attempt=1, records=records)
        queue.finish_experiment(
            session,
            experiment_id=run.id,
            status="succeeded",
            summary=RunSummary.model_validate({"activation_bytes": 5}),
        )

        started = client.get("/api/experiments", params={"sort": "started_at"}).json()["data"]
        assert [e["id"] for e in started] == [run.id, queued]  # nulls last
        ids = client.get("/api/experiments", params={"ids": f"{run.id},{queued}"}).json()["data"]
        assert [e["id"] for e in ids] == [run.id, queued]

        series = client.get(f"/api/experiments/{run.id}/series", params={"max_points": 100}).json()
        assert series["total"] == 3000 and len(series["x"]) <= 100 and series["max"] == {"step": 777, "value": 50.0}
        loss = client.get(f"/api/experiments/{run.id}/series", params={"metric": "loss"}).json()
        assert loss["total"] == 1500 and loss["skipped"] == 1500
        rolled = client.get(f"/api/experiments/{run.id}/series", params={"max_points": 10}).json()  # from the rollup
        assert rolled["resolution"] == 256 and rolled["total"] == 3000 and rolled["max"] == series["max"]
        zoom = client.get(f"/api/experiments/{run.id}/series", params={"step_min": 770, "step_max": 780}).json()
        assert zoom["x"] == list(range(770, 781)) and zoom["max"] == {"step": 777, "value": 50.0}

        events = parse_sse(client.get(f"/api/experiments/{run.id}/events").text)
        assert [e.data["step"] for e in events if e.event == "step"] == list(range(1, 3001))
        assert events[-1].event == "end"

        body = {"name": "pg", "base": spec_dict(**{"checkpoint.strategy": "sequential"}), "axes": {"amp": ["off"]}}
        sweep = client.post("/api/sweeps", json=body)
        assert sweep.status_code == 201 and sweep.json()["progress"]["total"] == 3  # baseline, run, baseline
        assert client.get(f"/api/sweeps/{sweep.json()['id']}/results?format=csv").status_code == 200
        csv_text = client.get(f"/api/experiments/{run.id}/steps?format=csv").text
        assert len(csv_text.strip().splitlines()) == 3001
    engine.dispose()


def test_ids_are_64_bit_and_an_id_past_32_bits_is_the_same_404_on_both(any_database_url, data_dir):
    from sqlalchemy import insert

    from ckptlab.backend.app import create_app
    from ckptlab.db.models import Experiment, Step

    big = 3_000_000_000
    engine = make_engine(any_database_url)
    with (
        make_sessionmaker(engine)() as session,
        TestClient(create_app(Settings(data_dir=data_dir, database_url=any_database_url))) as client,
    ):
        for path in (f"/api/experiments/{big}", f"/api/experiments/{big}/steps", f"/api/sweeps/{big}"):
            r = client.get(path)
            assert r.status_code == 404, (path, r.status_code, r.text)
        assert client.post(f"/api/experiments/{big}/cancel").status_code == 404
        assert client.get(f"/api/experiments/{2**63}").status_code == 422  # past the API's 64-bit promise
        # attempt is a 32-bit column: past it, the same 422 on both (not a database error).
        r = client.get(f"/api/experiments/{big}/steps", params={"attempt": big})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "attempt"], r.text
        # An id past 32 bits is stored and read back, with its steps (a BIGINT column on PostgreSQL).
        spec = make_spec()
        session.execute(
            insert(Experiment).values(
                id=big, spec=spec.model_dump(mode="json"), model_kind="mlp", strategy="none", status="queued", attempt=1
            )
        )
        session.execute(
            insert(Step).values(
                id=big + 1, experiment_id=big, attempt=1, step=1, forward_ms=1, backward_ms=1, optimizer_ms=1, step_ms=3
            )
        )
        session.commit()
        assert client.get(f"/api/experiments/{big}").json()["id"] == big
        assert [s["step"] for s in client.get(f"/api/experiments/{big}/steps").json()["data"]] == [1]
    engine.dispose()
