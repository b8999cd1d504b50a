"""The store's edge reads a row that does not read back (issue 33, item 1) on SQLite and
PostgreSQL: stand-ins for what failed, ``corrupt`` saying what and why, one warning naming
the table and row, and nothing written back."""

from __future__ import annotations

import logging

from sqlalchemy import text

from ckptlab.db import store
from ckptlab.db.models import Experiment, Sweep
from ckptlab.spec.sweeps import plan_sweep
from tests.factories import CORRUPT_VALUES, corrupt, make_spec, spec_dict

#: What each corrupt column reads as on the row.
STAND_INS = {"summary": None, "spec": {}, "warnings": None, "created_at": None, "attempt": 0}


def test_each_corrupt_column_reads_as_its_stand_in_and_says_why(any_session, caplog):
    dialect = any_session.get_bind().dialect.name
    columns = [c for c in CORRUPT_VALUES[dialect] if c in STAND_INS]
    ids = {c: store.create_experiment(any_session, spec=make_spec()).id for c in columns}
    for column, exp_id in ids.items():
        corrupt(any_session, "experiments", exp_id, column)
    any_session.expunge_all()
    with caplog.at_level(logging.WARNING, logger="ckptlab.db.corrupt"):
        rows = {r.id: r for r in store.list_experiments(any_session)[0]}
    for column, exp_id in ids.items():
        row = rows[exp_id]
        assert row.corrupt.fields == [column] and row.corrupt.reason.startswith(f"{column}: ")
        if column == "summary" and dialect == "postgresql":  # valid JSON, a bad key: served as stored
            assert row.summary == {"peak_allocated_bytes": "x"} and row.run_summary.peak_allocated_bytes is None
        else:
            assert getattr(row, column) == STAND_INS[column], column
        assert f"experiments row {exp_id} is corrupt: {column}: " in caplog.text
    assert store.create_experiment(any_session, spec=make_spec()).corrupt is None


def test_stand_ins_are_never_written_back_and_survive_a_deferred_load(any_session):
    exp_id = store.create_experiment(any_session, spec=make_spec()).id
    stored = corrupt(any_session, "experiments", exp_id, "spec")
    any_session.expunge_all()
    row = any_session.get(Experiment, exp_id)
    assert row.log is None  # loading the deferred column refreshes the row: the finding stays
    assert row.corrupt.fields == ["spec"]
    row.cancel_requested = True
    any_session.commit()
    raw = text("SELECT CAST(spec AS TEXT), cancel_requested FROM experiments WHERE id = :i")
    assert tuple(any_session.execute(raw, {"i": exp_id}).one()) == (stored, True)


def test_a_corrupt_sweep_and_a_clean_one(any_session):
    plan = plan_sweep(spec_dict(), {"amp": ["off"]})
    sweeps = [store.create_sweep(any_session, name="s", base={}, axes={"amp": ["off"]}, plan=plan).id for _ in range(2)]
    corrupt(any_session, "sweeps", sweeps[0], "axes")
    any_session.expunge_all()
    bad, good = (any_session.get(Sweep, i) for i in sweeps)
    assert bad.corrupt.fields == ["axes"] and bad.axes == {} and bad.name == "s"
    assert good.corrupt is None and good.axes == {"amp": ["off"]}
