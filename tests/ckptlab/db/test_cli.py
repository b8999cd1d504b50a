"""``ckptlab db rebuild-rollups``: steps stored by plain SQL, once rolled up, give the same
series as the same steps written by a worker's step writer, on SQLite and PostgreSQL; an
unknown experiment exits 2 with one line."""

from __future__ import annotations

import math

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import insert
from typer.testing import CliRunner

from ckptlab.cli.main import app
from ckptlab.db import queue, store
from ckptlab.db.database import make_engine, make_sessionmaker
from ckptlab.db.models import Step
from ckptlab.domain import Status
from ckptlab.settings import Settings, get_settings
from ckptlab.summary import RunSummary
from ckptlab.worker.service.writer import StepWriter
from tests.factories import corrupt, make_spec, varied_step_record

N = 6000


@pytest.fixture
def cli(monkeypatch, data_dir, any_database_url):
    """Invoke the ``ckptlab`` command on :func:`any_database_url`."""
    monkeypatch.setenv("CKPTLAB_DATA_DIR", str(data_dir))
    monkeypatch.setenv("CKPTLAB_DATABASE_URL", any_database_url)
    get_settings.cache_clear()
    runner = CliRunner()
    yield lambda *args: runner.invoke(app, list(args))
    get_settings.cache_clear()


def test_steps_stored_by_plain_sql_and_rebuilt_read_as_a_workers(cli, any_database_url, data_dir):
    from ckptlab.backend.app import create_app

    engine = make_engine(any_database_url)
    Session = make_sessionmaker(engine)
    records = [varied_step_record(s) for s in range(1, N + 1)]
    with Session() as s:
        written = store.create_experiment(s, spec=make_spec(), status=Status.RUNNING, worker_id="w:1").id
        with StepWriter(Session, experiment_id=written, attempt=1, batch_rows=700) as writer:
            for rec in records:
                writer.put(rec)
        queue.finish_experiment(s, experiment_id=written, status=Status.SUCCEEDED, summary=RunSummary())
        restored = store.create_experiment(s, spec=make_spec(), status=Status.RUNNING, worker_id="w:2").id
        rows = [
            {**rec, "experiment_id": restored, "attempt": 1, "loss": None if math.isnan(rec["loss"]) else rec["loss"]}
            for rec in records
        ]
        s.execute(insert(Step), [{**r, "loss_nonfinite": "nan" if r["loss"] is None else None} for r in rows])
        s.commit()
        queue.finish_experiment(s, experiment_id=restored, status=Status.SUCCEEDED, summary=RunSummary())
    engine.dispose()

    queries = [
        {"max_points": 10},
        {"metric": "loss", "max_points": 40},
        {"metric": "peak_allocated_bytes", "max_points": 12},
        {"step_min": 1000, "step_max": 5100, "max_points": 12},
        {"step_min": 4300, "step_max": 4400},
    ]
    with TestClient(create_app(Settings(data_dir=data_dir, database_url=any_database_url))) as client:

        def answers(exp_id: int) -> list[dict]:
            out = []
            for q in queries:
                body = client.get(f"/api/experiments/{exp_id}/series", params=q).json()
                out.append({k: v for k, v in body.items() if k != "experiment_id"})
            return out

        worker = answers(written)
        assert [a["resolution"] for a in worker] == [256, 256, 256, 256, 1]
        assert worker[0]["max"] == {"step": 1234, "value": 90.0} and worker[0]["min"] == {"step": 5000, "value": 0.5}
        assert answers(restored)[0]["resolution"] == 1, "no rollup yet: every step is read"

        result = cli("db", "rebuild-rollups", "--experiment", str(restored))
        assert result.exit_code == 0, result.output
        assert f"rolled up {N:,} steps of 1 attempt(s) of 1 experiment(s)" in result.output
        assert answers(restored) == worker


def test_rebuild_shows_progress_on_long_work_and_refuses_an_unknown_experiment(cli, monkeypatch, any_database_url):
    engine = make_engine(any_database_url)
    with make_sessionmaker(engine)() as s:
        exp = store.create_experiment(s, spec=make_spec(), status=Status.RUNNING, worker_id="w:1").id
        store.add_steps(s, experiment_id=exp, attempt=1, records=[varied_step_record(i) for i in range(1, 301)])
    engine.dispose()
    monkeypatch.setattr("ckptlab.db.cli.PROGRESS_FROM_ROWS", 100)
    result = cli("db", "rebuild-rollups")
    assert result.exit_code == 0, result.output
    assert "rolling up steps" in result.output and "300/300" in result.output
    missing = cli("db", "rebuild-rollups", "--experiment", str(exp + 1))
    assert missing.exit_code == 2 and missing.stderr.strip() == f"error: no experiment {exp + 1}"


def test_check_lists_the_rows_that_do_not_read_back_and_exits_1(cli, any_database_url, caplog):
    engine = make_engine(any_database_url)
    Session = make_sessionmaker(engine)
    with Session() as s:
        ids = [store.create_experiment(s, spec=make_spec()).id for _ in range(3)]
    clean = cli("db", "check")
    assert clean.exit_code == 0, clean.output
    assert clean.output.strip() == "no corrupt row: 3 experiment(s) and 0 sweep(s) read back whole"

    with Session() as s:
        corrupt(s, "experiments", ids[0], "summary")
        corrupt(s, "experiments", ids[2], "spec")
    engine.dispose()
    found = cli("db", "check")
    assert found.exit_code == 1, found.output
    lines = found.output.strip().splitlines()
    assert lines[0].startswith(f"experiments {ids[0]}: summary: ") and lines[1].startswith(
        f"experiments {ids[2]}: spec: "
    )
    assert lines[2:] == ["2 corrupt row(s) of 3 experiment(s) and 0 sweep(s)"]
    assert "is corrupt" not in caplog.text  # listed once, not logged besides
