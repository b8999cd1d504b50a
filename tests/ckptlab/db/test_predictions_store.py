"""The ``predictions`` table and its store functions on SQLite and PostgreSQL: create, get,
list with filters and paging, the status CHECK constraint, the store's typed edge, and the
migration up and down."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from ckptlab.db import store
from ckptlab.db.database import make_engine
from ckptlab.db.models import Prediction
from ckptlab.domain import Status
from ckptlab.summary import PredictionInfo, RunSummary
from tests.factories import make_spec
from tests.support import alembic_to

SUMMARY = RunSummary(
    device="cuda",
    peak_allocated_bytes=3 * 2**30,
    reserved_bytes=4 * 2**30,
    prediction=PredictionInfo(target="h100-80gb", method="fake tensors", error_bound="unverified", fits=True),
)


def _store(session, *, target="cpu", status=Status.SUCCEEDED, **kw):
    summary = SUMMARY if status == Status.SUCCEEDED else None
    error = None if status == Status.SUCCEEDED else "no fake kernel for aten::frobnicate"
    kw.setdefault("spec", make_spec())
    return store.create_prediction(session, target=target, status=status, summary=summary, error=error, **kw)


def test_a_prediction_is_stored_whole_and_read_back_typed(any_session):
    spec = make_spec(**{"model.depth": 4, "checkpoint.strategy": "per_block"})
    started = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    row = _store(any_session, spec=spec, target="h100-80gb", capacity_bytes=2**50, created_at=started, elapsed_s=1.25)
    any_session.expire_all()
    got = store.get_prediction(any_session, prediction_id=row.id)
    assert (got.target, got.status, got.capacity_bytes, got.elapsed_s) == ("h100-80gb", "succeeded", 2**50, 1.25)
    assert (got.model_kind, got.strategy) == ("mlp", "per_block")
    assert got.created_at == started and got.finished_at >= started and got.error is None
    assert got.experiment_spec == spec
    assert got.run_summary == SUMMARY and got.run_summary.prediction.fits is True
    assert got.summary == SUMMARY.dump()
    assert store.get_prediction(any_session, prediction_id=row.id + 1) is None


def test_a_failed_prediction_keeps_its_error_and_no_summary(any_session):
    row = _store(any_session, status=Status.FAILED)
    assert (row.status, row.summary, row.error) == ("failed", None, "no fake kernel for aten::frobnicate")
    assert row.run_summary == RunSummary()  # the edge never raises
    timed = _store(any_session, status=Status.TIMED_OUT)
    assert timed.status == "timed_out"


def test_the_typed_edge_never_raises_on_a_corrupt_row(any_session):
    row = _store(any_session)
    row.spec = {"model": {"kind": "no-such-kind"}}
    row.summary = {"peak_allocated_bytes": "lots", "device": "cuda"}
    any_session.commit()
    assert row.experiment_spec is None
    assert row.run_summary.peak_allocated_bytes is None and row.run_summary.device == "cuda"


@pytest.mark.parametrize("status", [Status.QUEUED, Status.RUNNING, Status.OOM, Status.CANCELLED, "bogus"])
def test_only_a_prediction_status_is_stored(any_session, status):
    with pytest.raises(ValueError, match="a prediction is succeeded, failed, timed_out"):
        _store(any_session, status=status)


def test_the_check_constraint_holds_the_status_to_a_predictions(any_session):
    row = _store(any_session)
    with pytest.raises(IntegrityError):
        any_session.execute(text("UPDATE predictions SET status = 'queued' WHERE id = :id"), {"id": row.id})
        any_session.flush()
    any_session.rollback()
    assert store.get_prediction(any_session, prediction_id=row.id).status == "succeeded"


def test_a_batch_is_stored_in_one_transaction(any_session):
    rows = [_store(any_session, target=t, commit=False) for t in ("cpu", "l4-24gb")]
    any_session.rollback()  # nothing committed yet: nothing stored
    assert store.list_predictions(any_session) == ([], 0)
    rows = [_store(any_session, target=t, commit=False) for t in ("cpu", "l4-24gb")]
    any_session.commit()
    assert (
        [r.target for r in store.list_predictions(any_session)[0]]
        == ["l4-24gb", "cpu"]
        == [r.target for r in reversed(rows)]
    )


def test_listing_filters_pages_and_counts(any_session):
    base = datetime(2026, 1, 1, tzinfo=UTC)
    for i, (target, status, kind) in enumerate(
        [
            ("cpu", Status.SUCCEEDED, "mlp"),
            ("cpu", Status.FAILED, "mlp"),
            ("h100-80gb", Status.SUCCEEDED, "transformer"),
            ("h100-80gb", Status.TIMED_OUT, "mlp"),
            ("h100-80gb", Status.SUCCEEDED, "mlp"),
        ]
    ):
        spec = make_spec() if kind == "mlp" else make_spec(model={"kind": "transformer", "depth": 2})
        _store(any_session, spec=spec, target=target, status=status, created_at=base + timedelta(seconds=i))
    rows, count = store.list_predictions(any_session)
    assert count == 5 and [r.id for r in rows] == [5, 4, 3, 2, 1]
    rows, count = store.list_predictions(any_session, offset=1, limit=2)
    assert count == 5 and [r.id for r in rows] == [4, 3]
    rows, count = store.list_predictions(any_session, target="h100-80gb", status=Status.SUCCEEDED)
    assert count == 2 and [r.id for r in rows] == [5, 3]
    rows, count = store.list_predictions(any_session, model_kind="transformer")
    assert count == 1 and rows[0].target == "h100-80gb"
    rows, count = store.list_predictions(any_session, target="cpu", limit=None)
    assert count == 2 and [r.status for r in rows] == ["failed", "succeeded"]
    assert store.list_predictions(any_session, target="a100-40gb") == ([], 0)


def test_the_migration_goes_down_and_up_again(any_database_url):
    engine = make_engine(any_database_url)
    try:
        alembic_to(engine, "0007", down=True)
        assert "predictions" not in inspect(engine).get_table_names()
        alembic_to(engine, "head", down=False)
        tables = inspect(engine)
        assert "predictions" in tables.get_table_names()
        assert {i["name"] for i in tables.get_indexes("predictions")} == {
            "ix_predictions_target",
            "ix_predictions_status",
        }
        assert Prediction.__tablename__ == "predictions"
    finally:
        engine.dispose()
