"""``ckptlab run``'s progress bar (worker/progress_bar.py): how far along its fixed total, the
pass's step and an estimate, read from the steps the run has stored (issues 23, 32)."""

from __future__ import annotations

import io

from rich.console import Console

from ckptlab.analysis.progress import PASS_STEP_MS, STEPS_PLANNED
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
            add_steps(db_session, exp, [1, 2, 3], extra={"pass": "memory", STEPS_PLANNED: 25})
            add_steps(db_session, exp, [4], extra={"pass": "timed", STEPS_PLANNED: 23, PASS_STEP_MS: 1000.0})
            shown = bar.poll()
            bar.progress.refresh()
        # The memory pass stopped at 3 of 5: its 2 skipped steps count as done, N stays 25.
        assert (shown.step, shown.done_steps, shown.total_steps) == (4, 6, 25)
        assert shown.eta_s == 19.0
        assert "6/25" in out.getvalue() and "timed step 1 of 20, about 19 s left" in out.getvalue()
    finally:
        engine.dispose()
