"""``ckptlab run``'s progress bar (worker/progress_bar.py): step k of N and an estimate, read
from the steps the run has stored (issue 23)."""

from __future__ import annotations

import io

from rich.console import Console

from ckptlab.analysis.progress import STEPS_PLANNED
from ckptlab.db import store
from ckptlab.db.database import make_engine, make_sessionmaker
from ckptlab.worker.progress_bar import RunProgressBar
from tests.backend.conftest import add_steps
from tests.factories import make_spec


def test_the_bar_shows_the_stored_steps_of_the_planned_total_and_what_is_left(database_url, db_session) -> None:
    exp = store.create_experiment(db_session, spec=make_spec(steps=5, timed_steps=20), status="running", worker_id="t")
    engine = make_engine(database_url)
    out = io.StringIO()
    bar = RunProgressBar(
        make_sessionmaker(engine), exp.id, exp.attempt, exp.spec, Console(file=out, force_terminal=True, width=150)
    )
    try:
        with bar:
            assert bar.poll().step is None  # nothing stored yet: the model is being built
            add_steps(db_session, exp, [1, 2, 3], extra={STEPS_PLANNED: 25})
            add_steps(db_session, exp, [4], extra={STEPS_PLANNED: 23})
            shown = bar.poll()
            bar.progress.refresh()
        assert (shown.step, shown.total_steps) == (4, 23)
        assert shown.eta_s is not None and shown.eta_s > 0
        assert "4/23" in out.getvalue() and "left" in out.getvalue()
    finally:
        engine.dispose()
